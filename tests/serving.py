"""For the tests that start `reasonray serve` of their own (tests/cluster, tests/integration): the environment a
user's shell would give it, the process in a process group of its own, and a port another process holds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
# the checkout's command line, whichever `reasonray` is installed
CLI = [sys.executable, "-c", "from reasonray.cli import main; main()"]


def user_env(*drop_prefixes: str, **extra: str) -> dict[str, str]:
    """This process's environment without the test session's own model, cluster and Serve settings (nor any
    variable starting with one of `drop_prefixes`), then `extra`."""
    drop = ("RAY_SERVE_", *drop_prefixes)
    kept = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "RAY_ADDRESS") and not k.startswith(drop)}
    return {**kept, **extra}


def start_serve(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """`reasonray serve ARGS --num-cpus 2` in a session of its own (so its whole tree can be signalled), its
    output and errors merged as text."""
    return subprocess.Popen(
        [BIN / "reasonray", "serve", *args, "--num-cpus", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@contextmanager
def serving(*args: str, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """`start_serve`, its process group killed at the end if the test left it running."""
    proc = start_serve(*args, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def serve_into(log: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The checkout's `reasonray serve ARGS` on 2 CPUs without a dashboard, run from the repository in a session of
    its own, its output and errors written to `log` (read while it runs)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [*CLI, "serve", *args, "--num-cpus", "2", "--no-dashboard"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )


def stop_group(
    proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout_s: float = 30, kill: Callable[[], None] | None = None
) -> None:
    """Send `sig` to the process group of `proc` (started in a session of its own) and wait up to `timeout_s` for
    it; if it has not ended by then, `kill()` (by default SIGKILL the group). Nothing if it has already ended."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        if kill is not None:
            kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def held_port() -> Iterator[int]:
    """A loopback port another socket listens on, bound with SO_REUSEPORT as Serve's proxies and HAProxy bind (so
    a bind without the check would share it), held until the block ends."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


# `reasonray mcp` over stdio, as an MCP client starts it
MCP_STDIO = [*CLI, "mcp"]


def mcp_stdio_env(sim_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    """The whole environment an MCP client gives `reasonray mcp` against the simulated model: nothing of the test
    session's own, the repository importable, then `extra`."""
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "TIKTOKEN_CACHE_DIR": os.environ.get("TIKTOKEN_CACHE_DIR", ""),
        "REASONRAY_LLM__PROVIDER": "simulated",
        "REASONRAY_LLM__BASE_URL": sim_url,
        "REASONRAY_MEMORY__EMBEDDING": "openai",  # the simulator's embeddings: no local model to load
        "REASONRAY_DATA_DIR": str(data_dir),
        "REASONRAY_LOGGING__LEVEL": "warning",
        **extra,
    }
