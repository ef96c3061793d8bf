"""Runs untrusted Python in OS isolation: bubblewrap namespaces, an unprivileged uid, resource limits.

Code from a model or a caller (the `python` tool, react, `solve_coding_task`, the HumanEval scorer) runs as a
uid of its own under `bwrap` (no network; its own pid, ipc, uts and cgroup namespaces), sees read-only `/usr`
and the interpreter's prefix and a size-capped tmpfs at `/tmp`, with no service environment, under `prlimit`
caps; docs/security.md tables every limit. The time budget is CPU seconds, so a loaded machine does not fail code
that would finish; a program that sleeps or blocks is stopped after three times that in wall time. The tree is
its own process group in a fresh pid namespace (`--die-with-parent`): on timeout the group is killed and every
grandchild dies with it, so no pipe outlives the run. Output is read incrementally and only `max_output_chars`
are kept.

Audit hooks are not a sandbox (the CPython docs say so); the isolation here is the kernel's. When
bubblewrap is missing or cannot create namespaces on a host, `run_python` raises
`SandboxUnavailableError` rather than run anything unisolated.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import PurePath

from reasonray.kernel.errors import SandboxUnavailableError

# A uid of its own, with no account and no files: nothing else on the host runs as it, so the
# process cap (RLIMIT_NPROC, counted per uid) counts sandboxed code only (65534, nobody, is shared
# with daemons and test servers).
NOBODY = 64999
# reads the program from stdin (so no file of it exists anywhere) and runs it as __main__
PRELUDE = 'import sys; exec(compile(sys.stdin.read(), "<sandbox>", "exec"), {"__name__": "__main__"})'
# An unprivileged service cannot cap processes before bwrap: RLIMIT_NPROC counts every process of the
# service's uid on the host (Ray's workers included), so bwrap itself could not fork. Set inside the new
# user namespace, the kernel counts it per namespace uid (ucounts, Linux >= 5.14): the sandbox's
# processes only. Soft and hard together, so the code cannot raise it back.
NPROC_PRELUDE = "import resource; resource.setrlimit(resource.RLIMIT_NPROC, ({n}, {n})); "
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# bytes of output read per chunk; the cap is enforced as chunks arrive, the rest is drained unread
CHUNK = 65536
WALL_FACTOR = 3  # wall time allowed per second of the CPU budget (SandboxLimits.timeout_s)


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # CPU seconds (RLIMIT_CPU; the module docstring says why), and WALL_FACTOR times that in wall time
    memory_mb: int = 256
    max_output_chars: int = 4000
    max_processes: int = 16  # RLIMIT_NPROC for the sandbox uid: a fork bomb stops here
    max_file_mb: int = 16  # RLIMIT_FSIZE: largest file the code may write (in its tmpfs)
    scratch_mb: int = 32  # size of the tmpfs at /tmp, the only writable place
    max_open_files: int = 64  # RLIMIT_NOFILE

    @property
    def wall_s(self) -> float:
        return self.timeout_s * WALL_FACTOR


@dataclass(frozen=True)
class RunResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None: killed on timeout
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def interpreter() -> tuple[str, str]:
    """(the real interpreter, its prefix): a venv's python is a symlink into the base installation."""
    prefix = os.path.realpath(sys.base_prefix)
    exe = os.path.join(prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    return (exe if os.path.exists(exe) else os.path.realpath(sys.executable)), prefix


def _command(limits: SandboxLimits, prefix: str, exe: str) -> list[str]:
    tools = {name: shutil.which(name) or "" for name in ("bwrap", "prlimit", "setpriv")}
    if missing := [name for name, path in tools.items() if not path]:
        raise SandboxUnavailableError(
            f"the python sandbox needs bubblewrap, prlimit and setpriv; not found on this host: {', '.join(missing)} "
            "(scripts/setup.sh installs them); code is never run unisolated",
            {"missing": missing},
        )
    rlimits = [
        f"--as={limits.memory_mb * 1024 * 1024}",
        f"--cpu={max(1, math.ceil(limits.timeout_s))}",
        f"--fsize={limits.max_file_mb * 1024 * 1024}",
        f"--nofile={limits.max_open_files}",
        "--core=0",
    ]
    as_root = os.geteuid() == 0
    if as_root:
        rlimits.append(f"--nproc={limits.max_processes}")
    cmd = [tools["prlimit"], *rlimits, "--", tools["bwrap"]]
    if as_root:
        # As root, bwrap sets up the namespaces with real privileges and setpriv drops to the sandbox uid/gid on the
        # host, not only inside a user namespace: the code has no owner rights on root's files, and
        # RLIMIT_NPROC (never enforced for root) counts its processes.
        cmd += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        drop = [tools["setpriv"], f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs"]
        drop += ["--inh-caps=-all", "--bounding-set=-all", "--"]
    else:
        # an unprivileged service: a user namespace maps it to the sandbox uid inside (its processes share the host uid)
        cmd += ["--unshare-all", "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--disable-userns"]
        drop = []
    cmd += ["--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = os.path.join("/", link)
        if os.path.islink(target):
            cmd += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            cmd += ["--ro-bind", target, target]
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        # the interpreter's installation (e.g. /root/.pyenv/versions/X); its parents readable, or Python
        # cannot find its own prefix and falls back to /usr's standard library
        for parent in reversed(PurePath(prefix).parents[:-1]):  # outermost first, "/" left out
            cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", prefix, prefix]
    # /dev read-only: its /dev/shm is a tmpfs outside the scratch size cap, and on the unprivileged path the
    # sandbox uid owns it (as root it is root's, closed to the sandbox uid): writes there would fill memory
    cmd += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    cmd += ["--perms", "1777", "--size", str(limits.scratch_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    cmd += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    cmd += ["--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    prelude = PRELUDE if as_root else NPROC_PRELUDE.format(n=limits.max_processes) + PRELUDE
    return [*cmd, "--", *drop, exe, "-I", "-c", prelude]


async def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> RunResult:
    """Run `code` isolated; never raises for anything the code does (errors are in stderr and exit_code).

    Raises `SandboxUnavailableError` when the isolation cannot be set up on this host.
    """
    exe, prefix = interpreter()
    proc = await asyncio.create_subprocess_exec(
        *_command(limits, prefix, exe),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"},  # bwrap's own environ: nothing of the service's
        cwd="/",
        start_new_session=True,  # its own session and process group, killed whole on timeout
    )
    out, err = _Capture(limits.max_output_chars * 4), _Capture(limits.max_output_chars * 4)
    readers = asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr), _feed(proc.stdin, code.encode()))
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(readers), timeout=limits.wall_s)
        await asyncio.wait_for(proc.wait(), timeout=limits.wall_s)
    except TimeoutError:
        timed_out = True
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the code's own children too
        # the pid namespace dies with bwrap, so the pipes close; bound the wait anyway
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(readers), timeout=2.0)
        if not readers.done():
            readers.cancel()
            with contextlib.suppress(BaseException):
                await readers
        await proc.wait()
    if not timed_out and proc.returncode in (1, 127) and out.size == 0 and err.text().startswith(("bwrap:", "setpriv:", "prlimit:")):
        raise SandboxUnavailableError(f"the python sandbox could not start: {err.text().strip()[:300]}")
    stdout, stderr = out.clipped(limits.max_output_chars), err.clipped(limits.max_output_chars)
    # RLIMIT_CPU's hard limit ends the code with SIGKILL (bwrap passes it on as 128 + 9): its time budget is spent
    timed_out = timed_out or proc.returncode in (128 + signal.SIGKILL, -signal.SIGKILL)
    return RunResult(stdout, stderr, None if timed_out else proc.returncode, timed_out)


@dataclass
class _Capture:
    """Keeps the first `limit` bytes of a stream and counts the rest without storing it."""

    limit: int
    kept: bytearray = field(default_factory=bytearray)
    size: int = 0

    async def drain(self, stream: asyncio.StreamReader | None) -> None:
        assert stream is not None
        while chunk := await stream.read(CHUNK):
            self.size += len(chunk)
            room = self.limit - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]

    def text(self) -> str:
        return self.kept.decode(errors="replace")

    def clipped(self, limit: int) -> str:
        """The text cut to `limit` characters, saying how many more there were."""
        text = self.text()
        more = max(len(text) - limit, 0) + (self.size - len(self.kept))
        return text[:limit] + f"\n... [truncated: {more} more characters]" if more else text


async def _feed(stdin: asyncio.StreamWriter | None, data: bytes) -> None:
    assert stdin is not None
    # the code may exit without reading all of stdin: a broken pipe is its business
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
        stdin.close()
