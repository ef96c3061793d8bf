"""Mutation testing of the kernel, the gateway and the strategies: the unit tests kill at least the
floor that docs/testing.md states (the floor only rises)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_examples import REPO

pytestmark = pytest.mark.slow


def floor() -> float:
    match = re.search(r"Mutation score floor: (\d+(?:\.\d+)?)%", (REPO / "docs" / "testing.md").read_text())
    assert match, "docs/testing.md states the mutation score floor"
    return float(match.group(1))


def test_the_unit_tests_kill_at_least_the_floor_of_mutants():
    shutil.rmtree(REPO / "mutants", ignore_errors=True)
    mutmut = Path(sys.executable).with_name("mutmut")
    run = subprocess.run([str(mutmut), "run"], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    subprocess.run([str(mutmut), "export-cicd-stats"], cwd=REPO, check=True, capture_output=True)
    stats = json.loads((REPO / "mutants" / "mutmut-cicd-stats.json").read_text())
    assert stats["total"] > 1000, stats  # the whole kernel, gateway and strategies were mutated
    score = 100 * stats["killed"] / stats["total"]
    print(f"mutation score {score:.1f}% ({stats['killed']} of {stats['total']} killed)")
    assert score >= floor(), stats
