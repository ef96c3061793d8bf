"""Everything a run does is an event: a msgspec struct carrying the run's trace id.

Events keep the full text (thinking included). `EventRecorder` appends them to the run's JSONL
file under the data directory (0600 files in 0700 directories; `[events] record` chooses the full
text, sizes and hashes only, or no file; `reasonray.kernel.retention` deletes old ones) in batches
of 64 KiB and at the run's end (so a long run holds little of its history in memory), keeps them
in memory only when the caller asked for the trace, and writes one log line per event
with sizes and timings, never prompt or answer text. The LLM wrapper that turns every model call
into an `LLM_INVOCATION` event is `reasonray.gateway.observed.ObservedLLM`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, cast

import msgspec
import structlog

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
    reasoning: list[str] = []  # each choice's thinking, as the gateway read it ("" for a model that thinks out of sight)
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking (as the server counted them)


class IterationEnd(Event, tag="ITERATION_END"):
    """A multi-iteration strategy finished one iteration."""

    iteration: int
    prompt_tokens: int
    completion_tokens: int
    has_answer: bool
    stop: str  # "answer", "continue" (the model asked for more room), "length" (cut off), "thinking" (cut off while thinking)
    thinking_tokens: int = 0  # of completion_tokens, those spent thinking
    thinking_finished: bool = True  # False: the reply ended inside its thinking


class Carryover(Event, tag="CARRYOVER"):
    """What is carried into the next iteration (thinking stripped), and how it was made."""

    iteration: int
    mode: str  # "tail", "summary" or "delethink" (the text is then the thinking the next chunk continues)
    tokens: int
    text: str
    fallback: bool = False  # summary generation failed or came back empty: the raw tail was used


class BranchRun(Event, tag="BRANCH"):
    """A branch of a fan-out finished as a Ray task: where it ran (task, branch-runner actor, node, process) and what it cost."""

    label: str
    index: int
    task_id: str
    node_id: str
    pid: int
    elapsed_ms: float
    llm_calls: int
    actor_id: str = ""  # the branch runner (empty in traces from before the pool)


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


class MemoryRetrieval(Event, tag="MEMORY_RETRIEVAL"):
    """Memories retrieved into the run's prompts: ids, titles, warnings and composite scores."""

    workspace: str
    task_id: str
    memories: list[dict[str, Any]]
    latency_ms: float


class MemoryLearning(Event, tag="MEMORY_LEARNING"):
    """The learning loop after a run: the verdict, who gave it, and the memories stored."""

    workspace: str
    task_id: str
    outcome: str
    judged_by: str
    trajectories: int
    stored: list[str]
    source: str  # "judged" (memory.learn) or "passive"


class RunEnd(Event, tag="RUN_END"):
    """The run finished (status ok) or failed (status error, with the error type)."""

    status: str
    total_tokens: int
    execution_time_ms: int
    error: str | None = None


EventSink = Callable[[Event], None]


TEXT_FIELDS = frozenset({"messages", "responses", "text", "reasoning"})  # model and user text: event log only, never logs
PRIVATE_FIELDS = TEXT_FIELDS | {"memories"}  # what `[events] record = "metadata"` keeps only the size and hash of
RecordMode = Literal["full", "metadata", "off"]
_encoder = msgspec.json.Encoder()
_made_dirs: set[Path] = set()


def to_dict(event: Event) -> dict[str, Any]:
    return cast(dict[str, Any], msgspec.to_builtins(event))


def metadata_only(event: Event) -> dict[str, Any]:
    """The event with each text field replaced by its size in bytes and its SHA-256: what ran, not what was said."""
    fields = to_dict(event)
    for name in PRIVATE_FIELDS & fields.keys():
        raw = _encoder.encode(fields[name])
        fields[name] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    return fields


def event_log_path(data_dir: Path, trace_id: str) -> Path:
    """Where a run's events go: <data_dir>/events/<UTC date>/<trace_id>.jsonl."""
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    return Path(data_dir) / "events" / day / f"{trace_id}.jsonl"


class EventRecorder:
    """Appends a run's events to its JSONL file, keeps them only when asked, and logs each without text.

    Events gather in memory up to 64 KiB, then go to the file (a long run's text leaves memory as it
    grows); `close` writes the rest when the run ends, successfully or not. A short run's file is
    created only then, and `aclose` does that in a worker thread: creating a file is a filesystem call
    that, on the event loop, held up every other request the replica was serving.
    """

    FLUSH_AT = 64 * 1024

    def __init__(self, path: Path | None = None, *, keep: bool = True, mode: RecordMode = "full") -> None:
        self.path = path if mode != "off" else None
        self.keep = keep
        self.mode = mode
        self.events: list[Event] = []
        self._pending = bytearray()
        self._file: IO[bytes] | None = None

    def __call__(self, event: Event) -> None:
        if self.keep:
            self.events.append(event)
        if self.path is not None:
            self._pending += _encoder.encode(event if self.mode == "full" else metadata_only(event))
            self._pending += b"\n"
            if len(self._pending) >= self.FLUSH_AT:
                self._flush()
        fields = {k: v for k, v in to_dict(event).items() if k not in TEXT_FIELDS and k not in ("type", "ts")}
        log.info(type(event).__name__, **fields)

    def _flush(self) -> None:
        if self._pending:
            if self._file is None:
                self._file = self._open()
            self._file.write(self._pending)
            self._pending.clear()

    def _open(self) -> IO[bytes]:
        assert self.path is not None
        for _ in range(2):
            if self.path.parent not in _made_dirs:
                for directory in (self.path.parent.parent, self.path.parent):  # <data_dir>/events, its day
                    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                    directory.chmod(0o700)  # the service's user's only, whatever the umask
                _made_dirs.add(self.path.parent)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # prompts are personal data: owner only
            except FileNotFoundError:  # the directory went since it was made (swept, purged, removed): make it again
                _made_dirs.discard(self.path.parent)
                continue
            return os.fdopen(fd, "ab", buffering=0)  # the writes are whole 64-KiB batches already
        raise FileNotFoundError(f"cannot create the event log {self.path}: its directory keeps disappearing")

    def close(self) -> None:
        try:
            self._flush()
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None

    async def aclose(self) -> None:
        """`close`, with the file work in a worker thread (nothing to do for a recorder without a file)."""
        if self._pending or self._file is not None:
            await asyncio.to_thread(self.close)

    def as_trace(self) -> list[dict[str, Any]]:
        return [to_dict(e) for e in self.events]


def read_event_log(path: Path) -> list[dict[str, Any]]:
    """A run's events as written, oldest first."""
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines() if line]


class Tally(msgspec.Struct):
    """What a run's LLM calls added up to."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking
    thinking_unenforced: int = 0  # calls whose thinking budget or effort the endpoint could neither take nor force
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    simulated: bool = False
    model: str = ""  # as the endpoint names itself (the simulator answers "simulated")

    def add(self, other: Tally) -> None:
        """Count another tally's calls (a branch that ran elsewhere) into this one."""
        for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens", "thinking_unenforced", "calls", "cache_hits", "retries"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.simulated = self.simulated or other.simulated
        self.model = other.model or self.model


class Budget(msgspec.Struct, frozen=True, omit_defaults=True):
    """A request's token budget; None means no limit."""

    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None
    max_completion_tokens: int | None = None
    """Completion tokens the whole run may generate, reasoning included (OpenAI's `max_completion_tokens`)."""

    def tightest(self, other: Budget | None) -> Budget:
        """Each limit the lower of the two (a request may tighten the system's budget, never loosen it)."""
        if other is None:
            return self
        limits = ([v for v in (getattr(self, f), getattr(other, f)) if v is not None] for f in self.__struct_fields__)
        return Budget(*(min(both, default=None) for both in limits))
