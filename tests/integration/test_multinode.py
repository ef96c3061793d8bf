"""A real multi-node cluster on this machine: a Ray head and two worker nodes (each its own `ray start` with
its own ports and resources; the head's temp dir is the test's), PostgreSQL as the store and a Chroma
server as the memory bank, both started here. Sessions are created and answered, then a worker node that
runs session hosts and API replicas is killed (SIGKILL to its whole process group) while turns are in
flight, and the data directory is wiped: no NFS, no local files. Afterwards every session continues on
the surviving nodes (its host moved), and no session, turn, agent card, memory or run record is lost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reasonray.gateway.simulator.server import free_port
from reasonray.reasoner.session import SessionState
from reasonray.stores.postgres import PgStore
from reasonray.stores.runs import PgRunIndex
from reasonray.stores.sessions import PgSessionStore
from tests.integration import stack
from tests.integration.conftest import kill_tree, result_of, rpc, settings_for
from tests.serving import stop_group

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
APP = "multinode"
HOSTS = 3  # session hosts, spread over the head and the two workers


class RayNode:
    """One `ray start --block`: its process group is the node (raylet, workers, and on the head the GCS)."""

    def __init__(self, gcs_port: int, temp_dir: Path, *, head: bool, num_cpus: int, resources: dict[str, float]) -> None:
        argv = [
            str(BIN / "ray"),
            "start",
            "--block",
            "--disable-usage-stats",
            f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
        ]
        if head:
            argv += [
                "--head",
                f"--port={gcs_port}",
                f"--temp-dir={temp_dir}",
                "--include-dashboard=false",
                f"--ray-client-server-port={free_port()}",
            ]
        else:
            argv += [f"--address=127.0.0.1:{gcs_port}"]
        # not the address nor the Serve settings of the run's shared cluster, which an earlier module put in this
        # process's environment: its HAProxy ingress and that instance's own listener ports (this Serve would bind them)
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("RAY_SERVE_")}
        # a loaded machine: the raylet waits this long for its dashboard agent's ports (it aborts after 30 s by default)
        env.update({"RAY_AUTH_MODE": "token", "RAY_raylet_start_wait_time_s": "120", "RAY_agent_register_timeout_ms": "120000"})
        self.log = open(temp_dir.parent / f"ray-{'head' if head else 'worker'}-{num_cpus}-{free_port()}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        """The node dies at once: every process of it, no goodbye to the GCS. Ray starts some of them in
        sessions of their own, so the process group is not enough: every descendant of `ray start` goes."""
        kill_tree(self.proc)

    def stop(self) -> None:
        stop_group(self.proc, kill=self.kill)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of the node left behind
        except ProcessLookupError:
            pass
        self.log.close()


def wait_for(check, what: str, timeout_s: float = 180) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def chroma_server() -> Iterator[str]:
    path = Path(tempfile.mkdtemp(prefix="reasonray-chroma-"))
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "chroma"), "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(f"{url}/api/v2/heartbeat", timeout=2).status_code == 200, "the Chroma server", 120)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(path, ignore_errors=True)


def start_worker(ray, gcs: int, temp_dir: Path, nodes: list[RayNode], live: int, attempts: int = 3) -> RayNode:
    """A worker node, started again when its raylet aborts while starting: on a loaded machine Ray 2.60's raylet
    gives up after 30 s waiting for its dashboard agent's port file ("Timed out waiting for file
    .../dashboard_agent_listen_port_..."), a start-up race of Ray's, not of the code under test."""
    for _ in range(attempts):
        node = RayNode(gcs, temp_dir, head=False, num_cpus=2, resources={"worker": 1})
        nodes.append(node)

        deadline = time.monotonic() + 180
        while node.proc.poll() is None and time.monotonic() < deadline:
            if len([n for n in ray.nodes() if n["Alive"]]) == live:
                return node
            time.sleep(0.5)
        if node.proc.poll() is None:
            pytest.fail(f"timed out waiting for {live} live nodes")
        node.stop()  # its `ray start --block` exited: the raylet aborted
        nodes.remove(node)
    pytest.fail(f"a worker node did not start in {attempts} attempts; see the ray-worker-*.log files under {temp_dir.parent}")


def connect(ray, gcs: int) -> bool:
    try:
        ray.init(address=f"127.0.0.1:{gcs}", namespace="reasonray")
    except (ConnectionError, RuntimeError):
        ray.shutdown()  # a half-made connection is not retried by a second init
        raise
    return True


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    import ray

    # this process may be connected to the run's shared cluster (an earlier module's tests): it connects here to its
    # own, and back there after, or every later module of the package would find Ray not connected
    shared = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    ray.shutdown()
    root = Path(tempfile.mkdtemp(prefix="rr-mn-", dir="/tmp"))  # short: Ray's socket paths must fit in 107 bytes
    temp_dir = root / "ray"
    temp_dir.mkdir()
    gcs = free_port()
    head = RayNode(gcs, temp_dir, head=True, num_cpus=0, resources={"head": 1})  # the control plane only
    nodes: list[RayNode] = [head]
    try:
        wait_for(
            lambda: subprocess.run([str(BIN / "ray"), "health-check", f"--address=127.0.0.1:{gcs}"], capture_output=True).returncode == 0,
            "the head",
        )
        # `ray health-check` answers once the GCS does; the head's raylet may register later on a loaded machine
        wait_for(lambda: connect(ray, gcs), "the head's raylet", 240)
        workers: list[RayNode] = []
        for _ in range(2):  # one at a time: two raylets registering at once time out on a loaded machine
            workers.append(start_worker(ray, gcs, temp_dir, nodes, live=len(workers) + 2))
        yield {"ray": ray, "head": head, "workers": workers, "root": root}
    finally:
        try:
            ray.shutdown()
        finally:
            for node in reversed(nodes):
                node.stop()
            shutil.rmtree(root, ignore_errors=True)
            if shared is not None:
                ray.init(address=shared, namespace=stack.NAMESPACE, log_to_driver=False)


def host_of(ray, session_id: str) -> str:
    """The node of the session host that serves `session_id` (the host the ingress routes it to)."""
    from reasonray.actors import NAMESPACE
    from reasonray.actors.session import host_index, host_name

    actor = ray.get_actor(host_name(APP, host_index(session_id, HOSTS)), namespace=NAMESPACE)
    return ray.get(actor.stats.remote(), timeout=60)["node_id"]


def node_of_worker(ray, worker: RayNode) -> str:
    """The Ray node id of a worker we started: the one whose raylet is a child of its `ray start`."""
    ports = {n["NodeID"]: n["NodeManagerPort"] for n in ray.nodes() if n["Alive"]}
    argv = next(a for a in worker.proc.args if a.startswith("--node-manager-port="))
    port = int(argv.split("=", 1)[1])
    return next(node for node, p in ports.items() if p == port)


@pytest.mark.timeout(1500)
def test_a_node_killed_under_load_loses_nothing(cluster, pg_url, chroma_server, simulator):
    from ray import serve

    from reasonray.serve_app import build_app

    ray = cluster["ray"]
    data_dir = cluster["root"] / "data"
    settings = settings_for(
        simulator.url,
        data_dir=str(data_dir),
        store={"url": pg_url},
        memory={"chroma_url": chroma_server, "embedding": "openai"},
        server={"num_replicas": 2, "fast_ingress": False},
        sessions={"hosts": HOSTS},
    )
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app({"settings": settings, "app_name": APP}), name=APP, route_prefix="/")
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)

    card = {"id": "survivor", "name": "Survivor", "capabilities": ["reasoning.strategy.chain_of_thought"]}
    result_of(rpc(client, "agent.register", card))
    memory = result_of(rpc(client, "memory.store", {"items": [{"title": "Kept", "description": "A lesson.", "content": "Check units."}]}))
    memory_id = memory["stored"][0]["id"]

    answered: dict[str, list[dict[str, Any]]] = {}  # session -> every turn result the client got
    sessions = [result_of(rpc(client, "session.create", {"server_tools": ["calculator"]}))["session_id"] for _ in range(6)]
    for sid in sessions:
        answered[sid] = [result_of(rpc(client, "session.turn", {"session_id": sid, "message": "What is 2 + 2?"}))]
    hosts = {sid: host_of(ray, sid) for sid in sessions}
    driver_node = ray.get_runtime_context().get_node_id()
    worker_nodes = {node_of_worker(ray, w): w for w in cluster["workers"]}
    # the victim: the worker hosting the most sessions, unless the test's own driver is attached to it
    candidates = [n for n in worker_nodes if n != driver_node]
    victim = max(candidates, key=lambda n: sum(h == n for h in hosts.values()))
    moved = [sid for sid, h in hosts.items() if h == victim]
    assert moved, f"no session on the victim node; hosts: {hosts}"

    failures: list[str] = []
    unanswered: list[str] = []

    def converse(sid: str) -> None:
        for n in range(3):
            for _attempt in range(10):  # what a client does when its request dies with a node
                try:
                    response = rpc(client, "session.turn", {"session_id": sid, "message": f"What is {n} + {n}?"})
                except httpx.HTTPError as exc:
                    failures.append(f"{sid}: {type(exc).__name__}")
                    continue
                try:
                    body = response.json()
                except ValueError:  # Serve's proxy answers a request whose replica died with the node in plain text
                    failures.append(f"{sid}: HTTP {response.status_code} {response.text[:120]!r}")
                    time.sleep(1)
                    continue
                if "result" in body:
                    answered[sid].append(body["result"])
                    break
                failures.append(f"{sid}: {body['error']['code']} {body['error']['message'][:120]}")
                time.sleep(1)  # the cluster notices the dead node and restarts what it hosted
            else:  # pytest.fail here would only end this thread: the test reports it below
                unanswered.append(f"session {sid} never answered turn {n}")
                return

    threads = [threading.Thread(target=converse, args=(sid,)) for sid in sessions]
    for t in threads:
        t.start()
    worker_nodes[victim].kill()  # under load: the first of these turns are in flight
    shutil.rmtree(data_dir, ignore_errors=True)  # and no node's local files matter either
    for t in threads:
        t.join(600)
    assert not any(t.is_alive() for t in threads)
    print(f"what clients met while the node died ({len(failures)}): {failures}")  # shown with -rP
    assert not unanswered, f"{unanswered}; the last failures: {failures[-8:]}"

    store = PgStore(pg_url)
    try:
        for sid in sessions:
            got = result_of(rpc(client, "session.get", {"session_id": sid}))
            # every answered turn is saved; a turn whose answer died with the node may be saved too
            assert got["turn"] >= len(answered[sid]) and got["status"] == "idle", got
            text, version = store.blocking(PgSessionStore(SessionState, store).row(sid))
            state = json.loads(text)
            said = [m["content"] for m in state["providers"]["conversation"] if m["role"] == "user"]
            for result in answered[sid]:
                assert result["answer"] is not None
            for n in range(3):
                assert f"What is {n} + {n}?" in said, (
                    f"session {sid}: stored turn {state['turn']} v{version}, conversation {state['providers']['conversation']}, "
                    f"answered turns {[r['turn'] for r in answered[sid]]}, get {got}"
                )
            for result in answered[sid]:
                trace_id = result["trace"][0]["trace_id"]
                assert store.blocking(PgRunIndex(store).get(trace_id)) is not None, (
                    f"run {trace_id} of session {sid} is missing from the run index"
                )
        for sid in moved:
            assert host_of(ray, sid) != victim, f"session {sid} still claims the dead node"
    finally:
        store.close()
    assert result_of(rpc(client, "agent.get", {"agent_id": "survivor"}))["name"] == "Survivor"
    assert result_of(rpc(client, "memory.get", {"memory_id": memory_id}))["title"] == "Kept"
    serve.delete(APP)
