"""The reasoning service: validated API parameters in, a strategy resolved and run, a result out.

Transport-free and Ray-free: the Serve ingress and the in-process tests drive the same object.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import KW_ONLY, InitVar, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import msgspec
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reasonray.api.access.caps import check_strategy_config, check_text
from reasonray.api.access.tenancy import charge_tokens
from reasonray.api.jsonrpc import Params, error_for
from reasonray.api.structured import conform, schema_of
from reasonray.gateway.observed import ObservedLLM, Sampling
from reasonray.gateway.protocol import LLM, LLMRequest
from reasonray.gateway.tokens import TokenCounter
from reasonray.kernel import tracing
from reasonray.kernel.config import BudgetSettings, CapSettings, EventsSettings, MemorySettings
from reasonray.kernel.errors import (
    DeadlineExceededError,
    InvalidParamsError,
    NotFoundError,
    RunCancelledError,
    StrategyUnavailableError,
    attach_partial,
    describe_errors,
)
from reasonray.kernel.events import Budget, Event, EventRecorder, EventSink, LLMInvocation, RecordMode, RunEnd, event_log_path
from reasonray.kernel.redact import redact
from reasonray.kernel.retention import sweep
from reasonray.kernel.tags import extract_answer, normalize_answer, strip_thinking
from reasonray.kernel.telemetry import Metrics, NoMetrics, record_run
from reasonray.memory.learning import Verifier
from reasonray.memory.loop import (
    MemoryLoop,
    MemoryParams,
    MemoryReport,
    TrajectoryCapture,
)
from reasonray.memory.service import MemoryClient
from reasonray.stores.runs import RunIndex, RunRecord
from reasonray.strategies.agents import AGENT_ID, AgentCard
from reasonray.strategies.base import (
    Fanout,
    ReasoningResult,
    ReasoningStrategy,
    StrategyContext,
    Thinking,
    ThinkingSampling,
    local_fanout,
    thinking_of,
)
from reasonray.strategies.registry import Catalogue, Resolution

log = structlog.get_logger(__name__)

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

EXTRA_BODY_RIGHT = "llm.extra_body"
"""The right, matched against a role's `methods` like a method name, to pass `extra_body` through to the model
endpoint: fields the service does not check go to a server the operator configured, so operators and admins
hold it by default (`*`), reasoners do not (their `reasoning.*` does not match it); with authentication off
every caller holds it."""

EXTRA_BODY_RESERVED = frozenset({"model", "messages", "stream", "stream_options", "n", "tools"})
"""Body fields `extra_body` may not set: the gateway sets them and reads the reply by them."""

MAX_REASONING_CHARS = 32_000
"""The most thinking a result returns as `reasoning` (head and tail kept); the event log keeps it whole."""

RUN_LISTENER: ContextVar[EventSink | None] = ContextVar("reasonray_run_listener", default=None)
"""Also receives every event of the runs started in this context, as they happen (streaming transports
set it around a call: see reasonray/api/surfaces/streaming.py); strategies never see it."""


class BudgetParams(Params):
    max_prompt_tokens: int | None = Field(None, ge=64, description="Prompts above this are cut, head and tail kept, with a WARNING event.")
    max_output_tokens: int | None = Field(None, ge=1, description="Caps every call's max_tokens.")
    max_total_tokens: int | None = Field(None, ge=1, description="Prompt plus completion tokens the whole request may spend.")
    max_completion_tokens: int | None = Field(
        None, ge=1, description="Completion tokens the whole run may generate, reasoning included; then -32004 with the partial answer."
    )
    deadline_s: float | None = Field(None, gt=0, description="Seconds the run may take; then -32015 with what it achieved so far.")


class SamplingParams(Params):
    """Sampling applied to every LLM call of the run, over the strategy's own choice."""

    temperature: float | None = Field(None, ge=0, le=2, description="Sampling temperature of every call (0-2).")
    top_p: float | None = Field(None, ge=0, le=1, description="Nucleus sampling mass of every call (0-1).")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="Presence penalty of every call (-2 to 2).")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="Frequency penalty of every call (-2 to 2).")
    seed: int | None = Field(None, description="Mixed into every call's seed: the same seed, the same run (where the model is seedable).")


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$", description="The schema's name.")
    json_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema", description="A JSON Schema.")
    strict: bool | None = Field(None, description="Validated against the schema either way.")
    description: str | None = Field(None, description="What the answer is for (shown to the model).")


class ResponseFormatParams(Params):
    """The answer's shape (OpenAI's `response_format`): the answer is JSON that parses and validates, or -32010."""

    type: Literal["text", "json_object", "json_schema"] = Field(description="text: as the strategy answers; json_object; json_schema.")
    json_schema: JsonSchemaFormat | None = Field(None, description="The schema, for type json_schema.")

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormatParams:
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError("response_format.json_schema is required when type is 'json_schema'")
            schema_of(self.as_openai())
        return self

    def as_openai(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class ExecuteParams(Params):
    """Parameters of `reasoning.execute`."""

    query: str = Field(min_length=1, description="The problem to solve (at most `[limits] max_query_chars` characters).")
    strategy: str | None = Field(
        None, pattern=r"^[a-z_][a-z0-9_]*$", max_length=64, description="Strategy to use; omitted: the agent's or system default."
    )
    strategy_config: dict[str, Any] | None = Field(None, description="Strategy-specific configuration (see reasoning.strategies).")
    agent_id: str | None = Field(
        None, pattern=AGENT_ID, description="Run as this registered agent: only its strategies, its default and config apply."
    )
    include_trace: bool = Field(False, description="Return the run's events (full LLM text included) as `trace`.")
    memory: MemoryParams | None = Field(None, description="Run memory-aware: retrieve memories into the prompts; learn from the run.")
    budget: BudgetParams | None = Field(None, description="Token budget of this request (tightens the server's, never loosens it).")
    sampling: SamplingParams | None = Field(None, description="Sampling of every LLM call of the run, over the strategy's own.")
    response_format: ResponseFormatParams | None = Field(
        None, description="Answer as JSON (an object, or valid against a schema), validated and repaired once."
    )
    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        None,
        description="How hard a reasoning model thinks on every call of the run; a strategy_config's own wins. None: the model's default.",
    )
    thinking_budget: int | None = Field(
        None, ge=0, le=262_144, description="Most tokens a reasoning model may think per call of the run; a strategy_config's own wins."
    )
    extra_body: dict[str, Any] | None = Field(
        None,
        description="Fields passed as they are into the model endpoint's JSON body on every call of the run (e.g. "
        "chat_template_kwargs); trusted callers only: the `llm.extra_body` right (operators, admins) or authentication off.",
    )

    @field_validator("extra_body")
    @classmethod
    def _passable(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if reserved := sorted(EXTRA_BODY_RESERVED & (value or {}).keys()):
            raise ValueError(f"extra_body may not set {', '.join(reserved)}: the gateway sets them for every call")
        if len(json.dumps(value)) > 16_384:
            raise ValueError("extra_body is over 16 KiB as JSON")
        return value

    @classmethod
    def checked(cls, **fields: Any) -> ExecuteParams:
        """The run a method asks for from its own params; what does not validate (a query that is empty once
        cleaned, found by fuzzing) is the caller's invalid params, not an internal error."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise InvalidParamsError(f"invalid params: {describe_errors(exc)}") from None

    @field_validator("query")
    @classmethod
    def _sanitize(cls, value: str) -> str:
        cleaned = _CONTROL.sub("", value).strip()
        if not cleaned:
            raise ValueError("query is empty once whitespace and control characters are removed")
        return cleaned


class ExecuteResult(ReasoningResult):
    trace_id: str = Field(description="Identifies this run in logs, events and errors.")
    resolution: Resolution = Field(description="Which strategy ran, with which config, decided at which level.")
    memory: MemoryReport | None = Field(None, description="What the run retrieved from and stored in the memory bank.")
    degraded: bool = Field(
        False, description="True when the run failed part-way and this answer is what it had (`[reasoning] degraded_answers`)."
    )
    degraded_error: dict[str, Any] | None = Field(
        None, description="When degraded: the error the run met (`code`, `error_type`, `message`) and its `partial`."
    )


async def no_agents(agent_id: str) -> AgentCard:
    raise NotFoundError(f"no agent with id {agent_id!r}; this service has no agent directory", {"agent_id": agent_id})


@dataclass(eq=False)
class ReasoningService:
    """Resolves and runs strategies against one LLM stack."""

    catalogue: Catalogue
    llm: LLM
    tokens: TokenCounter
    _: KW_ONLY
    fanout: Fanout = local_fanout
    agents: Callable[[str], Awaitable[AgentCard]] = no_agents  # a registered card by id, else NotFoundError
    selection_budget_ms: float = 50.0
    data_dir: Path | None = None
    log_queries: bool = False
    memory: MemoryClient | None = None
    memory_settings: InitVar[MemorySettings | None] = None
    budget: BudgetSettings = field(default_factory=BudgetSettings)  # the server's; a request's may tighten it
    metrics: Metrics = field(default_factory=NoMetrics)
    runs: RunIndex | None = None  # every run indexed with its event log (reasonray.stores.runs); None: not indexed
    degraded_answers: bool = False
    events: EventsSettings = field(default_factory=EventsSettings)
    limits: CapSettings = field(default_factory=CapSettings)
    memory_loop: MemoryLoop | None = field(init=False)

    def __post_init__(self, memory_settings: MemorySettings | None) -> None:
        self.memory_loop = MemoryLoop(self.memory, memory_settings or MemorySettings()) if self.memory is not None else None
        self._last_sweep = float("-inf")
        self._background: set[asyncio.Future[Any]] = set()

    def deadline_s(self, budget: BudgetParams | None) -> float | None:
        """The run's deadline: the server's ([budget] deadline_s), tightened by the request's budget."""
        return min((d for d in (self.budget.deadline_s, budget.deadline_s if budget else None) if d), default=None)

    def resolve_strategy(self, name: str, config: dict[str, Any]) -> tuple[ReasoningStrategy, dict[str, Any]]:
        """Another enabled strategy with its effective config, for strategies that compose others (MaTTS)."""
        resolution = self.catalogue.resolve(name, config)
        check_strategy_config(resolution.strategy, resolution.config, self.limits)
        return self.catalogue.entries[resolution.strategy].strategy, resolution.config

    async def resolve(self, params: ExecuteParams) -> Resolution:
        agent = await self.agents(params.agent_id) if params.agent_id else None
        if agent is not None and "reasoning.execute" not in agent.supported_methods:
            raise InvalidParamsError(
                f"agent {agent.id!r} does not support reasoning.execute (its methods: {', '.join(agent.supported_methods)}); "
                "re-register it with reasoning.execute in supported_methods",
                {"agent_id": agent.id},
            )
        check_text("query", params.query, self.limits)
        started = time.perf_counter()
        resolution = self.catalogue.resolve(params.strategy, params.strategy_config, agent=agent)
        check_strategy_config(resolution.strategy, resolution.config, self.limits)
        took_ms = (time.perf_counter() - started) * 1000
        if took_ms > self.selection_budget_ms:
            log.warning("strategy.selection_slow", took_ms=round(took_ms, 3), budget_ms=self.selection_budget_ms)
        return _request_thinking(resolution, params)

    async def execute(self, params: ExecuteParams, trace_id: str, *, verifier: Verifier | None = None) -> ExecuteResult:
        """Run the request's strategy in four stages: resolve (strategy and config, within the caps), admit
        (memory, token budget, the run's recorder and context), run (memory retrieval, the strategy,
        learning; under the deadline), settle (the run's end recorded and handed to every run-end consumer, then the
        answer). The run's events also go to the context's RUN_LISTENER, for streams."""
        resolution = await self.resolve(params)
        plan = self._admit(params, resolution, trace_id, verifier)
        try:
            result = await self._run(plan)
        except BaseException as exc:
            status, degraded = self._failed(exc, plan.context, resolution.strategy)
            error = exc if isinstance(exc, Exception) else None
            await asyncio.shield(self._settle(plan, "degraded" if degraded else status, error, getattr(exc, "data", None)))
            if degraded is None:
                raise
            # the strategy's best answer from a run that failed part-way
            return self._answer(plan, plan.context.result(resolution.strategy, plan.context.progress["answer"]), degraded)
        await asyncio.shield(self._settle(plan, "ok", None, result.metrics.strategy_specific))
        return self._answer(plan, result, None)

    def _admit(self, params: ExecuteParams, resolution: Resolution, trace_id: str, verifier: Verifier | None) -> RunPlan:
        """What the run may use: memory (refused when the server has none), the tightest token budget, its
        recorder (event log, trace, listener) and the strategy's context."""
        if self.log_queries:  # opt-in debug logging, personal data redacted
            log.debug("query.received", query=redact(params.query), strategy=resolution.strategy)
        memory = params.memory
        if memory is not None and self.memory_loop is None:
            raise StrategyUnavailableError(
                "this server has no memory bank ([memory] enabled = false); omit `memory` or ask an operator to enable it",
                {"available": []},
            )
        if self.data_dir is not None and (now := time.monotonic()) - self._last_sweep >= self.events.sweep_interval_s:
            # the event logs' retention ([events] max_age_days, max_total_mb), enforced every sweep_interval_s, off the loop
            self._last_sweep = now
            e = self.events
            retention = asyncio.to_thread(sweep, Path(self.data_dir) / "events", max_age_days=e.max_age_days, max_total_mb=e.max_total_mb)
            self._in_background(retention, "events.sweep_failed")
        path = event_log_path(self.data_dir, trace_id) if self.data_dir is not None else None
        recorder = _Teed(path, keep=params.include_trace, listener=RUN_LISTENER.get(), mode=self.events.record)
        # a run that learns keeps its replies (its trajectory); others keep no history in memory
        capture = TrajectoryCapture(recorder) if memory is not None and memory.learn else None
        sink: EventSink = capture or recorder
        budget = _tokens_of(self.budget).tightest(_tokens_of(params.budget) if params.budget else None)
        context = StrategyContext(
            llm=ObservedLLM(
                self.llm,
                sink,
                trace_id=trace_id,
                strategy=resolution.strategy,
                budget=budget,
                counter=self.tokens,
                sampling=_sampling(params),
            ),
            tokens=self.tokens,
            emit=sink,
            trace_id=trace_id,
            fanout=self.fanout,
            resolve=self.resolve_strategy,
        )
        report = self.memory_loop.report(memory, trace_id) if self.memory_loop is not None else None
        return RunPlan(params, verifier, resolution, report, recorder, capture, context, path, time.time())

    async def _run(self, plan: RunPlan) -> ReasoningResult:
        """Memory retrieval, the strategy and learning, in the run's span and under its deadline."""
        params, context, report = plan.params, plan.context, plan.report
        strategy_name, memory, deadline = plan.resolution.strategy, params.memory, self.deadline_s(params.budget)
        strategy = self.catalogue.entries[strategy_name].strategy
        attributes = {
            "reasonray.strategy": strategy_name,
            "reasonray.trace_id": context.trace_id,
            "reasonray.decided_by": plan.resolution.strategy_decided_by,
        }
        with (
            tracing.span(f"strategy {strategy_name}", attributes) as span,
            thinking_of(Thinking(params.reasoning_effort, params.thinking_budget), context.llm),
        ):
            try:
                async with asyncio.timeout(deadline) as limit:
                    if memory is not None and memory.enabled and report is not None and self.memory_loop is not None:
                        with tracing.span("memory.retrieve", {"reasonray.workspace": report.workspace}):
                            await self.memory_loop.retrieve(memory, report, context.llm, context.emit, params.query)
                    result = await strategy.reason(params.query, context=context, config=plan.resolution.config)
                    # the thinking behind the strategy's answer, which a JSON answer below only restates
                    result.reasoning = result.reasoning or plan.recorder.thinking_behind(result.answer)
                    if params.response_format is not None and params.response_format.type != "text":
                        formatted = await conform(result.answer, params.response_format.as_openai(), context.llm, params.query)
                        result.answer = formatted.content
                        result.metrics = context.metrics(**{**result.metrics.strategy_specific, "response_format": formatted.how})
            except TimeoutError as exc:
                if not limit.expired():
                    raise
                # the deadline's error (as the cancellation's below) keeps the partial result a strategy attached to what interrupted it
                carried = getattr(exc.__cause__ or exc.__context__, "partial_result", None) or {}
                late = f"the run passed its deadline of {deadline:g}s before answering; raise budget.deadline_s or ask for less work"
                raise attach_partial(DeadlineExceededError(late, {"deadline_s": deadline}), carried) from None
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the caller went away (or the service stops): nobody is left to answer
                # something under the run was cancelled (a Ray branch, a provider call): the caller gets a -32014
                cancelled = RunCancelledError("the run was cancelled before it answered; retry the request")
                raise attach_partial(cancelled, getattr(exc, "partial_result", None) or {}) from None
            if report is not None and self.memory_loop is not None:
                with tracing.span("memory.store", {"reasonray.workspace": report.workspace}):
                    # from the run's trajectories when it asked to learn, else passively (when the bank does)
                    if memory is not None and (capture := plan.capture) is not None:  # memory.learn
                        trajectories = context.trajectories or [capture.trajectory(result.answer)]
                        await self.memory_loop.learn(memory, report, context.llm, capture, params.query, trajectories, plan.verifier)
                    elif self.memory_loop.settings.passive_learning:
                        await self.memory_loop.passive(report, context.llm, context.emit, params.query, result.answer)
                result.metrics = context.metrics(**result.metrics.strategy_specific)  # learning's calls count too
            t = context.llm.tally
            span.set({"gen_ai.usage.input_tokens": t.prompt_tokens, "gen_ai.usage.output_tokens": t.completion_tokens})
        return result

    async def _settle(self, plan: RunPlan, status: str, error: Exception | None, specific: dict[str, Any] | None) -> None:
        """The run's record ends its event log, then goes to every run-end consumer: the metrics (a bounded-context
        run under its own names too), the caller's token budget, the memory bank's statistics and the run index; the
        last two are written while the answer goes out (the file index fsyncs each record, which no caller should wait
        on). `status` is ok, degraded or the error's type; `specific` the strategy's own metrics or the error's data.
        Shielded by the caller: finished even when it goes away."""
        context, strategy, agent = plan.context, plan.resolution.strategy, plan.params.agent_id or "none"
        t = msgspec.structs.replace(context.llm.tally)  # a copy: the run as it ended, whatever a stray branch adds later
        end = RunEnd(
            trace_id=context.trace_id,
            strategy=strategy,
            status="error" if error else "ok",
            total_tokens=t.prompt_tokens + t.completion_tokens,
            execution_time_ms=context.elapsed_ms(),
            error=type(error).__name__ if error else None,
        )
        plan.recorder(end)
        await plan.recorder.aclose()  # the event log is whole before any consumer reads it
        record_run(self.metrics, end, agent, status, t, specific)
        charge_tokens(end.total_tokens)  # the caller's token budget pays what the run used
        if self.memory is not None:
            # the counts the bank keeps, as numbers (a Ray client adds up a batch of these before it sends them)
            tally = {k: getattr(t, k) for k in ("calls", "cache_hits", "retries", "prompt_tokens", "completion_tokens")}
            self._in_background(self.memory.record_run(tally, status == "ok"), "memory.stats_not_recorded")
        if self.runs is not None:
            run = RunRecord(
                trace_id=end.trace_id,
                kind="execute",
                strategy=strategy,
                status=end.status,
                prompt_tokens=t.prompt_tokens,
                completion_tokens=t.completion_tokens,
                started_at=datetime.fromtimestamp(plan.started, UTC),
                elapsed_ms=end.execution_time_ms,
                error=end.error,
            )
            self._in_background(self.runs.record(run, plan.event_log), "run.not_indexed", trace_id=end.trace_id)

    def _answer(self, plan: RunPlan, result: ReasoningResult, degraded: dict[str, Any] | None) -> ExecuteResult:
        report = plan.report
        if not result.reasoning:
            result.reasoning = plan.recorder.thinking_behind(result.answer)
        return ExecuteResult(
            **result.model_dump(exclude={"trace"}),
            trace=plan.recorder.as_trace() if plan.params.include_trace else None,
            trace_id=plan.context.trace_id,
            resolution=plan.resolution,
            memory=report if plan.params.memory is not None or (report is not None and report.passive) else None,
            degraded=degraded is not None,
            degraded_error=degraded,
        )

    def _failed(self, exc: BaseException, context: StrategyContext, strategy: str) -> tuple[str, dict[str, Any] | None]:
        """Attach what the run achieved (`partial`: the strategy's shape, plus the tokens and calls spent)
        and the strategy's name to the error, for `error.data`; the error type, for the metrics; and, with
        `degraded_answers`, the error a run that can still answer met (else None: the error stands)."""
        t = context.llm.tally
        counts = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "calls")
        spent = {"tokens": t.prompt_tokens + t.completion_tokens, **{k: getattr(t, k) for k in counts}}
        partial = {**context.progress, **(getattr(exc, "partial_result", None) or {}), **spent}
        attach_partial(exc, partial)
        exc.strategy_name = strategy  # type: ignore[attr-defined]
        if not isinstance(exc, Exception):
            return "cancelled", None
        error = error_for(exc)
        error_type = error.data["error_type"]
        if not self.degraded_answers or not partial.get("answer") or error_type == "invalid_params":
            return error_type, None
        return error_type, {"code": error.code, "error_type": error_type, "message": error.message, "partial": partial}

    def _in_background(self, work: Awaitable[Any], failed: str, **context: Any) -> None:
        """Run `work` as a task, referenced until it is done (the loop holds only weak references); its failure is
        logged as `failed` (with `context`), never the caller's."""
        task = asyncio.ensure_future(work)
        self._background.add(task)

        def done(task: asyncio.Future[Any]) -> None:
            self._background.discard(task)
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.warning(failed, **context, error=f"{type(exc).__name__}: {exc}"[:300])

        task.add_done_callback(done)


@dataclass
class RunPlan:
    """One run: what it asked for, what the admit stage decided, and its recorder and context."""

    params: ExecuteParams
    verifier: Verifier | None  # judges a learning run's answer (solve_coding_task's tests)
    resolution: Resolution
    report: MemoryReport | None
    recorder: _Teed
    capture: TrajectoryCapture | None
    context: StrategyContext
    event_log: Path | None
    started: float


class RunSampling(ThinkingSampling, frozen=True, omit_defaults=True):
    """The request's sampling, its strategy's thinking settings, and the trusted caller's `extra_body`, on every call
    of the run (branches that run elsewhere get it with the rest of the run's options)."""

    extra_body: dict[str, Any] | None = None

    def apply(self, request: LLMRequest) -> LLMRequest:
        request = super().apply(request)
        if not self.extra_body:
            return request
        # a field the strategy sets on its own call wins: the call needs it to work (continuing thinking, say)
        return msgspec.structs.replace(request, extra_body={**self.extra_body, **(request.extra_body or {})})


def _request_thinking(resolution: Resolution, params: ExecuteParams) -> Resolution:
    """The request's own `reasoning_effort` / `thinking_budget` over an agent's or the system's config for them (request
    > agent > system, as for every config field; the request's strategy_config still wins over its top-level ones)."""
    asked = {k: v for k, v in (("reasoning_effort", params.reasoning_effort), ("thinking_budget", params.thinking_budget)) if v is not None}
    overridden = {k: v for k, v in asked.items() if resolution.config_sources.get(k) in ("agent", "system")}
    if not overridden:
        return resolution
    sources = {**resolution.config_sources, **dict.fromkeys(overridden, "request")}
    return resolution.model_copy(update={"config": {**resolution.config, **overridden}, "config_sources": sources})


def _tokens_of(budget: BudgetSettings | BudgetParams) -> Budget:
    """The token limits of a budget (its deadline is the run's timeout, not a token limit)."""
    return Budget(**budget.model_dump(exclude={"deadline_s"}))


def _sampling(params: ExecuteParams) -> Sampling | None:
    if params.extra_body:
        return RunSampling(**(params.sampling.model_dump() if params.sampling else {}), extra_body=params.extra_body)
    return Sampling(**params.sampling.model_dump()) if params.sampling else None


def bounded_thinking(text: str) -> str:
    """`text` within MAX_REASONING_CHARS: its head and, longer, its tail (where the thinking reaches the answer)."""
    if len(text) <= MAX_REASONING_CHARS:
        return text
    marker = "\n[... {} characters of thinking omitted; the event log has them ...]\n"
    head = MAX_REASONING_CHARS // 8
    tail = MAX_REASONING_CHARS - head - len(marker.format(len(text)))
    return text[:head] + marker.format(len(text) - head - tail) + text[-tail:]


class _Teed(EventRecorder):
    """The run's recorder, also handing each event to the context's listener (a streaming subscriber).

    It remembers, per answer its LLM replies gave, the thinking of the last reply that gave it, so the result can
    return the thinking behind the run's answer (`thinking_behind`), wherever the call ran (a branch's events
    come back to this recorder too)."""

    MAX_ANSWERS = 256

    def __init__(self, path: Path | None, *, keep: bool, listener: EventSink | None, mode: RecordMode = "full") -> None:
        super().__init__(path, keep=keep, mode=mode)
        self.listener = listener
        self._thinking: dict[str, str] = {}

    def __call__(self, event: Event) -> None:
        super().__call__(event)
        if isinstance(event, LLMInvocation):
            for i, text in enumerate(event.responses):
                # the answer a reply gives, in the form answers are compared in: its `<answer>` block, else its whole text
                tagged = extract_answer(text)
                answer = normalize_answer(tagged if tagged is not None else strip_thinking(text))
                if not answer:
                    continue
                self._thinking.pop(answer, None)  # the latest reply giving an answer is the one kept
                self._thinking[answer] = bounded_thinking(event.reasoning[i] if i < len(event.reasoning) else "")
                if len(self._thinking) > self.MAX_ANSWERS:
                    del self._thinking[next(iter(self._thinking))]
        if self.listener is not None:
            self.listener(event)

    def thinking_behind(self, answer: str) -> str:
        """The thinking of the run's last reply whose answer is `answer` ("" when none gave it as it stands)."""
        return self._thinking.get(normalize_answer(answer), "") if answer else ""
