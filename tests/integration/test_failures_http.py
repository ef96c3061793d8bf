"""Every strategy's answer to a failing provider (tests/unit/test_failures.py), run again through HTTP: the simulated model fails every call of the request
(`[[sim fault=500 times=50]]`); each strategy answers a classified provider error (-32013) with its
partial result and no internal URL, tree_of_thought included (its branches run as Ray tasks)."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.conftest import own_app, result_of, rpc

FAILING = "[[sim fault=500 times=50]] What is 6 * 7?"
STRATEGIES = {
    "self_consistency": {"samples": 3},
    "tree_of_thought": {"breadth": 2, "depth": 2},
    "refine": {"max_iterations": 2},
    "chain_of_thought": {},
}


@pytest.fixture(scope="module")
def failing_app(serve_base, simulator):
    enabled = list(STRATEGIES)
    with own_app(serve_base, simulator.url, "failures", reasoning={"enabled_strategies": enabled, "default_strategy": enabled[-1]}) as app:
        yield app[0]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_answers_a_classified_provider_error_with_its_partial_and_no_internal_url(failing_app, strategy, simulator):
    response = rpc(failing_app, "reasoning.execute", {"query": FAILING, "strategy": strategy, "strategy_config": STRATEGIES[strategy]})
    error = response.json()["error"]
    # the breaker may open during the storm: it is a provider error too, summarised the same way
    assert error["code"] == -32013 and error["data"]["error_type"] in {"provider_unavailable", "circuit_open"}, error
    assert error["data"]["strategy"] == strategy and error["data"]["trace_id"]
    assert {"tokens", "calls"} <= set(error["data"]["partial"])
    text = json.dumps(error)
    port = simulator.url.rsplit(":", 1)[1].split("/")[0]
    assert "127.0.0.1" not in text and port not in text and "/v1" not in text
    assert error["message"].startswith("the model provider")


def test_the_rest_mirror_answers_a_provider_failure_with_http_502(failing_app):
    response = failing_app.post("/v1/reasoning/execute", json={"query": FAILING, "strategy": "chain_of_thought"})
    assert response.status_code == 502 and response.json()["error"]["code"] == -32013


def test_counting_runs_starts_neither_the_memory_bank_nor_a_session_host_and_stats_get_still_counts_them(failing_app):
    """An application that never touches memory or sessions runs neither process (each is seconds of CPU to
    start): the runs above were counted in the replica, and the session gauge found no host to ask."""
    import ray

    from reasonray.actors.lifecycle import NAMESPACE

    time.sleep(1.5)  # past the replica's half-second flush of its run counts
    running = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE}
    assert "failures-registry" in running  # the names are those of this application's actors
    assert not {"failures-memory", "failures-session-host-0"} & running, running
    runs = result_of(rpc(failing_app, "stats.get"))["runs"]  # starts the bank, which gets the counts first
    assert runs["total"] >= len(STRATEGIES) + 1 and runs["errors"] >= len(STRATEGIES) + 1, runs
