"""Fan-out on the branch-runner pool over HTTP: warm before the first request, many branches in few
processes, and a bounded number of branches in flight (-32011 beyond it, nothing lost)."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
import ray

from reasonray.actors.ray_compat import actor_id_of
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings

from .conftest import own_app, result_of, rpc


@pytest.fixture(scope="module")
def slow_simulator():
    """Replies take about half a second: concurrent requests really overlap."""
    server = SimulatorServer(SimulatorSettings(port=0, ttft_ms=400, tokens_per_second=400)).start()
    yield server
    server.stop()


def execute(client, query: str, **params):
    return rpc(client, "reasoning.execute", {"query": query, "strategy": "self_consistency", "include_trace": True, **params})


def test_self_consistency_branches_share_a_warm_pool_of_few_processes(serve_base, slow_simulator):
    changes = {"fanout": {"pool_size": 2, "max_pool_size": 2}, "llm": {"cache": {"enabled": False}}, "server": {"prestart": True}}
    with own_app(serve_base, slow_simulator.url, "fanpool", **changes) as (client, _):
        health = client.get("/admin/health").json()["fanout"]  # before the first request: the pool is up and warm
        assert health["runners"] == 2 and health["in_flight"] == 0
        assert [r["actor_id"] for r in health["started"]] == health["actor_ids"]
        runners = {r["actor_id"]: r for r in health["started"]}
        for actor_id, runner in runners.items():  # live, named Ray actors in the application's namespace
            assert actor_id_of(ray.get_actor(runner["name"], namespace="reasonray")) == actor_id
            assert runner["name"].startswith("fanpool-branches-")

        queries = [f"What is {i} + {i}?" for i in range(8)]
        with concurrent.futures.ThreadPoolExecutor(len(queries)) as threads:
            runs = [result_of(r) for r in threads.map(lambda q: execute(client, q, strategy_config={"samples": 5}), queries)]

        branches = [e for run in runs for e in run["trace"] if e["type"] == "BRANCH"]
        assert len(branches) == 40 and all(b["label"] == "self_consistency.sample" for b in branches)
        assert {b["actor_id"] for b in branches} <= set(runners)  # every branch ran on the pool
        assert {b["pid"] for b in branches} <= {r["pid"] for r in runners.values()}  # in two processes
        assert len({b["task_id"] for b in branches}) == 40  # each its own Ray (actor) task
        assert [run["answer"] for run in runs] == [str(2 * i) for i in range(8)]
        assert client.get("/admin/health").json()["fanout"]["in_flight"] == 0


# slow suite: an application of its own on a 3-s model, refused requests sent again (50 s of the default run); the
# bound and its refusal are tests/unit/test_branch_pool.py's, -32011 and 503 + Retry-After on every surface
# tests/unit/test_doc_promises.py's and test_error_view.py's, branches on the pool over HTTP the test above
@pytest.mark.slow
def test_beyond_max_in_flight_a_request_is_refused_with_a_retry_hint_and_nothing_is_lost(serve_base, slow_simulator):
    changes = {
        "fanout": {"pool_size": 1, "max_pool_size": 1, "max_in_flight": 5, "retry_after_s": 0.5},
        "llm": {"cache": {"enabled": False}},
    }
    with own_app(serve_base, slow_simulator.url, "fanload", **changes) as (client, _):
        # `[server] prestart` off (the test applications' default): no runner until the first fan-out needs one
        assert client.get("/admin/health").json()["fanout"]["runners"] == 0
        queries = [f"What is {i} * 3?" for i in range(6)]
        with concurrent.futures.ThreadPoolExecutor(len(queries)) as threads:
            first = list(threads.map(lambda q: execute(client, q, strategy_config={"samples": 5}).json(), queries))
        refused = [q for q, body in zip(queries, first, strict=True) if "error" in body]
        assert refused, "6 concurrent 5-branch requests on a bound of 5 branches: some must be refused"
        for body in first:
            if "error" in body:
                error = body["error"]
                assert error["code"] == -32011 and error["data"]["error_type"] == "overloaded"
                assert error["data"]["retry_after_s"] == 0.5 and error["data"]["max_in_flight"] == 5
        answers = {q: body["result"]["answer"] for q, body in zip(queries, first, strict=True) if "result" in body}
        assert client.get("/admin/health").json()["fanout"]["runners"] == 1  # started by the first, shared by all
        for query in refused:  # the hint is honest: sent again one at a time, each succeeds
            time.sleep(0.5)
            answers[query] = result_of(execute(client, query, strategy_config={"samples": 5}))["answer"]
        assert answers == {q: str(3 * i) for i, q in enumerate(queries)}
        assert client.get("/admin/health").json()["fanout"]["in_flight"] == 0

        # the REST mirror says the same with HTTP 503 and Retry-After
        with concurrent.futures.ThreadPoolExecutor(6) as threads:
            calls = [
                threads.submit(client.post, "/v1/reasoning/execute", json={"query": q, "strategy": "self_consistency"}) for q in queries
            ]
            statuses = [c.result() for c in calls]
        busy = [r for r in statuses if r.status_code == 503]
        assert busy and all(r.headers["Retry-After"] == "1" and r.json()["error"]["code"] == -32011 for r in busy)
        assert all(r.status_code in (200, 503) for r in statuses)
