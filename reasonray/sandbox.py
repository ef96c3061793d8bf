"""Runs untrusted Python in a subprocess with a time limit, a memory limit, no network and no children.

The child is an isolated interpreter (`-I`: no user site, no PYTHON* variables) in an empty
temporary directory with a minimal environment. Before the code runs, an audit hook (which the code
cannot remove) refuses sockets, subprocesses, `os.system`, `exec*`, `fork` and `ctypes`. Resource
limits cap its address space, CPU time and file sizes; a wall-clock timeout kills it. Output is
truncated to `max_output_chars`. Used by the session reasoner's `python` tool and the HumanEval scorer.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from dataclasses import dataclass

PRELUDE = r'''
import resource, sys

memory, cpu = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024, 16 * 1024 * 1024))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

_BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn",
            "os.spawn", "pty.", "ctypes.", "_posixsubprocess.")

def _guard(event, args):
    if event.startswith(_BLOCKED) and event != "socket.getdefaulttimeout":
        raise PermissionError(f"the sandbox does not allow {event}")

sys.addaudithook(_guard)
del _guard
source = sys.stdin.read()
exec(compile(source, "<sandbox>", "exec"), {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    memory_mb: int = 256
    max_output_chars: int = 4000


@dataclass(frozen=True)
class RunResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None: killed on timeout
    timed_out: bool
    truncated: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


async def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> RunResult:
    """Run `code`; never raises for anything the code does (errors are in stderr and exit_code)."""
    with tempfile.TemporaryDirectory(prefix="reasonray-sandbox-") as workdir:
        # the limits are set by the child itself, first thing: no preexec_fn, which is unsafe in threaded hosts
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-c", PRELUDE, str(limits.memory_mb * 1024 * 1024), str(max(1, int(limits.timeout_s) + 1)),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=workdir, env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"},
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(code.encode()), timeout=limits.timeout_s)
            timed_out = False
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            timed_out = True
    stdout, cut_out = _truncate(out.decode(errors="replace"), limits.max_output_chars)
    stderr, cut_err = _truncate(err.decode(errors="replace"), limits.max_output_chars)
    return RunResult(stdout, stderr, None if timed_out else proc.returncode, timed_out, cut_out or cut_err)


def _truncate(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"\n... [truncated: {len(text) - limit} more characters]", True
