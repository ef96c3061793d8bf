"""The official A2A TCK (a2aproject/a2a-tck, branch 1.0-dev) against the running service, over JSON-RPC and
HTTP+JSON at the URL the agent card advertises (docs/interop.md).

The TCK is installed from its source at test time into a virtual environment of its own (its code is never
part of this repository): `A2A_TCK_SOURCE` names a local git checkout of it (no test reaches the network: fetch
the repository once, then point the variable at it; without it the test fails saying so). The service runs as
an application of its own with the TCK's scripted scenarios plugged in as its A2A executor (`[a2a] executor`,
tests/a2a_scenarios.py), so messages whose ids name one of them get their scripted events; every MUST test must pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.integration.conftest import own_app

pytestmark = pytest.mark.slow

SOURCE = os.environ.get("A2A_TCK_SOURCE", "")
BRANCH = "1.0-dev"


@pytest.fixture(scope="module")
def tck(tmp_path_factory) -> Path:
    """A checkout of the TCK with its own virtual environment (`.venv`), installed from source."""
    if not SOURCE or not Path(SOURCE).is_dir():
        pytest.fail(f"A2A_TCK_SOURCE={SOURCE!r}: set it to a local git checkout of a2aproject/a2a-tck (branch {BRANCH})")
    root = tmp_path_factory.mktemp("a2a-tck") / "tck"
    subprocess.run(["git", "clone", "-q", "--depth", "1", "-b", BRANCH, SOURCE, str(root)], check=True, timeout=300)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(root / ".venv" / "bin" / "python"), "install", "-q", "-e", str(root)]
    subprocess.run(pip, check=True, timeout=900)
    return root


def outcomes(tck: Path) -> tuple[list[str], list[str]]:
    """(failed, passed) test ids of the TCK's last run, from its JUnit report."""
    report = ET.parse(tck / "reports" / "junitreport.xml").getroot()
    tags = {f"{c.get('classname')}::{c.get('name')}": [child.tag for child in c] for c in report.iter("testcase")}
    failed = sorted(name for name, kinds in tags.items() if "failure" in kinds or "error" in kinds)
    return failed, [name for name, kinds in tags.items() if not kinds]


def test_the_tck_must_and_should_tests_pass_over_jsonrpc_and_http_json(serve_base, simulator, tck):
    with own_app(serve_base, simulator.url, "a2a-tck", a2a={"executor": "tests.a2a_scenarios:ScenarioExecutor"}) as (client, _):
        command = [str(tck / ".venv" / "bin" / "python"), "run_tck.py", "--sut-host", str(client.base_url).rstrip("/")]
        run = subprocess.run(
            [*command, "--level", "must", "--transport", "jsonrpc,http_json"], cwd=tck, capture_output=True, text=True, timeout=1500
        )
        failed, passed = outcomes(tck)
        assert not failed, (failed, run.stdout[-4000:])
        assert len(passed) >= 141, (len(passed), run.stdout[-4000:])
        card = json.loads((tck / "reports" / "compatibility.json").read_text())["agent_card"]
        assert card, "the TCK read no agent card"
        # SHOULD: what applies to the card's declarations (the rest the TCK skips itself, or records as expected failures)
        run = subprocess.run(
            [*command, "--level", "should", "--transport", "jsonrpc,http_json"], cwd=tck, capture_output=True, text=True, timeout=1500
        )
        failed, passed = outcomes(tck)
        assert not failed, (failed, run.stdout[-4000:])
        assert len(passed) >= 9, (len(passed), run.stdout[-4000:])
