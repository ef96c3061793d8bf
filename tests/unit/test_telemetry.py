"""The service's own metrics: the catalogue, and what the API, the LLM stack, runs and the memory bank record."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from reasonray.api.app import local_dispatcher
from reasonray.api.surfaces.prometheus import merge
from reasonray.gateway.cache import CachingLLM, LRUTTLCache
from reasonray.gateway.errors import TransientProviderError
from reasonray.gateway.metered import MeteredLLM
from reasonray.gateway.protocol import LLMRequest, Message
from reasonray.gateway.resilience import CircuitBreaker, ResilientLLM, RetryPolicy
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import FunctionLLM
from reasonray.kernel.config import ReasoningSettings
from reasonray.kernel.telemetry import CATALOGUE
from reasonray.memory.service import BankService
from tests.docs_examples import blocks
from tests.unit.memory_harness import make_bank
from tests.unit.recording_metrics import RecordingMetrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "reasonray.json"


def ask(text: str, **kw) -> LLMRequest:
    return LLMRequest(messages=(Message(role="user", content=text),), **kw)


def test_the_catalogue_is_valid_for_ray_and_prometheus():
    for spec in CATALOGUE:
        assert re.fullmatch(r"(reasonray|reasoning_bounded_context)_[a-z0-9_]+", spec.name), spec.name  # ours, or bounded context's own
        assert not spec.name.endswith("_total"), "Ray adds _total to counters"
        if spec.kind == "histogram":
            assert spec.boundaries and all(b > 0 for b in spec.boundaries), spec.name  # Ray refuses 0
            assert list(spec.boundaries) == sorted(set(spec.boundaries)), spec.name
    with pytest.raises(ValueError, match="takes tags"):
        RecordingMetrics().record("reasonray_requests", method="x")
    with pytest.raises(KeyError):
        RecordingMetrics().record("reasonray_nope")
    with pytest.raises(ValueError, match="cannot go down"):
        RecordingMetrics().record("reasonray_llm_retries", -1, model="m")


def test_ray_metrics_take_a_zero_count_and_never_fail_the_caller():
    """A run that failed before its first token records 0 tokens: Ray's Counter refuses 0, we skip it."""
    from structlog.testing import capture_logs

    from reasonray.actors.metrics import RayMetrics

    metrics = RayMetrics()
    with capture_logs() as logs:
        metrics.record("reasonray_tokens", 0, strategy="chain_of_thought", agent="none", kind="prompt")
        metrics.record("reasonray_run_tokens", 0, strategy="chain_of_thought", agent="none")
        metrics.record("reasonray_active_sessions", 0)
        metrics.record("reasonray_tokens", 12, strategy="chain_of_thought", agent="none", kind="prompt")
    # nothing went to the best-effort path: a zero count is skipped, not refused by Ray
    assert [e for e in logs if e["event"] == "metrics.not_recorded"] == []
    # and the best-effort path is real: what Ray refuses is logged, the caller is not failed
    with capture_logs() as logs:
        metrics._objects["reasonray_active_sessions"] = None  # a broken metric object
        metrics.record("reasonray_active_sessions", 3)
    assert [e["metric"] for e in logs if e["event"] == "metrics.not_recorded"] == ["reasonray_active_sessions"]


def served_by_get_metrics() -> dict[str, set[str]]:
    """What GET /metrics serves for the whole catalogue: each sample name with its label names. Built the way
    the endpoint builds it, by merging a Ray export page (with Ray's prefix and per-process labels)."""
    ray_labels = {"SessionName": "session_1", "NodeAddress": "10.0.0.1", "WorkerId": "w1", "Component": "core_worker"}
    lines = []
    for spec in CATALOGUE:
        name = f"ray_{spec.name}"
        labels = ",".join(f'{k}="{v}"' for k, v in {**ray_labels, **dict.fromkeys(spec.tags, "x")}.items())
        lines.append(f"# TYPE {spec.exported} {spec.kind}")
        if spec.kind == "histogram":
            lines += [f'{name}_bucket{{{labels},le="+Inf"}} 1', f"{name}_count{{{labels}}} 1", f"{name}_sum{{{labels}}} 1"]
        else:
            lines.append(f"{spec.exported}{{{labels}}} 1")
    served: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(merge(["\n".join(lines) + "\n"]).decode()):
        for sample in family.samples:
            served.setdefault(sample.name, set()).update(sample.labels)
    return served


def test_every_metric_is_documented_and_the_dashboard_charts_what_get_metrics_serves():
    """The dashboard works against a Prometheus scraping GET /metrics: every metric it queries is one the
    endpoint serves (our names, no `ray_` prefix), every label it filters or groups by is one those metrics
    carry (no Ray per-process labels), and every catalogue metric is charted."""
    operations = (REPO / "docs" / "operations.md").read_text()
    dashboard = json.loads(DASHBOARD.read_text())
    served = served_by_get_metrics()
    assert not any(name.startswith("ray_") for name in served)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    charted = set()
    for expr in exprs:
        names = set(re.findall(r"\b(?:ray|reasonray|reasoning)_[a-z0-9_]+", expr))
        assert names and names <= set(served), (expr, sorted(names - set(served)))
        charted |= names
        labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"", expr))
        labels |= {label.strip() for group in re.findall(r"\bby \(([^)]*)\)", expr) for label in group.split(",")}
        labels |= set(re.findall(r"label_values\([a-z0-9_]+, *([A-Za-z_]+)\)", expr))
        carried = set.union(*(served[n] for n in names)) | {"job", "instance"}  # Prometheus's own scrape labels
        assert labels <= carried, (expr, sorted(labels - carried))
    scrape = yaml.safe_load(blocks("docs/operations.md", "yaml")[0])["scrape_configs"][0]  # the target the docs give it
    assert scrape["metrics_path"] == "/metrics" and scrape["job_name"] == "reasonray"
    for spec in CATALOGUE:
        assert f"`{spec.exported}`" in operations, spec.exported
        assert any(n == spec.name or n.removeprefix(f"{spec.name}_") in SUFFIXES for n in charted), spec.name


SUFFIXES = {"total", "bucket", "sum", "count"}


async def call(rpc, method, params):
    payload, _ = await rpc.handle_payload({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, None)
    return payload


async def test_the_api_counts_requests_by_method_strategy_and_status_and_runs_by_tokens():
    metrics = RecordingMetrics()
    rpc = local_dispatcher(ReasoningSettings(enabled_strategies=["chain_of_thought", "bounded_context"]), SimulatedLLM(), metrics=metrics)
    assert "result" in await call(rpc, "reasoning.execute", {"query": "What is 6 * 7?", "strategy": "chain_of_thought"})
    assert "error" in await call(rpc, "reasoning.execute", {"query": "q", "strategy": "tree_of_thought"})
    assert "error" in await call(rpc, "reasoning.execute", {"query": ""})
    assert "error" in await call(rpc, "made.up", {})
    assert "result" in await call(
        rpc,
        "reasoning.execute",
        {"query": "[[sim think=30000 answer=7]] go", "strategy": "bounded_context", "strategy_config": {"max_iterations": 10}},
    )
    statuses = [(t["method"], t["strategy"], t["status"]) for n, _, t in metrics.records if n == "reasonray_requests"]
    assert statuses == [
        ("reasoning.execute", "chain_of_thought", "ok"),
        ("reasoning.execute", "none", "strategy_unavailable"),
        ("reasoning.execute", "none", "invalid_params"),
        ("unknown", "none", "method_not_found"),  # a caller's made-up name never becomes a series
        ("reasoning.execute", "bounded_context", "ok"),
    ]
    assert len(metrics.values("reasonray_request_latency_seconds")) == 5
    assert metrics.total("reasonray_tokens", strategy="chain_of_thought", kind="completion") > 0
    assert metrics.values("reasoning_bounded_context_iterations")[0] >= 2
    assert 0 < metrics.values("reasoning_bounded_context_compute_savings_pct")[0] <= 100


async def test_a_run_made_as_an_agent_tags_its_tokens_calls_runs_and_latency_with_the_agent(tmp_path):
    """Runs, tokens, calls and latency name the strategy and the agent (or `none`), failed runs too."""
    metrics = RecordingMetrics()
    settings = ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought")
    rpc = local_dispatcher(settings, SimulatedLLM(), metrics=metrics, data_dir=tmp_path)
    card = {"id": "planner", "name": "Planner", "capabilities": ["reasoning.strategy.chain_of_thought"]}
    assert "result" in await call(rpc, "agent.register", card)
    assert "result" in await call(rpc, "reasoning.execute", {"query": "What is 6 * 7?", "agent_id": "planner"})
    assert "result" in await call(rpc, "reasoning.execute", {"query": "What is 6 * 7?"})
    failed = await call(rpc, "reasoning.execute", {"query": "What is 6 * 7?", "agent_id": "planner", "budget": {"max_total_tokens": 5}})
    assert failed["error"]["data"]["error_type"] == "budget_exceeded"
    for agent, runs in (("planner", 2), ("none", 1)):
        assert metrics.total("reasonray_tokens", strategy="chain_of_thought", agent=agent, kind="prompt") > 0
        assert len(metrics.values("reasonray_run_tokens", strategy="chain_of_thought", agent=agent)) == runs
        assert len(metrics.values("reasonray_run_llm_calls", strategy="chain_of_thought", agent=agent)) == runs
        assert len(metrics.values("reasonray_run_latency_seconds", strategy="chain_of_thought", agent=agent)) == runs
    assert metrics.values("reasonray_runs", strategy="chain_of_thought", agent="planner", status="budget_exceeded") == [1]
    assert {t["agent"] for n, _, t in metrics.records if n == "reasonray_tokens"} == {"planner", "none"}


async def test_the_llm_stack_counts_calls_cache_hits_retries_failures_and_the_breaker():
    metrics = RecordingMetrics()
    failures = iter(
        [
            TransientProviderError("503", status_code=503),
            None,
            TransientProviderError("503", status_code=503),
            TransientProviderError("503", status_code=503),
        ]
    )

    def reply(request):
        error = next(failures, None)
        return error if error is not None else "<answer>1</answer>"

    breaker = CircuitBreaker(minimum_calls=4, reset_timeout_s=60)  # a's fault and success, b's two faults: 75%
    resilient = ResilientLLM(FunctionLLM(reply, model="m"), RetryPolicy(2, 0, 0, 0), breaker)
    llm = MeteredLLM(CachingLLM(resilient, LRUTTLCache()), metrics, caching=True, breaker=breaker, endpoint="e")
    await llm.complete(ask("a"))  # fails once, retried: ok
    await llm.complete(ask("a"))  # cached
    with pytest.raises(Exception):
        await llm.complete(ask("b"))  # fails twice: the breaker opens
    with pytest.raises(Exception):
        await llm.complete(ask("c", temperature=0.9))  # sampled: not a cache question; fails fast, breaker open
    calls = [t["outcome"] for n, _, t in metrics.records if n == "reasonray_llm_calls"]
    assert calls == ["ok", "cached", "error", "error"]
    assert metrics.total("reasonray_llm_retries") == 1
    assert metrics.total("reasonray_llm_cache_hits") == 1 and metrics.total("reasonray_llm_cache_misses") == 2
    assert [t["error"] for n, _, t in metrics.records if n == "reasonray_llm_failures"] == ["ProviderUnavailableError", "CircuitOpenError"]
    assert metrics.values("reasonray_llm_breaker_state", endpoint="e")[-1] == 2  # open
    assert len(metrics.values("reasonray_llm_latency_seconds")) == 1  # only the call that reached the provider and succeeded


def test_the_memory_bank_reports_retrieval_latency_and_its_size(tmp_path):
    from reasonray.memory.items import MemoryItem

    metrics = RecordingMetrics()
    service = BankService(make_bank(tmp_path), metrics)
    item = MemoryItem(
        title="Check units",
        description="Convert before adding.",
        content="Convert all quantities first.",
        workspace="w1",
        source_type="manual",
    ).model_dump(mode="json")
    service.store_items([item], "w1")
    service.retrieve("units", "w1")
    assert metrics.values("reasonray_memory_items", workspace="w1") == [1]
    assert len(metrics.values("reasonray_memory_retrieval_latency_seconds")) == 1
    service.delete_workspace("w1")
    assert metrics.values("reasonray_memory_items", workspace="w1")[-1] == 0


async def test_a_failed_call_is_a_cache_miss_only_when_the_cache_was_asked_and_carries_its_model():
    metrics = RecordingMetrics()
    breaker = CircuitBreaker(minimum_calls=100)

    def reply(request):
        return TransientProviderError("503", status_code=503)

    llm = MeteredLLM(FunctionLLM(reply, model="m"), metrics, caching=True, breaker=breaker)
    for request in (ask("sampled", temperature=0.9), ask("repeatable")):
        with pytest.raises(TransientProviderError):
            await llm.complete(request)
    assert metrics.values("reasonray_llm_cache_misses", model="m") == [1.0]  # the repeatable call only
    assert [t for n, _, t in metrics.records if n == "reasonray_llm_calls"] == [{"model": "m", "outcome": "error"}] * 2
    assert metrics.values("reasonray_llm_failures", model="m", error="TransientProviderError") == [1.0, 1.0]
    assert metrics.values("reasonray_llm_breaker_state", endpoint="default") == [0, 0]  # closed, under the default endpoint name

    uncached = RecordingMetrics()
    plain = MeteredLLM(FunctionLLM(lambda request: "<answer>1</answer>", model="m"), uncached, caching=False)
    await plain.complete(ask("repeatable"))
    assert uncached.total("reasonray_llm_cache_misses") == 0 and uncached.total("reasonray_llm_cache_hits") == 0
    assert [n for n, _, _ in uncached.records] == ["reasonray_llm_calls", "reasonray_llm_latency_seconds"]  # no breaker, no breaker state
