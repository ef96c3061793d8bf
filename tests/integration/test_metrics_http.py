"""The service's own metrics on Ray's metrics endpoint, after a few requests through Serve."""

from __future__ import annotations

import re
import time

import httpx
import ray

from reasonray.kernel.telemetry import SPECS
from tests.integration.conftest import rpc

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<tags>[^}]*)\} (?P<value>\S+)$")


def scrape() -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        text = httpx.get(f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics", timeout=10).text
        for line in text.splitlines():
            if (m := SAMPLE.match(line)) is not None:
                tags = dict(re.findall(r'(\w+)="([^"]*)"', m["tags"]))
                samples.append((m["name"], tags, float(m["value"])))
    return samples


def total(samples, name: str, **tags: str) -> float:
    return sum(v for n, t, v in samples if n == name and all(t.get(k) == w for k, w in tags.items()))


def test_requests_tokens_llm_calls_bounded_context_memory_and_sessions_reach_the_metrics_endpoint(api):
    for _ in range(3):
        assert "result" in rpc(api, "reasoning.execute", {"query": "What is 12 * 12?", "strategy": "chain_of_thought"}).json()
    assert "error" in rpc(api, "reasoning.execute", {"query": "q", "strategy": "no_such"}).json()
    # a run that fails is counted under the strategy that ran, by cause (a budget: it cannot open the shared breaker)
    failed = rpc(api, "reasoning.execute", {"query": "What is 1 + 1?", "strategy": "refine", "budget": {"max_total_tokens": 5}}).json()
    assert failed["error"]["data"]["error_type"] == "budget_exceeded"
    assert (
        "result"
        in rpc(
            api,
            "reasoning.execute",
            {
                "query": "[[sim think=30000 answer=7]] Work it out.",
                "strategy": "bounded_context",
                "strategy_config": {"max_iterations": 10},
            },
        ).json()
    )
    assert "result" in rpc(api, "memory.retrieve", {"query": "multiplication", "workspace": "metrics-test"}).json()
    session = rpc(api, "session.create", {}).json()["result"]["session_id"]
    assert "result" in rpc(api, "session.turn", {"session_id": session, "message": "What is 2 + 2?"}).json()

    deadline = time.monotonic() + 90  # Ray exports user metrics every few seconds here (stack.METRICS_REPORT_INTERVAL_MS)
    wanted = [
        "ray_reasonray_requests_total",
        "ray_reasonray_llm_calls_total",
        "ray_reasoning_bounded_context_iterations_count",
        "ray_reasonray_memory_retrieval_latency_seconds_count",
        "ray_reasonray_active_sessions",
        "ray_reasonray_tokens_total",
        "ray_reasonray_runs_total",
    ]
    while True:
        samples = scrape()
        names = {n for n, _, _ in samples}
        sessions = max((v for n, _, v in samples if n == "ray_reasonray_active_sessions"), default=0)
        # wait for this test's own series: the shared application already counts earlier modules' requests
        if (
            all(w in names for w in wanted)
            and sessions >= 1
            and total(samples, "ray_reasonray_requests_total", method="reasoning.execute", strategy="none", status="strategy_unavailable")
            and total(samples, "ray_reasonray_run_latency_seconds_count", strategy="refine", status="budget_exceeded")
            and total(samples, "ray_reasoning_bounded_context_iterations_count")
        ):
            break
        assert time.monotonic() < deadline, f"missing after 90 s: {[w for w in wanted if w not in names]}"
        time.sleep(0.5)

    ok = total(samples, "ray_reasonray_requests_total", method="reasoning.execute", strategy="chain_of_thought", status="ok")
    assert ok >= 3
    assert total(samples, "ray_reasonray_requests_total", method="reasoning.execute", strategy="none", status="strategy_unavailable") >= 1
    assert total(samples, "ray_reasonray_requests_total", method="reasoning.execute", strategy="refine", status="budget_exceeded") >= 1
    assert total(samples, "ray_reasonray_runs_total", strategy="refine", agent="none", status="budget_exceeded") >= 1
    assert total(samples, "ray_reasonray_runs_total", strategy="chain_of_thought", status="ok") >= 3
    assert total(samples, "ray_reasonray_run_latency_seconds_count", strategy="refine", status="budget_exceeded") >= 1
    assert total(samples, "ray_reasonray_request_latency_seconds_count", method="reasoning.execute") >= 5
    assert total(samples, "ray_reasonray_tokens_total", strategy="chain_of_thought", kind="completion") > 0
    assert total(samples, "ray_reasonray_llm_calls_total", model="simulated") >= 4
    assert total(samples, "ray_reasoning_bounded_context_iterations_count") >= 1
    assert total(samples, "ray_reasoning_bounded_context_compute_savings_pct_sum") > 0
    assert any(n.startswith("ray_serve_") for n in names)  # beside Serve's own
    # every name we export is in the catalogue
    ours = {n for n in names if n.startswith("ray_reasonray_")}
    base = {re.sub(r"_(total|bucket|count|sum)$", "", n).removeprefix("ray_") for n in ours}
    assert base <= set(SPECS), base - set(SPECS)
