"""The MCP Inspector's CLI (npm `@modelcontextprotocol/inspector`, installed into a temporary directory at test
time) against `reasonray mcp` over stdio: it fills object parameters from the tools' input schemas, which
it can only do when they are typed `object` (docs/mcp.md, Tools)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.serving import MCP_STDIO, mcp_stdio_env

pytestmark = pytest.mark.slow

INSPECTOR = "@modelcontextprotocol/inspector@0.15.0"


@pytest.fixture(scope="module")
def inspector(tmp_path_factory) -> Path:
    npm = shutil.which("npm")
    assert npm, "npm is missing: the MCP Inspector is an npm package"
    root = tmp_path_factory.mktemp("inspector")
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(root), INSPECTOR], check=True, timeout=600, capture_output=True
    )
    return root / "node_modules" / ".bin" / "mcp-inspector"


def test_the_inspector_fills_optional_object_parameters(inspector, simulator, tmp_path):
    env = mcp_stdio_env(simulator.url, tmp_path, PATH=os.environ["PATH"])  # the inspector runs on node
    args = {
        "query": "What is 6 * 7?",
        "strategy": "self_consistency",
        "strategy_config": '{"samples": 3}',
        "budget": '{"max_total_tokens": 5000}',
    }
    command = [str(inspector), "--cli", *MCP_STDIO, "--method", "tools/call", "--tool-name", "reason"]
    for key, value in args.items():
        command += ["--tool-arg", f"{key}={value}"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    reply = json.loads(run.stdout)
    assert not reply.get("isError"), reply
    result = reply["structuredContent"]
    assert result["answer"] == "42" and result["resolution"]["config"]["samples"] == 3  # the object arrived as an object
