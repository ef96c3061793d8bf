"""The service's own metrics: one catalogue, recorded through a `Metrics` sink.

Pure code records by name (`metrics.record("reasonray_requests", method=..., status=...)`); the
Ray layer (`actors/metrics.py`) turns the catalogue into `ray.util.metrics` counters, histograms
and gauges, which Ray exports on each node's metrics endpoint with a `ray_` prefix (counters also
get `_total`) beside Serve's own. docs/operations.md lists them; `deploy/grafana/reasonray.json`
charts them. Tags are low-cardinality on purpose: method, strategy, status, model, never a user's
text. `agent` is a registered agent's id (operators register a handful), or `none`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from reasonray.kernel.events import RunEnd, Tally

Kind = Literal["counter", "histogram", "gauge"]
LATENCY_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
"""Bucket bounds of the latency histograms, in seconds (Prometheus' base unit)."""
TOKENS = (100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000)


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    tags: tuple[str, ...]
    description: str
    boundaries: tuple[float, ...] = ()

    @property
    def exported(self) -> str:
        """The name on Ray's metrics endpoint."""
        return f"ray_{self.name}_total" if self.kind == "counter" else f"ray_{self.name}"


def _histogram(name: str, tags: tuple[str, ...], description: str, boundaries: tuple[float, ...] = LATENCY_SECONDS) -> MetricSpec:
    return MetricSpec(name, "histogram", tags, description, boundaries)


CATALOGUE: tuple[MetricSpec, ...] = (
    MetricSpec(
        "reasonray_requests",
        "counter",
        ("method", "strategy", "status"),
        "JSON-RPC calls answered, by method, strategy and status (ok or the error type).",
    ),
    _histogram("reasonray_request_latency_seconds", ("method", "strategy"), "Time to answer a JSON-RPC call, in seconds."),
    MetricSpec(
        "reasonray_tokens",
        "counter",
        ("strategy", "agent", "kind"),
        "Tokens spent by reasoning runs, failed or not, by strategy, agent (or none) and kind (prompt or completion).",
    ),
    _histogram("reasonray_run_tokens", ("strategy", "agent"), "Tokens one reasoning run spent (prompt plus completion).", TOKENS),
    MetricSpec(
        "reasonray_runs",
        "counter",
        ("strategy", "agent", "status"),
        "Reasoning runs, by the strategy that ran, the agent (or none) and status: ok, degraded or the error type.",
    ),
    _histogram(
        "reasonray_run_latency_seconds",
        ("strategy", "agent", "status"),
        "Time of one reasoning run, failed or not, by strategy, agent and status, in seconds.",
    ),
    MetricSpec("reasonray_run_llm_calls", "counter", ("strategy", "agent"), "LLM calls made by reasoning runs, failed or not."),
    MetricSpec("reasonray_llm_calls", "counter", ("model", "outcome"), "LLM calls, by model and outcome (ok, cached or error)."),
    MetricSpec("reasonray_llm_retries", "counter", ("model",), "Extra attempts spent on transient provider failures."),
    MetricSpec("reasonray_llm_failures", "counter", ("model", "error"), "LLM calls that failed after their retries, by error type."),
    _histogram("reasonray_llm_latency_seconds", ("model",), "Time of an LLM call that reached the provider, retries included, in seconds."),
    MetricSpec("reasonray_llm_breaker_state", "gauge", ("endpoint",), "The circuit breaker: 0 closed, 1 half open, 2 open."),
    MetricSpec("reasonray_llm_cache_hits", "counter", ("model",), "LLM calls answered from the response cache."),
    MetricSpec("reasonray_llm_cache_misses", "counter", ("model",), "Cacheable LLM calls the cache could not answer."),
    _histogram("reasonray_memory_retrieval_latency_seconds", (), "Memory retrieval (embedding and ranking), in seconds."),
    MetricSpec("reasonray_memory_items", "gauge", ("workspace",), "Memory items stored, by workspace."),
    MetricSpec("reasonray_active_sessions", "gauge", (), "Sessions live in the session hosts' memory."),
    # bounded-context runs under the names the API's first description gave them; GET /metrics serves
    # them without Ray's `ray_` prefix, as spelled here (one family per metric: no second copy)
    MetricSpec("reasoning_bounded_context_requests", "counter", ("status",), "Bounded-context runs, by status (ok or the error type)."),
    _histogram(
        "reasoning_bounded_context_duration_seconds",
        (),
        "Time of a bounded-context run, in seconds.",
        (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    ),
    MetricSpec("reasoning_bounded_context_tokens", "counter", (), "Tokens bounded-context runs spent (prompt plus completion)."),
    _histogram(
        "reasoning_bounded_context_compute_savings_pct",
        (),
        "Attention compute a bounded-context run saved against one long chain of thought, in percent.",
        (1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99),
    ),
    _histogram(
        "reasoning_bounded_context_iterations", (), "Iterations of a bounded-context run.", (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50)
    ),
)
SPECS = {spec.name: spec for spec in CATALOGUE}
BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}


class Metrics(Protocol):
    def record(self, name: str, value: float = 1.0, **tags: str) -> None:
        """Count (counter), observe (histogram) or set (gauge) the catalogue metric `name`."""


class NoMetrics:
    def record(self, name: str, value: float = 1.0, **tags: str) -> None:
        pass


def check(name: str, tags: dict[str, str], value: float = 1.0) -> MetricSpec:
    """The spec of `name`; a name or tag set the catalogue does not have, or a counter going down,
    is a programming error."""
    spec = SPECS.get(name)
    if spec is None:
        raise KeyError(f"{name!r} is not in reasonray.telemetry.CATALOGUE")
    if set(tags) != set(spec.tags):
        raise ValueError(f"{name} takes tags {spec.tags}, got {tuple(tags)}")
    if spec.kind == "counter" and value < 0:
        raise ValueError(f"{name} is a counter: it cannot go down by {value}")
    return spec


def record_run(metrics: Metrics, end: RunEnd, agent: str, status: str, tally: Tally, specific: dict[str, Any] | None) -> None:
    """One reasoning run, failed or not: its tokens, outcome (ok, degraded or the error type), time and LLM calls,
    tagged with the strategy that ran and the agent (or `none`); a bounded-context run also under the
    `reasoning_bounded_context_*` names (status `ok` or the error's type; `specific` the strategy's metrics)."""
    tags = {"strategy": end.strategy, "agent": agent}
    metrics.record("reasonray_tokens", tally.prompt_tokens, **tags, kind="prompt")
    metrics.record("reasonray_tokens", tally.completion_tokens, **tags, kind="completion")
    metrics.record("reasonray_run_tokens", tally.prompt_tokens + tally.completion_tokens, **tags)
    metrics.record("reasonray_runs", 1, **tags, status=status)
    metrics.record("reasonray_run_latency_seconds", end.execution_time_ms / 1000, **tags, status=status)
    metrics.record("reasonray_run_llm_calls", tally.calls, **tags)
    if end.strategy != "bounded_context":
        return
    metrics.record("reasoning_bounded_context_requests", status=end.error or "ok")
    metrics.record("reasoning_bounded_context_duration_seconds", end.execution_time_ms / 1000)
    metrics.record("reasoning_bounded_context_tokens", end.total_tokens)
    specific = specific or {}
    for name, key in (("iterations", "total_iterations"), ("compute_savings_pct", "compute_savings_pct")):
        if key in specific:
            metrics.record(f"reasoning_bounded_context_{name}", specific[key])
