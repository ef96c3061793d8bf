"""The integration tests' Ray cluster, Serve instance and simulated model, one for every pytest process of a run.

On two workers (`scripts/test.sh default`: pytest-xdist), each worker's integration tests used to start a cluster
of their own: two sets of Ray's daemons, two Serve controllers and proxies, two main applications, each burning
its share of two cores while idle. Now the first worker to need one starts a holder process (`python -m
tests.integration.stack <run dir>`) that starts the cluster, Serve and the simulator, and writes where they are
to `<run dir>/stack.json`; every worker connects to it (`ray.init(address=...)`) and registers its pid there. A
worker that is done unregisters; the holder stops everything when no registered worker is left (or alive: a
worker that crashed does not keep the cluster up). A run on one process works the same way.

The run dir is keyed by `PYTEST_REASONRAY_RUN`, which the run's first process sets and its workers inherit; xdist's
controller starts the holder before the workers have collected (`start_early`, tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

STATE = "stack.json"
USERS = "users.json"
START_TIMEOUT_S = 240.0  # a cluster and Serve on a loaded 2-core machine
STOP_TIMEOUT_S = 60.0
WATCH_S = 1.0  # how often the holder looks for workers still registered and alive
# How often every Ray process reports its metrics (Ray's default 10,000 ms): the tests that read /metrics wait
# for their own series, so a shorter interval only shortens their wait, while each of the cluster's ~30 processes
# pays for it all run long (an idle stack burnt 0.27 of a core at 1,000 ms with Serve's 0.1-s control loop,
# 0.17 at 5,000 ms and 0.25 s).
METRICS_REPORT_INTERVAL_MS = 5000
SERVE_CONTROL_LOOP_INTERVAL_S = "0.25"  # Serve's controller reconciles every 0.1 s by default
NAMESPACE = "reasonray-tests"


@dataclass(frozen=True)
class Stack:
    address: str  # the GCS, for ray.init
    serve_port: int
    simulator_url: str
    environment: dict[str, str]  # what the cluster was started with (ingress ports, Serve's settings)
    holder_pid: int


RUN_ENV = "PYTEST_REASONRAY_RUN"  # set by the run's first process (xdist's controller), inherited by its workers
STARTING = "starting.json"
START_GRACE_S = 180.0  # a holder started ahead of its users waits this long for the first one (their collection)


def run_dir() -> Path:
    run = os.environ.setdefault(RUN_ENV, f"{os.getpid()}-{int(time.time())}")
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"reasonray-it-{run}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _alive(pid: int) -> bool:
    """Running (a zombie, exited and not yet reaped by the worker that started it, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _read(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def start_early(directory: Path) -> None:
    """Start the holder now without waiting for it: xdist's controller does, so the cluster starts while the
    workers start and collect (some 15 s of a run), not after."""
    with FileLock(directory / "stack.lock"):
        if _read(directory / STATE, None) is None and _starting(directory) is None:
            _spawn(directory)


def acquire(directory: Path) -> Stack:
    """The run's stack, started now if no holder runs; this process is registered as one of its users."""
    with FileLock(directory / "stack.lock"):
        state = _read(directory / STATE, None)
        if state is None or not _alive(state["holder_pid"]):
            (directory / STATE).unlink(missing_ok=True)
            state = _wait_for_state(directory, _starting(directory) or _spawn(directory))
        users = {int(p) for p in _read(directory / USERS, []) if _alive(int(p))} | {os.getpid()}
        (directory / USERS).write_text(json.dumps(sorted(users)))
        return Stack(**state)


def release(directory: Path, stack: Stack) -> None:
    """This process is done with the stack; the last user stops it, and waits until it has."""
    with FileLock(directory / "stack.lock"):
        users = {int(p) for p in _read(directory / USERS, []) if _alive(int(p))} - {os.getpid()}
        (directory / USERS).write_text(json.dumps(sorted(users)))
        if users or not _alive(stack.holder_pid):
            return
        (directory / STATE).unlink(missing_ok=True)  # a user arriving now starts a new stack
        os.kill(stack.holder_pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _alive(stack.holder_pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _starting(directory: Path) -> int | None:
    """The pid of a holder started and not yet serving, if it still runs."""
    pid = _read(directory / STARTING, {}).get("pid")
    return pid if pid is not None and _alive(pid) else None


def _spawn(directory: Path) -> int:
    log = open(directory / "holder.log", "ab")  # noqa: SIM115 - the holder's output, for a failed start's message
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.stack", str(directory)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C of the run reaches it through its users' exit, not mid-start
        cwd=Path(__file__).resolve().parents[2],
    )
    (directory / STARTING).write_text(json.dumps({"pid": holder.pid}))
    return holder.pid


def _wait_for_state(directory: Path, holder: int) -> dict[str, Any]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while (state := _read(directory / STATE, None)) is None:
        if not _alive(holder) or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(holder, signal.SIGKILL)
            tail = (directory / "holder.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the test cluster did not start (holder {holder}):\n{tail}")
        time.sleep(0.2)
    return state  # type: ignore[no-any-return]


def _hold(directory: Path) -> None:
    """The holder: cluster, Serve and simulator up, the address written, then wait for the last user to go."""
    import ray
    from ray import serve

    from reasonray.actors.environment import ray_environment
    from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings, free_port
    from reasonray.kernel.config import Settings

    environment = ray_environment(Settings())  # the ingress `reasonray serve` uses
    environment.setdefault("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", SERVE_CONTROL_LOOP_INTERVAL_S)
    os.environ.update(environment)
    simulator = SimulatorServer(SimulatorSettings(port=0, hang_s=10)).start()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
        # user metrics reach the metrics endpoint within seconds instead of Ray's default ten
        _system_config={"metrics_report_interval_ms": METRICS_REPORT_INTERVAL_MS},
    )
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    state = {
        "address": ray.get_runtime_context().gcs_address,
        "serve_port": port,
        "simulator_url": simulator.url,
        "environment": environment,
        "holder_pid": os.getpid(),
    }
    (directory / f"{STATE}.tmp").write_text(json.dumps(state))
    os.replace(directory / f"{STATE}.tmp", directory / STATE)
    (directory / STARTING).unlink(missing_ok=True)
    started = time.monotonic()
    while not stopping:
        time.sleep(WATCH_S)
        with FileLock(directory / "stack.lock"):
            users = [int(p) for p in _read(directory / USERS, []) if _alive(int(p))]
            # a holder started ahead of its users (xdist's controller) waits for the first one
            if not users and time.monotonic() - started > START_GRACE_S:
                (directory / STATE).unlink(missing_ok=True)
                break
    serve.shutdown()  # the proxies (HAProxy among them) stop with Serve, not with Ray
    ray.shutdown()
    simulator.stop()


if __name__ == "__main__":
    _hold(Path(sys.argv[1]))
