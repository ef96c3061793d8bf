"""The slow suite (`make test-slow`): a soak of the running service under mixed concurrent load.

For REASONRAY_SOAK_S seconds (default 120), clients in threads drive the real stack (Ray Serve over
HTTP, session hosts, the memory bank actor, Chroma on disk, the simulated model over HTTP): sessions
with server-tool turns and client-tool hand-offs, and reasoning.execute across strategies, some
memory-aware and learning. Afterwards nothing failed, every answer is right, every session holds
exactly the turns it was sent, idle sessions leave their hosts' memory (no leaks), and the bank holds
what the learning runs stored. Throughput and latency percentiles are printed (`-s`).
"""

from __future__ import annotations

import itertools
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray

from reasonray.actors import NAMESPACE
from tests.client_tools import WEATHER
from tests.integration.conftest import own_app, result_of, rpc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SOAK_S = float(os.environ.get("REASONRAY_SOAK_S", "120"))
CLIENTS = 6
IDLE_S = 4
STRATEGIES = ["chain_of_thought", "self_consistency", "tree_of_thought", "refine"]


class Load:
    """What the clients did: latencies per operation, failures, sessions and their turn counts."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: dict[str, list[float]] = {}
        self.failures: list[str] = []
        self.sessions: dict[str, int] = {}
        self.learned = 0
        self.executions = itertools.count()  # rotates the strategies over all executions

    def timed(self, name, client, method, params):
        started = time.perf_counter()
        response = rpc(client, method, params)
        elapsed = (time.perf_counter() - started) * 1000
        body = response.json()
        with self.lock:
            self.latencies.setdefault(name, []).append(elapsed)
            if "error" in body:
                self.failures.append(f"{name}: {body['error']}")
        return body.get("result")

    def expect(self, condition, what):
        if not condition:
            with self.lock:
                self.failures.append(what)


def conversation(load: Load, client, worker: int, round_: int) -> None:
    sid = load.timed("session.create", client, "session.create", {"server_tools": ["calculator"], "client_tools": [WEATHER]})["session_id"]
    a, b = worker + 2, round_ + 3
    first = load.timed(
        "session.turn", client, "session.turn", {"session_id": sid, "message": f'[[sim call=calculator {{"expression": "{a} * {b}"}}]]'}
    )
    load.expect(first and first["answer"] == str(a * b), f"{sid} turn 1: {first}")
    handed = load.timed(
        "session.turn", client, "session.turn", {"session_id": sid, "message": '[[sim call=get_weather {"city": "Porto"}]]'}
    )
    pending = handed["pending_tool_calls"] if handed else []
    load.expect(handed and handed["status"] == "awaiting_client_tools" and len(pending) == 1, f"{sid} turn 2: {handed}")
    if pending:
        resumed = load.timed(
            "session.resume",
            client,
            "session.resume",
            {"session_id": sid, "tool_results": [{"tool_call_id": pending[0]["tool_call_id"], "content": f"Rain {worker}"}]},
        )
        load.expect(resumed and resumed["answer"] == f"Rain {worker}", f"{sid} resume: {resumed}")
    with load.lock:
        load.sessions[sid] = 2


def execute(load: Load, client, worker: int, round_: int) -> None:
    strategy = STRATEGIES[next(load.executions) % len(STRATEGIES)]
    a, b = 11 + worker, 13 + round_
    learn = round_ % 3 == 0
    params = {
        "query": f"What is {a} * {b}?",
        "strategy": strategy,
        "memory": {"workspace": "soak", "learn": learn, "expected_answer": str(a * b), "task_id": f"w{worker}-r{round_}"},
    }
    result = load.timed(f"execute/{strategy}", client, "reasoning.execute", params)
    load.expect(result and result["answer"] == str(a * b), f"{strategy} {a} * {b}: {result and result['answer']}")
    if result and learn:
        load.expect(result["memory"]["stored"] and result["memory"]["outcome"] == "success", f"learning: {result['memory']}")
        with load.lock:
            load.learned += 1


def live_sessions(app: str) -> int:
    """Sessions the app's hosts hold in memory; and no actor of the app's is anything but a host."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]
    hosts = [n for n in names if n.startswith(f"{app}-session-")]
    assert all(n.startswith(f"{app}-session-host-") for n in hosts), hosts
    return sum(ray.get(ray.get_actor(n, namespace=NAMESPACE).stats.remote())["live"] for n in hosts)


def test_mixed_load_for_minutes_fails_nothing_loses_nothing_and_leaks_no_actors(serve_base, simulator):
    with own_app(serve_base, simulator.url, "soak", sessions={"idle_timeout_s": IDLE_S}) as (client, _):
        load = Load()
        stop = time.monotonic() + SOAK_S

        def worker(index: int) -> int:
            rounds = 0
            while time.monotonic() < stop:
                (conversation if (index + rounds) % 2 else execute)(load, client, index, rounds)
                rounds += 1
            return rounds

        started = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            rounds = sum(pool.map(worker, range(CLIENTS)))
        wall = time.perf_counter() - started

        requests = sum(len(v) for v in load.latencies.values())
        print(f"\nsoak: {CLIENTS} clients, {wall:.0f} s, {rounds} rounds, {requests} requests, {requests / wall:.1f} req/s")
        for name, values in sorted(load.latencies.items()):
            q = statistics.quantiles(values, n=20) if len(values) > 1 else values * 19
            print(f"  {name:28} n={len(values):5}  p50 {statistics.median(values):7.1f} ms  p95 {q[18]:7.1f} ms")
        assert load.failures == [], load.failures[:10]
        assert load.sessions and load.learned and requests >= CLIENTS * 4
        assert {f"execute/{s}" for s in STRATEGIES} <= set(load.latencies)

        for sid, turns in load.sessions.items():
            state = result_of(rpc(client, "session.get", {"session_id": sid}))
            assert state["status"] == "idle" and state["turn"] == turns and state["messages"] >= 2 * turns, state

        deadline = time.monotonic() + IDLE_S * 10
        while live_sessions("soak") and time.monotonic() < deadline:
            time.sleep(1)
        assert live_sessions("soak") == 0, "idle sessions were not dropped from their hosts"

        stats = result_of(rpc(client, "stats.get"))
        assert stats["traces"]["success"] == load.learned
        workspaces = {w["workspace"]: w for w in result_of(rpc(client, "memory.list_workspaces"))["workspaces"]}
        assert workspaces["soak"]["traces"] == load.learned and workspaces["soak"]["memories"] >= load.learned
