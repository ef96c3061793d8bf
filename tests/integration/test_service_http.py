"""The real stack: a local Ray cluster, Ray Serve over HTTP, the registry and cache actors, and the
simulated model reached through the official openai client."""

from __future__ import annotations

import time

import httpx
import pytest

from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.kernel.config import ConfigError
from tests.integration.conftest import LIGHT_APP, deploy, rpc, settings_for


def test_healthz_says_ok_only_and_the_operator_endpoint_reports_ray_registry_and_llm(api):
    assert api.get("/healthz").json() == {"status": "ok"}
    body = api.get("/admin/health").json()
    assert body["status"] == "ok" and body["ray"]["initialized"]
    assert body["registry"] == {
        "ok": True,
        "enabled": ["chain_of_thought", "bounded_context", "tree_of_thought", "self_consistency", "react", "refine", "matts"],
        "default": "chain_of_thought",
    }
    assert body["llm"]["reachable"] and body["llm"]["simulated"] and body["llm"]["breaker"] == "closed"


def test_execute_answers_with_metrics_and_the_trace_id_in_body_and_header(api):
    response = rpc(api, "reasoning.execute", {"query": "What is 17 * 23?"})
    result = response.json()["result"]
    assert result["answer"] == "391"
    assert response.headers["x-trace-id"] == result["trace_id"]
    metrics = result["metrics"]
    assert metrics["simulated"] and metrics["model"] == "simulated" and metrics["llm_calls"] == 1
    assert metrics["total_tokens"] == metrics["prompt_tokens"] + metrics["completion_tokens"] > 0
    assert result["resolution"]["config"]["max_tokens"] == 32768  # config.toml's default_max_tokens


def test_a_caller_trace_id_is_kept(api):
    response = api.post(
        "/rpc",
        json={"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "What is 2 + 2?"}, "id": 1},
        headers={"X-Trace-Id": "caller-trace-0001"},
    )
    assert response.json()["result"]["trace_id"] == "caller-trace-0001"


@pytest.mark.parametrize(
    "body,code",
    [
        (b"{oops", -32700),
        (b'{"jsonrpc": "1.0", "method": "reasoning.execute", "id": 1}', -32600),
        (b'{"jsonrpc": "2.0", "method": "reasoning.unknown", "id": 1}', -32601),
        (b'{"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": ""}, "id": 1}', -32602),
        (b'{"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "q", "strategy": "tree_of_light"}, "id": 1}', -32002),
        (
            b'{"jsonrpc": "2.0", "method": "reasoning.bounded_context", "params": {"query": "[[sim think=30000 answer=7]]"}, "id": 1}',
            -32001,
        ),
    ],
)
def test_error_codes_over_http(api, body, code):
    response = api.post("/rpc", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200 and response.json()["error"]["code"] == code


def test_invalid_params_carry_the_pydantic_details(api):
    error = rpc(api, "reasoning.execute", {"query": "q", "strategy_config": {"max_tokens": -1}}).json()["error"]
    assert error["code"] == -32602 and error["data"]["errors"][0]["loc"] == ["max_tokens"]


def test_transient_faults_are_retried_and_counted(api):
    result = rpc(api, "reasoning.execute", {"query": "[[sim fault=500 times=2]] What is 6 * 7?"}).json()["result"]
    assert result["answer"] == "42" and result["metrics"]["retries"] == 2


def test_a_provider_that_keeps_failing_is_a_provider_error_naming_the_cause(api):
    error = rpc(api, "reasoning.execute", {"query": "[[sim fault=429 times=10]] What is 1 + 1?"}).json()["error"]
    assert error["code"] == -32013 and error["data"]["error_type"] == "provider_unavailable"
    assert error["data"]["attempts"] == 4 and "HTTP 429" in error["message"]  # [llm.retry] max_attempts: 4 by default


def test_notifications_and_batches(api):
    assert rpc(api, "reasoning.execute", {"query": "What is 3 + 3?"}, id=None).status_code == 204
    batch = [
        {"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "What is 3 * 3?"}, "id": "a"},
        {"jsonrpc": "2.0", "method": "reasoning.strategies", "id": "b"},
        {"jsonrpc": "2.0", "method": "nope", "id": "c"},
    ]
    responses = {r["id"]: r for r in api.post("/rpc", json=batch).json()}
    assert responses["a"]["result"]["answer"] == "9"
    assert responses["b"]["result"]["strategies"][0]["name"] == "chain_of_thought"
    assert responses["c"]["error"]["code"] == -32601


def test_repeatable_calls_hit_the_shared_cache_and_sampled_calls_do_not(api):
    query = {"query": "What is 123 + 456?"}
    first = rpc(api, "reasoning.execute", query).json()["result"]["metrics"]
    second = rpc(api, "reasoning.execute", query).json()["result"]["metrics"]
    assert (first["cache_hits"], second["cache_hits"]) == (0, 1)
    sampled = {"query": "What is 123 + 456?", "strategy_config": {"temperature": 0.9}}
    hits = [rpc(api, "reasoning.execute", sampled).json()["result"]["metrics"]["cache_hits"] for _ in range(2)]
    assert hits == [0, 0]
    stats = rpc(api, "stats.get", {}).json()["result"]["llm_cache"]
    assert stats["hits"] >= 1 and stats["entries"] >= 1


def test_rest_mirrors_and_openapi(api):
    response = api.post("/v1/reasoning/execute", json={"query": "What is 10 / 4?"})
    assert response.status_code == 200 and response.json()["answer"] == "2.5"
    error = api.post("/v1/reasoning/execute", json={"query": "q", "strategy": "tree_of_light"})
    assert error.status_code == 404 and error.json()["error"]["code"] == -32002
    assert api.get("/v1/strategies").json()["default_strategy"] == "chain_of_thought"
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/rpc", "/healthz", "/v1/reasoning/execute"} <= set(paths)
    assert api.get("/docs").status_code == 200


def test_zero_enabled_strategies_starts_and_explains(serve_base, simulator):
    settings = settings_for(simulator.url, **LIGHT_APP, reasoning={"enabled_strategies": [], "default_strategy": None})
    deploy(settings, "empty", "/empty")
    with httpx.Client(base_url=serve_base, timeout=60) as client:
        assert client.get("/empty/admin/health").json()["registry"]["enabled"] == []
        error = rpc(client, "reasoning.execute", {"query": "What is 1 + 1?"}, path="/empty/rpc").json()["error"]
    assert error["code"] == -32002 and "no strategies are enabled" in error["message"]


def test_a_half_configured_app_is_refused_before_deploying(simulator):
    from reasonray.serve_app import build_app

    settings = settings_for(simulator.url)
    settings["reasoning"]["strategies"] = {"chain_of_thought": {"default_max_tokens": "many"}}
    with pytest.raises(ConfigError, match="default_max_tokens"):
        build_app({"settings": settings})


# slow suite: an application of its own (45 s of the default run); the breaker's states, its fast failure without a
# call and its recovery are tests/unit/test_resilience.py's and tests/unit/test_llm_stack.py's (over HTTP to the
# simulated model), its code and error type tests/unit/test_error_tree.py's
@pytest.mark.slow
def test_the_breaker_opens_fails_fast_and_recovers(serve_base):
    faulty = SimulatorServer(SimulatorSettings(port=0)).start()
    try:
        settings = settings_for(
            faulty.url,
            **LIGHT_APP,
            llm={
                "retry": {"max_attempts": 1},
                # a window wide enough that both failures count on a loaded machine (two calls through Serve
                # took over config.toml's 2 s there, and the breaker never saw two calls in one window)
                "circuit_breaker": {"minimum_calls": 2, "window_s": 60, "reset_timeout_s": 2, "half_open_probes": 1},
                "cache": {"enabled": False},
            },
        )
        deploy(settings, "breaker", "/breaker")
        with httpx.Client(base_url=serve_base, timeout=60) as client:
            client.post(f"{faulty.url}/sim/faults", json={"rate": 1.0, "kinds": ["500"]})
            for _ in range(2):
                body = rpc(client, "reasoning.execute", {"query": "What is 1 + 1?"}, path="/breaker/rpc").json()
                assert "error" in body, body
                error = body["error"]
                assert error["data"]["error_type"] == "provider_unavailable"
            seen = client.get(f"{faulty.url}/sim/stats").json()["requests"]
            started = time.perf_counter()
            error = rpc(client, "reasoning.execute", {"query": "What is 1 + 1?"}, path="/breaker/rpc").json()["error"]
            assert error["code"] == -32013 and error["data"]["error_type"] == "circuit_open"
            assert time.perf_counter() - started < 1.0
            assert client.get(f"{faulty.url}/sim/stats").json()["requests"] == seen  # failed fast, no call
            assert client.get("/breaker/admin/health").json()["llm"]["breaker"] == "open"
            client.post(f"{faulty.url}/sim/faults", json={"rate": 0.0})
            time.sleep(error["data"]["retry_after_s"] + 0.2)
            result = rpc(client, "reasoning.execute", {"query": "What is 1 + 1?"}, path="/breaker/rpc").json()["result"]
            assert result["answer"] == "2"
            assert client.get("/breaker/admin/health").json()["llm"]["breaker"] == "closed"
    finally:
        faulty.stop()
