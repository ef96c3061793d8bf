"""Everything a run does is an event: a msgspec struct carrying the run's trace id.

Events keep the full text (thinking included) for the run's trace; the log line written for each
event carries only sizes and timings, never prompt or answer text. `ObservedLLM` wraps the LLM a
strategy sees so that every call becomes an `LLM_INVOCATION` event and counts towards the run's
standard metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from gateway.protocol import LLM, Completion, LLMRequest

log = structlog.get_logger("reasonray.events")


class Event(msgspec.Struct, tag_field="type", kw_only=True):
    trace_id: str
    strategy: str
    ts: float = msgspec.field(default_factory=time.time)


class LLMInvocation(Event, tag="LLM_INVOCATION"):
    """One call to the model: the request messages and the full response, thinking included."""

    messages: list[dict[str, Any]]
    responses: list[str]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    cached: bool
    attempts: int
    model: str
    simulated: bool


class RunEnd(Event, tag="RUN_END"):
    """The run finished (status ok) or failed (status error, with the error type)."""

    status: str
    total_tokens: int
    execution_time_ms: int
    error: str | None = None


EventSink = Callable[[Event], None]


def to_dict(event: Event) -> dict[str, Any]:
    return msgspec.to_builtins(event)


class EventRecorder:
    """Collects a run's events for its trace and writes one content-free log line per event."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        fields = {k: v for k, v in to_dict(event).items() if k not in ("messages", "responses", "type", "ts")}
        log.info(type(event).__name__, **fields)

    def as_trace(self) -> list[dict[str, Any]]:
        return [to_dict(e) for e in self.events]


class Tally(msgspec.Struct):
    """What a run's LLM calls added up to."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    simulated: bool = False
    model: str = ""  # as the endpoint names itself (the simulator answers "simulated")


class ObservedLLM:
    """Emits an LLM_INVOCATION event per call and keeps the run's tally."""

    def __init__(self, inner: LLM, emit: EventSink, *, trace_id: str, strategy: str) -> None:
        self.inner = inner
        self.emit = emit
        self.trace_id = trace_id
        self.strategy = strategy
        self.tally = Tally()

    @property
    def model(self) -> str:
        return self.inner.model

    async def complete(self, request: LLMRequest) -> Completion:
        completion = await self.inner.complete(request)
        t = self.tally
        t.prompt_tokens += completion.usage.prompt_tokens
        t.completion_tokens += completion.usage.completion_tokens
        t.calls += 1
        t.cache_hits += completion.cached
        t.retries += max(completion.attempts - 1, 0)
        t.simulated = t.simulated or completion.simulated
        t.model = completion.model
        self.emit(
            LLMInvocation(
                trace_id=self.trace_id,
                strategy=self.strategy,
                messages=[msgspec.to_builtins(m) for m in request.messages],
                responses=[c.text for c in completion.choices],
                finish_reason=completion.finish_reason,
                prompt_tokens=completion.usage.prompt_tokens,
                completion_tokens=completion.usage.completion_tokens,
                latency_ms=round(completion.latency_ms, 3),
                cached=completion.cached,
                attempts=completion.attempts,
                model=completion.model,
                simulated=completion.simulated,
            )
        )
        return completion
