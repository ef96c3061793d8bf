"""The layer picture in docs/architecture.md is the one import-linter enforces, and it holds."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.docs_examples import REPO

FOLDER_TO_MODULE = {
    "reasonray/cli.py": "reasonray.cli",
    "reasonray/evals/": "reasonray.evals",
    "serve_app.py": "reasonray.serve_app",
    "actors/": "reasonray.actors",
    "reasonray/api/": "reasonray.api",
    "strategies/": "reasonray.strategies",
    "reasonray/reasoner/": "reasonray.reasoner",
    "memory/": "reasonray.memory",
    "reasonray/gateway/": "reasonray.gateway",
    "reasonray/stores/": "reasonray.stores",
    "reasonray/kernel/": "reasonray.kernel",
}


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_the_documented_layers_are_the_enforced_ones():
    layers = next(c for c in contracts() if c["type"] == "layers")["layers"]
    page = (REPO / "docs" / "architecture.md").read_text()
    table = re.findall(r"^\| [A-Za-z ]+ \| (`[^|]+`) \|", page, re.MULTILINE)
    documented = []
    for cell in table:
        for folder in re.findall(r"`([^`]+)`", cell):
            if folder in FOLDER_TO_MODULE:
                documented.append(FOLDER_TO_MODULE[folder])
    assert documented == layers


def test_the_import_contracts_hold():
    linter = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(linter)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "0 broken" in run.stdout
