"""Mutation testing of the kernel, the gateway and the strategies: the unit tests kill at least the
floor that docs/testing.md states (the floor only rises)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_examples import REPO

pytestmark = pytest.mark.slow

# two mutants at a time at most: the machines that run the slow suite are shared
MAX_CHILDREN = 2


def floor() -> float:
    match = re.search(r"Mutation score floor: (\d+(?:\.\d+)?)%", (REPO / "docs" / "testing.md").read_text())
    assert match, "docs/testing.md states the mutation score floor"
    return float(match.group(1))


def mutated_files() -> set[str]:
    """The source files that hold at least one mutant after a run."""
    return {
        str(meta.relative_to(REPO / "mutants"))[: -len(".meta")]
        for meta in (REPO / "mutants").rglob("*.py.meta")
        if json.loads(meta.read_text()).get("exit_code_by_key")
    }


@pytest.mark.timeout(3 * 3600)  # about 45 minutes on a quiet 2-core machine; the default 300 s is for single tests
def test_the_unit_tests_kill_at_least_the_floor_of_mutants():
    shutil.rmtree(REPO / "mutants", ignore_errors=True)
    mutmut = Path(sys.executable).with_name("mutmut")
    env = {name: value for name, value in os.environ.items() if not name.startswith("REASONRAY_")}
    run = subprocess.run(
        [str(mutmut), "run", "--max-children", str(MAX_CHILDREN)], cwd=REPO, env=env, capture_output=True, text=True, timeout=3 * 3600
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    subprocess.run([str(mutmut), "export-cicd-stats"], cwd=REPO, env=env, check=True, capture_output=True)
    stats = json.loads((REPO / "mutants" / "mutmut-cicd-stats.json").read_text())
    # the three layers were mutated, the strategies through the reasonray/strategies symlink included
    files = mutated_files()
    for layer in ("reasonray/kernel/", "reasonray/gateway/", "reasonray/strategies/"):
        assert any(path.startswith(layer) for path in files), (layer, sorted(files))
    assert stats["total"] > 3000, stats
    score = 100 * stats["killed"] / stats["total"]
    print(f"mutation score {score:.1f}% ({stats['killed']} of {stats['total']} killed)")
    assert score >= floor(), stats
