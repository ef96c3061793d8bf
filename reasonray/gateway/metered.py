"""`MeteredLLM`: the outermost layer of the LLM stack, recording calls, cache use, retries,
failures, latency and the breaker's state in the service's metrics catalogue."""

from __future__ import annotations

import time
from typing import Any

from reasonray.gateway.capabilities import Layer
from reasonray.gateway.protocol import LLM, Completion, LLMRequest
from reasonray.kernel.telemetry import BREAKER_STATES, Metrics


class MeteredLLM(Layer):
    """The outermost layer of the LLM stack: counts calls, cache hits and misses, retries, failures
    and latency, and publishes the breaker's state after each call."""

    def __init__(self, inner: LLM, metrics: Metrics, *, caching: bool, breaker: Any = None, endpoint: str = "") -> None:
        self.inner = inner
        self.metrics = metrics
        self.caching = caching  # the stack has a response cache: repeatable calls are hits or misses
        self.breaker = breaker
        self.endpoint = endpoint or "default"

    async def complete(self, request: LLMRequest) -> Completion:
        m, model, started = self.metrics, self.inner.model, time.perf_counter()
        try:
            completion = await self.inner.complete(request)
        except Exception as exc:
            m.record("reasonray_llm_failures", model=model, error=type(exc).__name__)
            self._ended(request, None)
            raise
        self._ended(request, completion)
        if not completion.cached:
            m.record("reasonray_llm_latency_seconds", time.perf_counter() - started, model=model)
            if completion.attempts > 1:
                m.record("reasonray_llm_retries", completion.attempts - 1, model=model)
        return completion

    def _ended(self, request: LLMRequest, completion: Completion | None) -> None:
        """A call ended (None: it failed): its outcome, the cache's hit or miss, the breaker's state."""
        m, model, cached = self.metrics, self.inner.model, completion is not None and completion.cached
        m.record("reasonray_llm_calls", model=model, outcome="error" if completion is None else "cached" if cached else "ok")
        if self.caching and not request.sampled:  # a failed call too: the cache was asked and had nothing
            m.record("reasonray_llm_cache_hits" if cached else "reasonray_llm_cache_misses", model=model)
        if self.breaker is not None:
            m.record("reasonray_llm_breaker_state", BREAKER_STATES.get(self.breaker.state, 0), endpoint=self.endpoint)
