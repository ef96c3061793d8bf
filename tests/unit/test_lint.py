"""`make lint` inside the default run: ruff's checks, its formatting and `mypy --strict` on the kernel, the
gateway and the api layer (the import contracts are tests/unit/test_layers.py's). As tests they run on the
worker the Ray stack leaves free instead of before the suite (docs/testing.md); `make lint` runs the same
commands on their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.docs_examples import REPO

BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    done = run("ruff", "check", ".")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_the_code_is_formatted():
    done = run("ruff", "format", "--check", ".")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_mypy_strict_passes_on_the_kernel_the_gateway_and_the_api_layer():
    done = run("mypy", "--strict", "-p", "reasonray.kernel", "-p", "reasonray.gateway", "-p", "reasonray.api")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
