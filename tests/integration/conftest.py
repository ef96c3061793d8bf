"""One local Ray cluster, one Serve instance, one simulated model and one main application for every test in
this folder, shared by the run's workers (tests/integration/stack.py). They stop when the last worker's last
test of this folder ends; tests/cluster's modules start Ray clusters of their own."""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from filelock import FileLock

from reasonray.kernel.config import Settings, load_settings
from tests.integration import stack
from tests.tarpit import Tarpit

REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(item.fspath).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.integration)


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = deep_merge(out.get(key, {}), value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


RUN_DIR = stack.run_dir()
DATA_DIR = RUN_DIR / "data"  # the main application's, shared by the workers (its event logs are read by tests)
DATA_DIR.mkdir(mode=0o700, exist_ok=True)


def settings_for(sim_url: str, **changes: Any) -> dict[str, Any]:
    """The repository's config.toml, pointed at a simulated model, with fast retries for tests."""
    base = load_settings(REPO / "config.toml", environ={}).model_dump(mode="json")
    fast = {
        "data_dir": str(DATA_DIR),
        "llm": {
            "provider": "simulated",
            "base_url": sim_url,
            "request_timeout_s": 5,
            "retry": {"initial_backoff_s": 0.05, "max_backoff_s": 0.2, "jitter_s": 0.01},
        },
        "logging": {"level": "warning"},
        # the simulator's /v1/embeddings: every test app would otherwise load torch in its memory actor
        # (tests/integration/test_memory_http.py runs the default, sentence-transformers, on purpose)
        "memory": {"embedding": "openai"},
    }
    return Settings.model_validate(deep_merge(deep_merge(base, fast), changes)).model_dump(mode="json")


@pytest.fixture(scope="package")
def shared_stack() -> Iterator[stack.Stack]:
    """The run's cluster, Serve instance and simulated model, shared with the other workers (tests/integration/stack.py)."""
    running = stack.acquire(RUN_DIR)
    yield running
    stack.release(RUN_DIR, running)


@pytest.fixture(scope="package")
def simulator(shared_stack: stack.Stack) -> SimpleNamespace:
    return SimpleNamespace(url=shared_stack.simulator_url)


@pytest.fixture(scope="package")
def ray_cluster(shared_stack: stack.Stack) -> Iterator[None]:
    import ray

    os.environ.update(shared_stack.environment)  # what the cluster was started with (its ingress, Serve's settings)
    ray.init(address=shared_stack.address, namespace=stack.NAMESPACE, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="package")
def serve_base(ray_cluster: None, shared_stack: stack.Stack) -> str:
    return f"http://127.0.0.1:{shared_stack.serve_port}"


@pytest.fixture(scope="module")
def tarpit() -> Iterator[Tarpit]:
    """A remote that takes connections and never answers (tests/tarpit.py), for a module's egress tests."""
    pit = Tarpit()
    yield pit
    pit.stop()


DEPLOYED: set[str] = set()
"""The applications this process deployed: the other worker's are theirs to delete."""


def deploy(settings: dict[str, Any], app_name: str, route_prefix: str) -> None:
    from ray import serve

    from reasonray.serve_app import build_app

    DEPLOYED.add(app_name)
    serve.run(build_app({"settings": settings, "app_name": app_name}), name=app_name, route_prefix=route_prefix)


def undeploy(app_name: str) -> None:
    """Delete an application and retire its named actors (detached: they outlive `serve.delete` on purpose)."""
    from ray import serve

    from reasonray.actors.lifecycle import retire_extra

    serve.delete(app_name)
    retire_extra(f"{app_name}-", keep=set())
    DEPLOYED.discard(app_name)


@pytest.fixture(autouse=True, scope="module")
def _undeploy_the_modules_apps():
    """After each module, its applications go with their actors: each deploys a registry, a cache, a memory
    bank, session hosts and branch runners, and a suite that kept them all ran ~100 processes on 2 cores."""
    yield
    import ray

    if not ray.is_initialized():
        return
    for name in sorted(DEPLOYED - {MAIN_APP}):  # the main application is shared by every module of every worker
        undeploy(name)


MAIN_APP = "reasonray"


@pytest.fixture(scope="package")
def api(serve_base, simulator):
    """The main application at /, as `reasonray serve` deploys it; the first worker to need it deploys it."""
    from ray import serve

    with FileLock(RUN_DIR / "main-app.lock"):
        if MAIN_APP not in serve.status().applications:
            deploy(settings_for(simulator.url), MAIN_APP, "/")
    with httpx.Client(base_url=serve_base, timeout=60) as client:
        yield client


# An application of a test's own starts one branch runner and one session host instead of config.toml's
# two of each, and starts them (and the A2A task board) at their first use, not at deploy time
# (`[server] prestart` off: a deploy then starts 3 processes instead of 6, about 10 CPU-s less on 2 cores):
# the main application (`api`) runs the defaults, and a test about the pool or the hosts sets them in its changes.
LIGHT_APP: dict[str, Any] = {"fanout": {"pool_size": 1}, "sessions": {"hosts": 1}, "server": {"prestart": False}}


@contextmanager
def own_app(serve_base: str, sim_url: str, app_name: str, **changes: Any) -> Iterator[tuple[httpx.Client, dict[str, Any]]]:
    """An application of its own at /<app_name>, with a fresh data directory and these settings changes
    (over `LIGHT_APP`: one branch runner and one session host unless the changes say otherwise)."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"reasonray-{app_name}-"))
    settings = settings_for(sim_url, **deep_merge(LIGHT_APP, {"data_dir": str(data_dir), **changes}))
    deploy(settings, app_name, f"/{app_name}")
    with httpx.Client(base_url=f"{serve_base}/{app_name}", timeout=120) as client:
        yield client, settings


def result_of(response: httpx.Response) -> Any:
    """The JSON-RPC result, or a failure showing the whole error."""
    body = response.json()
    assert "result" in body, body
    return body["result"]


def rpc(client: httpx.Client, method: str, params: dict[str, Any] | None = None, id: int | None = 1, path: str = "/rpc"):
    call: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        call["params"] = params
    if id is not None:
        call["id"] = id
    return client.post(path, json=call)


def wait_until_serving(proc: Any, port: int, timeout_s: float, output: Any, what: str = "reasonray serve") -> None:
    """Poll the public probe of a service this test started until it answers; if the process exits or the
    deadline passes, kill its process group (so its output ends) and fail with `output()`."""
    import os
    import signal
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{what} did not come up:\n{output()}")
        time.sleep(0.5)


def descendants(root: int) -> list[int]:
    """Every process below `root` (children, their children...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, pending = [], [root]
    while pending:
        for child in parents.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def kill_tree(proc: Any) -> None:
    """SIGKILL a process started with `start_new_session=True` and everything below it. Ray starts some of
    a node's processes (the raylet, the GCS, workers) in sessions of their own, so the process group alone
    would leave them running for the rest of the suite."""
    import os
    import signal

    if proc.poll() is None:
        family = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait()
