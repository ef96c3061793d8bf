"""Everything a run does is an event: a msgspec struct carrying the run's trace id.

Events keep the full text (thinking included). `EventRecorder` appends each one to the run's JSONL
file under the data directory as it happens (so a long run holds none of its history in memory),
keeps them in memory only when the caller asked for the trace, and writes one log line per event
with sizes and timings, never prompt or answer text. `ObservedLLM` wraps the LLM a strategy sees
so that every call becomes an `LLM_INVOCATION` event and counts towards the run's standard metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

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


class IterationEnd(Event, tag="ITERATION_END"):
    """A multi-iteration strategy finished one iteration."""

    iteration: int
    prompt_tokens: int
    completion_tokens: int
    has_answer: bool
    stop: str  # "answer", "continue" (the model asked for more room) or "length" (cut off)


class Carryover(Event, tag="CARRYOVER"):
    """What is carried into the next iteration (thinking stripped), and how it was made."""

    iteration: int
    mode: str  # "tail" or "summary"
    tokens: int
    text: str
    fallback: bool = False  # summary generation failed or came back empty: the raw tail was used


class BranchRun(Event, tag="BRANCH"):
    """A branch of a fan-out finished as a Ray task: where it ran and what it cost."""

    label: str
    index: int
    task_id: str
    node_id: str
    pid: int
    elapsed_ms: float
    llm_calls: int


class ThoughtNode(Event, tag="THOUGHT"):
    """A node of a tree-of-thought search: the thought, its evaluation and what the search did with it."""

    node_id: str  # "0.2.1": the root's third child's second child
    parent_id: str
    depth: int
    text: str
    score: float
    is_answer: bool
    status: str  # "kept", "pruned", "answer" (the chosen solution) or "unexplored"


class RunWarning(Event, tag="WARNING"):
    """Something was degraded to keep the run going (truncation, fallback)."""

    code: str
    message: str


class RunEnd(Event, tag="RUN_END"):
    """The run finished (status ok) or failed (status error, with the error type)."""

    status: str
    total_tokens: int
    execution_time_ms: int
    error: str | None = None


EventSink = Callable[[Event], None]


TEXT_FIELDS = frozenset({"messages", "responses", "text"})  # model and user text: event log only, never logs
_encoder = msgspec.json.Encoder()
_made_dirs: set[Path] = set()


def to_dict(event: Event) -> dict[str, Any]:
    return msgspec.to_builtins(event)


def event_log_path(data_dir: Path, trace_id: str) -> Path:
    """Where a run's events go: <data_dir>/events/<UTC date>/<trace_id>.jsonl."""
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return Path(data_dir) / "events" / day / f"{trace_id}.jsonl"


class EventRecorder:
    """Appends a run's events to its JSONL file, keeps them only when asked, and logs each without text.

    The file is buffered (64 KiB): a long run's text leaves memory as the buffer fills, and `close`
    writes the rest when the run ends, successfully or not.
    """

    def __init__(self, path: Path | None = None, *, keep: bool = True) -> None:
        self.path = path
        self.keep = keep
        self.events: list[Event] = []
        self._file: IO[bytes] | None = None

    def __call__(self, event: Event) -> None:
        if self.keep:
            self.events.append(event)
        if self.path is not None:
            if self._file is None:
                if self.path.parent not in _made_dirs:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    _made_dirs.add(self.path.parent)
                self._file = self.path.open("ab", buffering=64 * 1024)  # written as the buffer fills and at close
            self._file.write(_encoder.encode(event) + b"\n")
        fields = {k: v for k, v in to_dict(event).items() if k not in TEXT_FIELDS and k not in ("type", "ts")}
        log.info(type(event).__name__, **fields)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def as_trace(self) -> list[dict[str, Any]]:
        return [to_dict(e) for e in self.events]


def read_event_log(path: Path) -> list[dict[str, Any]]:
    """A run's events as written, oldest first."""
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines() if line]


class Tally(msgspec.Struct):
    """What a run's LLM calls added up to."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    simulated: bool = False
    model: str = ""  # as the endpoint names itself (the simulator answers "simulated")

    def add(self, other: Tally) -> None:
        """Count another tally's calls (a branch that ran elsewhere) into this one."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.calls += other.calls
        self.cache_hits += other.cache_hits
        self.retries += other.retries
        self.simulated = self.simulated or other.simulated
        self.model = other.model or self.model


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
