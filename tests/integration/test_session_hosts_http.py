"""Session hosts through the running service: many sessions share a few session-host processes, killing a host
mid-conversation loses nothing and runs no turn twice, a full host answers -32011 overloaded, and a
redeploy with other settings replaces the application's named actors (memories, sessions and their
ownership records land in the new data directory)."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import ray

from reasonray.actors import NAMESPACE
from reasonray.actors.session import host_index, host_name
from reasonray.api.access.auth import mint_token
from reasonray.api.access.tenancy import personal_workspace
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from tests.integration.conftest import deploy, own_app, result_of, rpc, settings_for
from tests.session_rows import stored_session

PRESTART = {"prestart": True}  # the hosts are what these tests watch: up from the deploy, as in production
SLOW_MS = 3000  # a model slow enough that a turn is surely in flight when the test acts, on a loaded machine too


@pytest.fixture(scope="module")
def slow_simulator():
    server = SimulatorServer(SimulatorSettings(port=0, ttft_ms=SLOW_MS)).start()
    yield server
    server.stop()


def retire(app_name: str) -> None:
    """Delete the app and its detached actors: they outlive the deployment by design, not the test."""
    from ray import serve

    serve.delete(app_name)
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == NAMESPACE and actor["name"].startswith(f"{app_name}-"):
            ray.kill(ray.get_actor(actor["name"], namespace=NAMESPACE), no_restart=True)


def hosts_of(app_name: str, count: int) -> list:
    return [ray.get_actor(host_name(app_name, i), namespace=NAMESPACE) for i in range(count)]


def new_session(client: httpx.Client) -> str:
    return result_of(rpc(client, "session.create", {"server_tools": ["calculator"]}))["session_id"]


def turn(client: httpx.Client, sid: str, message: str) -> dict:
    return result_of(rpc(client, "session.turn", {"session_id": sid, "message": message}))


def wait_routed(client: httpx.Client, deadline_s: float = 60) -> None:
    """Until the proxy routes to the app: right after another app was deleted it may answer 404 briefly."""
    deadline = time.monotonic() + deadline_s
    while client.get("/healthz").status_code == 404:
        assert time.monotonic() < deadline, "the app's route never appeared"
        time.sleep(0.2)


def wait_busy(*hosts, deadline_s: float = 30) -> tuple:
    """The first of `hosts` seen running a turn, and its stats."""
    deadline = time.monotonic() + deadline_s
    while True:
        for host, stats in zip(hosts, ray.get([h.stats.remote() for h in hosts]), strict=True):
            if stats["busy"]:
                return host, stats
        assert time.monotonic() < deadline, "no turn reached a host"
        time.sleep(0.05)


def test_many_sessions_share_a_few_host_processes(api):
    # the session's main application, as `reasonray serve` deploys it: config.toml's two hosts, started at deploy
    # time. Earlier tests' sessions may be live there too (or leave at their idle timeout meanwhile): the test
    # counts its own
    sids = [new_session(api) for _ in range(20)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i_sid: turn(api, i_sid[1], f"What is {i_sid[0]} + 1?")["answer"], enumerate(sids)))
    assert answers == [str(i + 1) for i in range(20)]
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("reasonray-session")]
    assert sorted(names) == ["reasonray-session-host-0", "reasonray-session-host-1"]  # no actor per session
    stats = [ray.get(h.stats.remote()) for h in hosts_of("reasonray", 2)]
    assert len({s["pid"] for s in stats}) == 2 and all(s["pid"] != os.getpid() for s in stats)
    ours = [sum(host_index(sid, 2) == i for sid in sids) for i in range(2)]
    assert all(n > 0 for n in ours) and all(s["live"] >= n for s, n in zip(stats, ours, strict=True))  # spread over both
    for sid in sids:  # each session is live on exactly the host its id hashes to
        on = [ray.get(h.is_live.remote(sid)) for h in hosts_of("reasonray", 2)]
        assert on == [i == host_index(sid, 2) for i in range(2)]
    for sid in sids:
        result_of(rpc(api, "session.close", {"session_id": sid}))


# slow suite: an application of its own with two prestarted hosts on a 3-s model (45 s of the default run); a host
# killed mid-session and the session resumed over HTTP is test_sessions_http.py's, a retried turn answered from the
# repository without a second model call tests/unit/test_session_hosting.py's
@pytest.mark.slow
def test_killing_a_host_mid_conversation_loses_nothing_and_runs_no_turn_twice(serve_base, slow_simulator):
    with own_app(serve_base, slow_simulator.url, "hostkill", sessions={"hosts": 2}, server=PRESTART) as (client, _):
        try:
            sids = [new_session(client) for _ in range(8)]
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda sid: turn(client, sid, "What is 1 + 1?"), sids))
                second = pool.map(lambda sid: turn(client, sid, "What is 2 + 2?"), sids)  # in flight now
                victim, stats = wait_busy(*hosts_of("hostkill", 2))  # whichever host a session of the wave hashed to
                pid = stats["pid"]
                os.kill(pid, signal.SIGKILL)  # the host crashes with turns in flight; Ray restarts it
                answers = list(second)
            assert [(a["turn"], a["answer"], a["status"]) for a in answers] == [(2, "4", "completed")] * 8
            assert ray.get(victim.stats.remote())["pid"] != pid
            for sid in sids:
                state = result_of(rpc(client, "session.get", {"session_id": sid}))
                assert (state["turn"], state["messages"], state["status"]) == (2, 4, "idle")  # two turns, each once
                assert [s["type"] for s in state["trace"]].count("TURN_STARTED") == 1

            # a retry of a saved turn (same request id) on the restarted host is answered from the repository
            sid = sids[0]
            host = hosts_of("hostkill", 2)[host_index(sid, 2)]
            started = time.monotonic()
            first = ray.get(host.turn.remote(sid, "What is 3 + 3?", "trace-r", "request-r"))
            retried = ray.get(host.turn.remote(sid, "What is 3 + 3?", "trace-r", "request-r"))
            assert retried == first and first["turn"] == 3
            assert time.monotonic() - started < 2 * SLOW_MS / 1000  # one model call, not two
            assert result_of(rpc(client, "session.get", {"session_id": sid}))["turn"] == 3
        finally:
            retire("hostkill")


# slow suite: an application of its own on a 3-s model (35 s); a full host refusing with the retry hint is
# tests/unit/test_session_hosting.py's, -32011 with its data on every surface tests/unit/test_doc_promises.py's
@pytest.mark.slow
def test_a_full_host_answers_overloaded_with_a_retry_hint(serve_base, slow_simulator):
    with own_app(serve_base, slow_simulator.url, "overload", sessions={"hosts": 1, "max_live_per_host": 1}, server=PRESTART) as (client, _):
        try:
            busy, waiting = new_session(client), new_session(client)
            answered: list[dict] = []
            running = threading.Thread(target=lambda: answered.append(turn(client, busy, "What is 5 + 5?")))
            running.start()
            wait_busy(*hosts_of("overload", 1))
            refused = rpc(client, "session.turn", {"session_id": waiting, "message": "What is 1 + 2?"}).json()["error"]
            assert refused["code"] == -32011 and refused["data"]["error_type"] == "overloaded"
            assert refused["data"]["retry_after_s"] > 0 and refused["data"]["session_id"] == waiting
            running.join()
            assert answered[0]["answer"] == "10"
            assert turn(client, waiting, "What is 1 + 2?")["answer"] == "3"  # the idle session made room
            assert result_of(rpc(client, "session.get", {"session_id": waiting}))["turn"] == 1  # the refused call did nothing
        finally:
            retire("overload")


# slow suite: two deployments with [auth] one after the other (45-55 s of the default run); the mechanism, an actor
# built from other settings replaced and one from the same kept, and every managed actor's fingerprint moving with
# the data directory are test_named_actors.py's, in the default run
@pytest.mark.slow
def test_a_redeploy_with_another_data_directory_replaces_the_named_actors(serve_base, simulator):
    first, second = (Path(tempfile.mkdtemp(prefix=f"reasonray-redeploy-{x}-")) for x in "ab")
    secret = "redeploy-secret-" + "z" * 32
    auth = {"jwt_secret": secret}  # ownership, limits and audit follow the deployment too
    one_runner = {"pool_size": 1}  # the host is what this test follows: one branch runner is enough
    one_host = {"hosts": 1}  # replaced like two would be (each start is seconds of CPU)
    lazy = {"prestart": False}  # the host starts with the first session; the runner and the task board never
    bearer = {"Authorization": "Bearer " + mint_token(secret, "alice", ["reasoner"], 600)}
    try:
        deploy(
            settings_for(simulator.url, data_dir=str(first), auth=auth, fanout=one_runner, sessions=one_host, server=lazy),
            "redeploy",
            "/redeploy",
        )
        with httpx.Client(base_url=f"{serve_base}/redeploy", timeout=120, headers=bearer) as client:
            wait_routed(client)
            item = {"title": "First", "description": "Stored in A.", "content": "A."}
            [in_a] = [i["id"] for i in result_of(rpc(client, "memory.store", {"items": [item]}))["stored"]]
            assert turn(client, new_session(client), "What is 2 + 3?")["answer"] == "5"  # A's host is up
            hosts = [ray.get(h.stats.remote())["pid"] for h in hosts_of("redeploy", 1)]
            owners_in_a = (first / "tenancy" / "owners.json").read_text()
            assert f"workspace:{personal_workspace('alice')}" in owners_in_a

            deploy(
                settings_for(simulator.url, data_dir=str(second), auth=auth, fanout=one_runner, sessions=one_host, server=lazy),
                "redeploy",
                "/redeploy",
            )
            # alice's personal workspace in B is hers before she stores anything in it
            assert result_of(rpc(client, "memory.retrieve", {"query": "Stored"}))["memories"] == []
            item = {"title": "Second", "description": "Stored in B.", "content": "B."}
            [in_b] = [i["id"] for i in result_of(rpc(client, "memory.store", {"items": [item]}))["stored"]]
            assert any((second / "chroma").glob("*.sqlite3"))  # the memories land in B
            assert rpc(client, "memory.get", {"memory_id": in_a}).json()["error"]["code"] == -32005  # A's bank is not B's
            assert result_of(rpc(client, "memory.get", {"memory_id": in_b}))["title"] == "Second"
            sid = new_session(client)
            assert stored_session(second / "sessions", sid) is not None and stored_session(first / "sessions", sid) is None
            assert turn(client, sid, "What is 6 + 1?")["answer"] == "7"  # served by hosts built for B
            owners_in_b = (second / "tenancy" / "owners.json").read_text()
            assert f"session:{sid}" in owners_in_b and f"workspace:{personal_workspace('alice')}" in owners_in_b
            assert (first / "tenancy" / "owners.json").read_text() == owners_in_a  # the old table is left alone
            assert sid in (second / "audit" / "audit.jsonl").read_text() and sid not in (first / "audit" / "audit.jsonl").read_text()
            assert not {ray.get(h.stats.remote())["pid"] for h in hosts_of("redeploy", 1)} & set(hosts)
    finally:
        retire("redeploy")
