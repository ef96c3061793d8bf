"""GET /metrics and GET /health on the API port: what a Prometheus scraper and a liveness probe see."""

from __future__ import annotations

import shutil
import subprocess
import time

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from tests.docs_examples import blocks
from tests.integration.conftest import result_of, rpc

README_URL = "http://127.0.0.1:8000"

RUNS = {
    "chain_of_thought": {"query": "What is 12 * 12?"},
    "bounded_context": {"query": "[[sim think=30000 answer=7]] Work it out.", "strategy_config": {"max_iterations": 10}},
    "tree_of_thought": {"query": "What is 12 * 12?", "strategy_config": {"breadth": 2, "beam_width": 1, "depth": 2}},
    "self_consistency": {"query": "What is 12 * 12?", "strategy_config": {"samples": 3}},
    "react": {"query": "What is 12 * 12?"},
    "refine": {"query": "What is 12 * 12?"},
    "matts": {"query": "What is 12 * 12?"},
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page, parsed by prometheus_client (as a scraper would)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(parsed, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in parsed.items() if n == name and all(dict(ls).get(k) == w for k, w in labels.items()))


def test_metrics_serves_every_strategy_and_the_blueprint_names_in_prometheus_text(api):
    for strategy, params in RUNS.items():
        run = result_of(rpc(api, "reasoning.execute", {"strategy": strategy, **params}))
        assert run["strategy_used"] == strategy
    deadline = time.monotonic() + 90  # Ray exports user metrics every few seconds here (stack.METRICS_REPORT_INTERVAL_MS)
    while True:
        response = api.get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        parsed = samples(response.text)
        done = [s for s in RUNS if value(parsed, "reasonray_requests_total", method="reasoning.execute", strategy=s, status="ok") >= 1]
        if len(done) == len(RUNS) and value(parsed, "reasoning_bounded_context_requests_total", status="ok") >= 1:
            break
        assert time.monotonic() < deadline, f"after 90 s only {done} in /metrics"
        time.sleep(0.5)
    assert value(parsed, "reasoning_bounded_context_duration_seconds_count") >= 1
    assert value(parsed, "reasoning_bounded_context_duration_seconds_sum") > 0
    assert value(parsed, "reasoning_bounded_context_tokens_total") > 0
    assert value(parsed, "reasoning_bounded_context_compute_savings_pct_count") >= 1
    assert value(parsed, "reasoning_bounded_context_iterations_count") >= 1
    assert value(parsed, "reasoning_bounded_context_iterations_bucket", le="+Inf") >= 1
    assert value(parsed, "reasonray_llm_calls_total", model="simulated") >= len(RUNS)
    # cluster totals under our names only: no Ray prefix, no per-process tags, nothing of Serve's
    names = {n for n, _ in parsed}
    assert not any(n.startswith("ray_") for n in names)
    assert not any(k[:1].isupper() for _, ls in parsed for k, _ in ls)


def test_the_page_passes_promtool_and_the_openmetrics_parser(api):
    assert result_of(rpc(api, "reasoning.execute", {"strategy": "bounded_context", **RUNS["bounded_context"]}))
    deadline = time.monotonic() + 90
    while "reasonray_llm_latency_seconds_bucket" not in (text := api.get("/metrics").text):
        assert time.monotonic() < deadline, "no LLM latency histogram in /metrics after 90 s"
        time.sleep(0.5)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (scripts/setup.sh does)"
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0 and lint.stdout == lint.stderr == "", lint.stdout + lint.stderr
    parsed = samples(text)
    assert not any(k.startswith("otel_scope") for _, ls in parsed for k, _ in ls)
    bounds = [float(dict(ls)["le"]) for (n, ls), _ in parsed.items() if n == "reasonray_llm_latency_seconds_bucket"]
    assert bounds[:3] == [0.005, 0.01, 0.025] and bounds[-1] == float("inf")
    om = api.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"})
    assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(om.text)}
    assert families["reasonray_llm_calls"].type == "counter" and families["reasonray_llm_latency_seconds"].type == "histogram"
    # one family per metric: the bounded-context series exist once, under their own names
    assert not any(name.startswith("reasonray_bounded_context") for name in families)


def test_health_is_the_public_liveness_probe(api):
    health, healthz = api.get("/health"), api.get("/healthz")
    assert health.status_code == healthz.status_code == 200
    assert health.json()["status"] == healthz.json()["status"] == "ok"


def test_the_operations_page_examples_run_against_the_service(api, capsys):
    for block in blocks("docs/operations.md", "python"):
        exec(compile(block.replace(README_URL, str(api.base_url).rstrip("/")), "docs/operations.md", "exec"), {})
    assert capsys.readouterr().out.startswith("reasoning_bounded_context_requests_total{")
