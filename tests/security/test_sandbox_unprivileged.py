"""The sandbox's unprivileged path (a service not running as root, as on a laptop or in most containers)
held to every isolation the root path is: the whole escape suite, run again as uid 65534.

Uid 65534 must read the checkout and its .venv to run pytest. A checkout cloned into a folder only its
owner may enter (root's home, any `mktemp -d`) is out of its reach, so the run is shown the checkout at
a place it can reach: a bind mount in a mount namespace of its own (the checkout's files and its
gigabytes of .venv are not copied, and the mount ends with the run). Where even that cannot work (the
interpreter itself is unreadable to other users, no `unshare`), the test skips and says why."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOBODY = "65534"
UNPRIVILEGED = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
# root, in a mount namespace of its own: bind the checkout ($0) at a place uid 65534 can reach ($1) and run the
# rest of the command from there; the mount is private to the namespace and gone when the command ends
BIND_AND_RUN = 'mount --bind "$0" "$1" && cd "$1" && shift && exec "$@"'
ESCAPES = "tests/security/test_sandbox_escapes.py"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="running as root is what this re-runs without (as non-root, test_sandbox_escapes.py already takes the unprivileged path)",
)


def searchable_by_others(path: Path) -> bool:
    """Whether a user that owns none of `path` and its parents can walk down to it (o+x on every one)."""
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [path, *path.parents])


@contextmanager
def nobodys_home() -> Iterator[Path]:
    """A fresh directory of uid 65534's own (its HOME and pytest's basetemp), under a temp dir it can reach:
    pytest's own tmp_path sits under root's 0700 directory, and TMPDIR may too."""
    base = next((Path(d) for d in (tempfile.gettempdir(), "/tmp", "/var/tmp") if searchable_by_others(Path(d))), None)
    if base is None:
        pytest.skip("no temp directory other users can enter (TMPDIR, /tmp, /var/tmp): uid 65534 would have nowhere to work")
    home = Path(tempfile.mkdtemp(prefix="reasonray-nobody-", dir=base))
    shutil.chown(home, int(NOBODY), int(NOBODY))
    try:
        yield home
    finally:
        mount_point = home / "checkout"
        if mount_point.exists():
            # rmdir, never rmtree: were the bind mount visible here, rmtree would delete the checkout through it
            mount_point.rmdir()
        shutil.rmtree(home, ignore_errors=True)


def command_as_nobody(checkout: Path, args: list[str]) -> tuple[list[str], Path]:
    """The command running `python *args` as uid 65534 in `checkout` (REPO itself, or the bind mount's place),
    and the directory to start it in. The interpreter is the running one, seen through the mount when it is
    the checkout's own .venv."""
    executable = Path(sys.executable)
    python = checkout / executable.relative_to(REPO) if executable.is_relative_to(REPO) else executable
    command = [*UNPRIVILEGED, str(python), *args]
    if checkout == REPO:
        return command, REPO
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", BIND_AND_RUN, str(REPO), str(checkout), *command], Path("/")


def run_as_nobody(checkout: Path, home: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    command, cwd = command_as_nobody(checkout, args)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "PYTHONPATH": str(checkout),
        "TIKTOKEN_CACHE_DIR": os.environ.get("TIKTOKEN_CACHE_DIR", ""),
    }
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


PROBE = ["-c", f"import pytest, reasonray.kernel.sandbox; open({ESCAPES!r}).close()"]


def checkout_for_nobody(home: Path) -> Path:
    """Where uid 65534 runs the suite: the checkout itself when it can read it (and its .venv), else the
    checkout bind-mounted into its home; skips, saying why, when it can use neither."""
    if run_as_nobody(REPO, home, PROBE, timeout=60).returncode == 0:
        return REPO
    if shutil.which("unshare") is None:
        pytest.skip(
            f"uid 65534 cannot read the checkout ({REPO} sits in a folder other users cannot enter) and `unshare` is missing to show it there"
        )
    mounted = home / "checkout"
    mounted.mkdir()
    probe = run_as_nobody(mounted, home, PROBE, timeout=60)
    if probe.returncode != 0:
        pytest.skip(
            f"uid 65534 cannot run this checkout's Python even from a bind mount of the checkout at {mounted}: the "
            f"interpreter ({os.path.realpath(sys.executable)}) and its standard library must be readable by other users, "
            f"and root must be able to mount in a namespace of its own. It said: {probe.stderr.strip()[-600:]}"
        )
    return mounted


def test_every_escape_fails_on_the_unprivileged_path_too():
    with nobodys_home() as home:
        checkout = checkout_for_nobody(home)
        options = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", f"--basetemp={home / 't'}"]
        ran = run_as_nobody(checkout, home, ["-m", "pytest", ESCAPES, *options], timeout=600)
    summary = ran.stdout.strip().splitlines()[-1] if ran.stdout.strip() else ran.stderr[-2000:]
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))  # type: ignore[union-attr]
    skipped = re.search(r"(\d+) skipped", summary)
    # every escape ran; the one skip is the root-only re-run of the unprivileged process cap (this is it)
    assert passed >= 15 and (skipped is None or int(skipped.group(1)) <= 1), summary


@pytest.mark.skipif(shutil.which("unshare") is None, reason="building the layout needs util-linux's unshare")
def test_the_escapes_run_as_nobody_from_a_checkout_in_a_folder_only_root_may_enter():
    """The layout `git clone` makes in root's home or a `mktemp -d`: the checkout, .venv included, inside a
        0700 folder, the suite run from there as root. The checkout is bind-mounted into such a folder (in a mount
        namespace of the run's own) and the test above runs from it: it must pass (or skip for the reasons it
    skips for anywhere, which it reports)."""
    locked = Path(tempfile.mkdtemp(prefix="reasonray-locked-")).resolve()
    assert stat.S_IMODE(locked.stat().st_mode) == 0o700
    inside = locked / "repo"
    inside.mkdir()
    try:
        executable = Path(sys.executable)
        python = inside / executable.relative_to(REPO) if executable.is_relative_to(REPO) else executable
        test = f"tests/security/test_sandbox_unprivileged.py::{test_every_escape_fails_on_the_unprivileged_path_too.__name__}"
        run_here = [str(python), "-m", "pytest", test, "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly"]
        mounted = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", BIND_AND_RUN, str(REPO), str(inside)]
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
        if "TIKTOKEN_CACHE_DIR" in os.environ:
            env["TIKTOKEN_CACHE_DIR"] = os.environ["TIKTOKEN_CACHE_DIR"]
        built = subprocess.run([*mounted, "true"], cwd="/", capture_output=True, text=True, timeout=60)
        if built.returncode != 0:
            pytest.skip(
                f"root cannot bind-mount in a namespace of its own here, so the layout cannot be built: {built.stderr.strip()[-400:]}"
            )
        ran = subprocess.run([*mounted, *run_here], cwd="/", env=env, capture_output=True, text=True, timeout=900)
    finally:
        inside.rmdir()  # rmdir, never rmtree: were the bind mount visible here, rmtree would delete the checkout through it
        locked.rmdir()
    summary = ran.stdout.strip().splitlines()[-1] if ran.stdout.strip() else ran.stderr[-2000:]
    if ran.returncode == 0 and re.search(r"\b1 skipped\b", summary):
        # the test above said why uid 65534 cannot run the suite on this host at all (the interpreter): say it here too
        pytest.skip(next((line for line in ran.stdout.splitlines() if line.startswith("SKIPPED")), summary))
    assert ran.returncode == 0 and re.search(r"\b1 passed\b", summary), ran.stdout[-4000:] + ran.stderr[-2000:]
