"""The service's own metrics: one catalogue, recorded through a `Metrics` sink.

Pure code records by name (`metrics.record("reasonray_requests", method=..., status=...)`); the
Ray layer (`actors/metrics.py`) turns the catalogue into `ray.util.metrics` counters, histograms
and gauges, which Ray exports on each node's metrics endpoint with a `ray_` prefix (counters also
get `_total`) beside Serve's own. docs/operations.md lists them; `deploy/grafana/reasonray.json`
charts them. Tags are low-cardinality on purpose: method, strategy, status, model, never a user's
text or id.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.protocol import LLM, Completion, LLMRequest

Kind = Literal["counter", "histogram", "gauge"]
LATENCY_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000)
TOKENS = (100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000)


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    description: str
    tags: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()

    @property
    def exported(self) -> str:
        """The name on Ray's metrics endpoint."""
        return f"ray_{self.name}_total" if self.kind == "counter" else f"ray_{self.name}"


CATALOGUE: tuple[MetricSpec, ...] = (
    MetricSpec("reasonray_requests", "counter", "JSON-RPC calls answered, by method, strategy and status (ok or the error type).",
               ("method", "strategy", "status")),
    MetricSpec("reasonray_request_latency_ms", "histogram", "Time to answer a JSON-RPC call, in milliseconds.",
               ("method", "strategy"), LATENCY_MS),
    MetricSpec("reasonray_tokens", "counter", "Tokens spent by reasoning runs, by strategy and kind (prompt or completion).",
               ("strategy", "kind")),
    MetricSpec("reasonray_run_tokens", "histogram", "Tokens one reasoning run spent (prompt plus completion).", ("strategy",), TOKENS),
    MetricSpec("reasonray_llm_calls", "counter", "LLM calls, by model and outcome (ok, cached or error).", ("model", "outcome")),
    MetricSpec("reasonray_llm_retries", "counter", "Extra attempts spent on transient provider failures.", ("model",)),
    MetricSpec("reasonray_llm_failures", "counter", "LLM calls that failed after their retries, by error type.", ("model", "error")),
    MetricSpec("reasonray_llm_latency_ms", "histogram", "Time of an LLM call that reached the provider, retries included.",
               ("model",), LATENCY_MS),
    MetricSpec("reasonray_llm_breaker_state", "gauge", "The circuit breaker: 0 closed, 1 half open, 2 open.", ("endpoint",)),
    MetricSpec("reasonray_llm_cache_hits", "counter", "LLM calls answered from the response cache.", ("model",)),
    MetricSpec("reasonray_llm_cache_misses", "counter", "Cacheable LLM calls the cache could not answer.", ("model",)),
    MetricSpec("reasonray_bounded_context_iterations", "histogram", "Iterations of a bounded-context run.", (),
               (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50)),
    MetricSpec("reasonray_bounded_context_savings_pct", "histogram",
               "Attention compute a bounded-context run saved against one long chain of thought, in percent.", (),
               (1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99)),
    MetricSpec("reasonray_memory_retrieval_latency_ms", "histogram", "Memory retrieval (embedding and ranking), in milliseconds.",
               (), LATENCY_MS),
    MetricSpec("reasonray_memory_items", "gauge", "Memory items stored, by workspace.", ("workspace",)),
    MetricSpec("reasonray_active_sessions", "gauge", "Sessions with a live session actor.", ()),
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


class RecordingMetrics:
    """Keeps what was recorded (for tests and in-process use), checked against the catalogue."""

    def __init__(self) -> None:
        self.records: list[tuple[str, float, dict[str, str]]] = []

    def record(self, name: str, value: float = 1.0, **tags: str) -> None:
        check(name, tags, value)
        self.records.append((name, value, tags))

    def values(self, name: str, **tags: str) -> list[float]:
        return [v for n, v, t in self.records if n == name and all(t.get(k) == w for k, w in tags.items())]

    def total(self, name: str, **tags: str) -> float:
        return sum(self.values(name, **tags))


class MeteredLLM:
    """The outermost layer of the LLM stack: counts calls, cache hits and misses, retries, failures
    and latency, and publishes the breaker's state after each call."""

    def __init__(self, inner: LLM, metrics: Metrics, *, caching: bool, breaker: Any = None, endpoint: str = "") -> None:
        self.inner = inner
        self.metrics = metrics
        self.caching = caching  # the stack has a response cache: repeatable calls are hits or misses
        self.breaker = breaker
        self.endpoint = endpoint or "default"

    @property
    def model(self) -> str:
        return self.inner.model

    async def complete(self, request: LLMRequest) -> Completion:
        model = self.inner.model
        started = time.perf_counter()
        try:
            completion = await self.inner.complete(request)
        except Exception as exc:
            if self.caching and not request.sampled:  # the cache was asked and had nothing
                self.metrics.record("reasonray_llm_cache_misses", model=model)
            self.metrics.record("reasonray_llm_calls", model=model, outcome="error")
            self.metrics.record("reasonray_llm_failures", model=model, error=type(exc).__name__)
            self._breaker()
            raise
        m = self.metrics
        m.record("reasonray_llm_calls", model=model, outcome="cached" if completion.cached else "ok")
        if self.caching and not request.sampled:
            m.record("reasonray_llm_cache_hits" if completion.cached else "reasonray_llm_cache_misses", model=model)
        if not completion.cached:
            m.record("reasonray_llm_latency_ms", (time.perf_counter() - started) * 1000, model=model)
            if completion.attempts > 1:
                m.record("reasonray_llm_retries", completion.attempts - 1, model=model)
        self._breaker()
        return completion

    def _breaker(self) -> None:
        if self.breaker is not None:
            self.metrics.record("reasonray_llm_breaker_state", BREAKER_STATES.get(self.breaker.state, 0), endpoint=self.endpoint)


def record_run(metrics: Metrics, strategy: str, prompt_tokens: int, completion_tokens: int, specific: dict[str, Any] | None) -> None:
    """A reasoning run's tokens, and a bounded-context run's iterations and savings."""
    metrics.record("reasonray_tokens", prompt_tokens, strategy=strategy, kind="prompt")
    metrics.record("reasonray_tokens", completion_tokens, strategy=strategy, kind="completion")
    metrics.record("reasonray_run_tokens", prompt_tokens + completion_tokens, strategy=strategy)
    specific = specific or {}
    if "total_iterations" in specific:
        metrics.record("reasonray_bounded_context_iterations", specific["total_iterations"])
    if "compute_savings_pct" in specific:
        metrics.record("reasonray_bounded_context_savings_pct", specific["compute_savings_pct"])

