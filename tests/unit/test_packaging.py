"""What `pip install reasonray` gives a user: one top-level package, and third-party strategies that
plug in through the entry-point group with nothing of the repository on the path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "examples" / "reasonray-step-back"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    # the plugin is built from a copy, as a package a third party keeps outside this repository
    plugin = tmp_path_factory.mktemp("plugin") / "reasonray-step-back"
    shutil.copytree(PLUGIN, plugin, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
    for source in (REPO, plugin):
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
            check=True,
            capture_output=True,
        )
    return {"reasonray": next(out.glob("reasonray-*.whl")), "plugin": next(out.glob("reasonray_step_back-*.whl"))}


def test_the_wheel_holds_only_the_reasonray_package(wheels):
    names = zipfile.ZipFile(wheels["reasonray"]).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"reasonray", "reasonray-0.1.0.dist-info"}
    # the folders the repository keeps at its top are inside the package
    for module in ("reasonray/strategies/base.py", "reasonray/actors/fanout.py", "reasonray/memory/bank.py", "reasonray/serve_app.py"):
        assert module in names
    entry_points = zipfile.ZipFile(wheels["reasonray"]).read("reasonray-0.1.0.dist-info/entry_points.txt").decode()
    assert "chain_of_thought = reasonray.strategies.chain_of_thought:ChainOfThought" in entry_points


def test_a_third_party_strategy_runs_against_the_installed_wheel(wheels, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # Dependencies come from the test environment's site-packages (read through a .pth line, so its
    # editable install of this checkout is not activated); ReasonRay and the plugin from their wheels.
    site = next((venv / "lib").glob("python3.*/site-packages"))
    deps = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "pydantic").is_dir())
    (site / "deps.pth").write_text(f"{deps}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", *map(str, wheels.values())],
        check=True,
        capture_output=True,
    )
    script = textwrap.dedent(
        """
        import asyncio, json
        import reasonray
        from reasonray.api.app import local_dispatcher
        from reasonray.gateway.testing import ScriptedLLM
        from reasonray.kernel.config import ReasoningSettings

        settings = ReasoningSettings.model_validate(
            {"enabled_strategies": ["chain_of_thought", "step_back"], "default_strategy": "chain_of_thought"}
        )
        llm = ScriptedLLM(["<answer>Distribute.</answer>", "<answer>391</answer>"])
        payload = {"jsonrpc": "2.0", "id": 1, "method": "reasoning.execute",
                   "params": {"query": "What is 17 * 23?", "strategy": "step_back"}}
        response, _ = asyncio.run(local_dispatcher(settings, llm).handle_payload(payload))
        print(json.dumps({"package": reasonray.__file__, "result": response["result"]}))
        """
    )
    run = subprocess.run([str(python), "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["package"].startswith(str(venv)), "ReasonRay was imported from the checkout, not from the wheel"
    assert out["result"]["answer"] == "391" and out["result"]["strategy_used"] == "step_back"
