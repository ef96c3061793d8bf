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

from gateway.protocol import LLM, Completion, LLMRequest, Message
from gateway.tokens import TokenCounter, count_messages, counter_for_model
from reasonray.errors import BudgetExceededError

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


class Budget(msgspec.Struct, frozen=True, omit_defaults=True):
    """A request's token budget (seed 003, requirement 14); None means no limit."""

    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None

    def tightest(self, other: Budget | None) -> Budget:
        """Each limit the lower of the two (a request may tighten the system's budget, never loosen it)."""
        if other is None:
            return self
        pick = lambda a, b: b if a is None else a if b is None else min(a, b)  # noqa: E731
        return Budget(*(pick(getattr(self, f), getattr(other, f)) for f in self.__struct_fields__))


OMITTED = "\n[... {n} tokens omitted to fit the prompt budget ...]\n"


class ObservedLLM:
    """Emits an LLM_INVOCATION event per call and keeps the run's tally.

    It also applies what is the run's, not the strategy's, to every request: retrieved memories
    (`guidance`, added to the system message) and the token budget. Before each call it counts the
    prompt; a prompt above `max_prompt_tokens` loses the middle of its longest message (head and tail
    kept, a WARNING event says how much went); `max_tokens` is capped by `max_output_tokens` and by
    what is left of `max_total_tokens`, so the run never spends more than its budget, and a call that
    cannot fit fails with BudgetExceededError before it is made. `spent` counts tokens used elsewhere
    in the run (a fan-out branch starts from its parent's total).
    """

    def __init__(
        self,
        inner: LLM,
        emit: EventSink,
        *,
        trace_id: str,
        strategy: str,
        guidance: str | None = None,
        budget: Budget | None = None,
        spent: int = 0,
        counter: TokenCounter | None = None,
    ) -> None:
        self.inner = inner
        self.emit = emit
        self.trace_id = trace_id
        self.strategy = strategy
        self.guidance = guidance
        self.budget = budget or Budget()
        self.spent = spent
        self.counter = counter
        self.tally = Tally()

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def spent_tokens(self) -> int:
        return self.spent + self.tally.prompt_tokens + self.tally.completion_tokens

    def branch_options(self, branches: int = 1) -> dict[str, Any]:
        """What a branch running elsewhere needs to apply the same guidance and budget.

        Each of `branches` concurrent branches gets an equal share of what is left of the total budget,
        so together they cannot overspend it.
        """
        spent = self.spent_tokens
        if self.budget.max_total_tokens is not None:
            left = max(self.budget.max_total_tokens - spent, 0)
            spent = self.budget.max_total_tokens - left // max(branches, 1)
        return {"guidance": self.guidance, "budget": self.budget, "spent": spent}

    def _with_guidance(self, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        if not self.guidance:
            return messages
        if messages and messages[0].role == "system":
            first = msgspec.structs.replace(messages[0], content=f"{messages[0].content or ''}\n\n{self.guidance}")
            return (first, *messages[1:])
        return (Message(role="system", content=self.guidance), *messages)

    def _within_budget(self, request: LLMRequest) -> LLMRequest:
        b = self.budget
        if b.max_prompt_tokens is None and b.max_output_tokens is None and b.max_total_tokens is None:
            return request
        counter = self.counter or counter_for_model(self.model)
        messages = request.messages
        prompt = count_messages(counter, messages)
        if b.max_prompt_tokens is not None and prompt > b.max_prompt_tokens:
            messages, prompt = self._truncate(counter, messages, prompt, b.max_prompt_tokens)
        max_tokens = request.max_tokens
        if b.max_output_tokens is not None:
            max_tokens = min(max_tokens or b.max_output_tokens, b.max_output_tokens)
        if b.max_total_tokens is not None:
            left = b.max_total_tokens - self.spent_tokens - prompt
            if left < 1:
                raise BudgetExceededError(
                    f"the request's token budget ({b.max_total_tokens} tokens) is spent: {self.spent_tokens} used so far "
                    f"and the next call's prompt alone is {prompt} tokens; raise budget.max_total_tokens",
                    {"max_total_tokens": b.max_total_tokens, "spent_tokens": self.spent_tokens, "next_prompt_tokens": prompt},
                )
            max_tokens = min(max_tokens or left, left)
        return msgspec.structs.replace(request, messages=messages, max_tokens=max_tokens)

    def _truncate(self, counter: TokenCounter, messages: tuple[Message, ...], prompt: int, limit: int) -> tuple[tuple[Message, ...], int]:
        index = max(range(len(messages)), key=lambda i: counter.count(messages[i].content or ""))
        text = messages[index].content or ""
        excess = prompt - limit
        keep = counter.count(text) - excess - counter.count(OMITTED.format(n=excess)) - 2
        if keep < 2:
            raise BudgetExceededError(
                f"the prompt is {prompt} tokens and cannot be cut to the budget's max_prompt_tokens={limit} "
                "without losing all of it; raise budget.max_prompt_tokens",
                {"prompt_tokens": prompt, "max_prompt_tokens": limit},
            )
        cut = counter.head(text, keep // 2) + OMITTED.format(n=excess) + counter.tail(text, keep - keep // 2)
        messages = (*messages[:index], msgspec.structs.replace(messages[index], content=cut), *messages[index + 1 :])
        after = count_messages(counter, messages)
        self.emit(RunWarning(
            trace_id=self.trace_id, strategy=self.strategy, code="prompt_truncated",
            message=f"the prompt was {prompt} tokens, above max_prompt_tokens={limit}: the middle of message "
            f"{index} ({messages[index].role}) was omitted, head and tail kept ({after} tokens now)",
        ))
        return messages, after

    async def complete(self, request: LLMRequest) -> Completion:
        request = self._within_budget(msgspec.structs.replace(request, messages=self._with_guidance(request.messages)))
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
