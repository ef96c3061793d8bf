"""The sandbox's unprivileged path (a service not running as root, as on a laptop or in most containers)
held to every isolation the root path is: the whole escape suite, run again as uid 65534."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOBODY = "65534"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="running as root is what this re-runs without (as non-root, test_sandbox_escapes.py already takes the unprivileged path)",
)


def test_every_escape_fails_on_the_unprivileged_path_too():
    home = Path(tempfile.mkdtemp(prefix="reasonray-nobody-"))  # pytest's own tmp_path sits under root's 0700 directory
    shutil.chown(home, int(NOBODY), int(NOBODY))
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "TIKTOKEN_CACHE_DIR": os.environ.get("TIKTOKEN_CACHE_DIR", ""),
    }
    unprivileged = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    options = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", f"--basetemp={home / 't'}"]
    ran = subprocess.run(
        [*unprivileged, sys.executable, "-m", "pytest", "tests/security/test_sandbox_escapes.py", *options],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    shutil.rmtree(home, ignore_errors=True)
    summary = ran.stdout.strip().splitlines()[-1] if ran.stdout.strip() else ran.stderr[-2000:]
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))  # type: ignore[union-attr]
    skipped = re.search(r"(\d+) skipped", summary)
    # every escape ran; the one skip is the root-only re-run of the unprivileged process cap (this is it)
    assert passed >= 15 and (skipped is None or int(skipped.group(1)) <= 1), summary
