"""The `ReasoningStrategy` protocol, the context a strategy receives, and the result contract.

A strategy gets everything it may touch through `StrategyContext`: the LLM (already cached,
retried and observed), the token counter, the event sink and `fan_out`, which runs independent
branches concurrently (asyncio in-process; Ray tasks behind Serve, so a cluster spreads them). It
returns a `ReasoningResult` whose standard metrics `context.result(...)` fills in from what the
run's LLM calls added up to, branches included.

Every strategy config takes `reasoning_effort` and `thinking_budget`; while a `Strategy` runs, every
request of its run (fan-out branches included) carries them unless the request sets its own.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reasonray.gateway.observed import ObservedLLM, Sampling
from reasonray.gateway.protocol import LLMRequest
from reasonray.gateway.tokens import TokenCounter
from reasonray.kernel.errors import (
    BudgetExceededError,
    DeadlineExceededError,
    InvalidParamsError,
    ReasonRayError,
    RunCancelledError,
    describe_errors,
    error_type_of,
    json_safe_errors,
)
from reasonray.kernel.events import EventSink, RunWarning
from reasonray.memory.items import Trajectory

T = TypeVar("T")


class ReasoningMetrics(BaseModel):
    total_tokens: int = Field(description="Prompt plus completion tokens over every LLM call of the run.")
    prompt_tokens: int = Field(description="Tokens sent to the model over the run.")
    completion_tokens: int = Field(description="Tokens the model generated over the run.")
    reasoning_tokens: int = Field(
        0, description="Of completion_tokens, those the model spent thinking over the run (visible or hidden), as its server counted them."
    )
    thinking_unenforced: int = Field(
        0,
        description="LLM calls whose thinking budget the endpoint could neither take (reasoning_effort) nor enforce (prefix "
        "continuation): their thinking ran unbounded by it.",
    )
    execution_time_ms: int = Field(description="Wall time of the strategy, in milliseconds.")
    llm_calls: int = Field(description="LLM calls made, cache hits included.")
    cache_hits: int = Field(description="LLM calls answered from the response cache.")
    retries: int = Field(description="Extra attempts spent on transient provider failures.")
    model: str = Field(description="The model that answered.")
    simulated: bool = Field(description="True when the answer came from the simulated model, not a real LLM.")
    strategy_specific: dict[str, Any] = Field(default_factory=dict, description="Metrics particular to the strategy.")


class ReasoningResult(BaseModel):
    answer: str = Field(description="The final answer, reasoning tags stripped.")
    reasoning: str = Field(
        "",
        description="The model's thinking behind the answer: that of the run's last LLM call whose reply gave the answer "
        "(at most 32,000 characters, head and tail kept); empty when the model thinks out of sight or no single reply gave it.",
    )
    strategy_used: str = Field(description="The strategy that ran.")
    metrics: ReasoningMetrics
    trace: list[dict[str, Any]] | None = Field(None, description="The run's events, when the request asked for them.")


Branch = Callable[["StrategyContext"], Awaitable[T]]
"""One unit of parallel work: `async def branch(context) -> value`.

A branch may run in another process, so it must pickle: a module-level function, or a
`functools.partial` of one over picklable arguments, never a closure over the caller's context.
Its LLM calls and events count towards the run that fanned it out.
"""


Arrived = Callable[[int, T], None]
"""Called in the fanning-out process with a branch's index and value as soon as that branch finishes."""


class Fanout(Protocol):
    """Runs independent branches concurrently and returns their values in order.

    `label` names the branches in events and in Ray (e.g. "tree_of_thought.expand"). `arrived`, when
    given, sees each value as it comes in, before the slower branches finish: a run interrupted while
    they run (a deadline, a cancellation) still knows what finished.
    """

    async def __call__(
        self, context: StrategyContext, branches: Sequence[Branch[T]], *, label: str, arrived: Arrived[T] | None = None
    ) -> list[T]: ...


async def local_fanout(
    context: StrategyContext, branches: Sequence[Branch[T]], *, label: str, arrived: Arrived[T] | None = None
) -> list[T]:
    """Branches as coroutines on the caller's event loop, sharing its context."""

    async def run(index: int, branch: Branch[T]) -> T:
        value = await branch(context)
        if arrived is not None:
            arrived(index, value)
        return value

    return list(await asyncio.gather(*(run(i, branch) for i, branch in enumerate(branches))))


@dataclass(frozen=True)
class Thinking:
    """How long the model thinks on the calls of a run, from its strategy config (None: the request's own choice)."""

    reasoning_effort: Literal["low", "medium", "high"] | None = None
    thinking_budget: int | None = None

    def __bool__(self) -> bool:
        return self.reasoning_effort is not None or self.thinking_budget is not None


RUN_THINKING: ContextVar[Thinking] = ContextVar("reasonray_run_thinking", default=Thinking())  # noqa: B039 (frozen)
"""The running strategy's thinking settings. A context variable, so concurrent branches in one process each see
their own strategy's."""


class ThinkingSampling(Sampling, frozen=True, omit_defaults=True):
    """The run's sampling, which also fills in the running strategy's thinking settings (RUN_THINKING)."""

    def apply(self, request: LLMRequest) -> LLMRequest:
        # only where the request sets none of its own: a forced answer's budget of 0 stays 0
        changes = {k: v for k, v in asdict(RUN_THINKING.get()).items() if v is not None and getattr(request, k) is None}
        return super().apply(msgspec.structs.replace(request, **changes) if changes else request)


@contextmanager
def thinking_of(settings: Thinking, llm: ObservedLLM) -> Iterator[None]:
    """Within the block, `llm`'s requests carry `settings` (over an enclosing strategy's) unless they set their own."""
    if settings and not isinstance(llm.sampling, ThinkingSampling):  # apply RUN_THINKING, keeping the caller's sampling
        llm.sampling = ThinkingSampling(**(msgspec.structs.asdict(llm.sampling) if llm.sampling is not None else {}))
    # these settings where set, an enclosing strategy's elsewhere
    token = RUN_THINKING.set(replace(RUN_THINKING.get(), **{k: v for k, v in asdict(settings).items() if v is not None}))
    try:
        yield
    finally:
        RUN_THINKING.reset(token)


async def thinking_branch(settings: Thinking, branch: Branch[T], context: StrategyContext) -> T:
    """`branch` with its fanning-out strategy's thinking settings, wherever it runs (another process has its own
    RUN_THINKING)."""
    with thinking_of(settings, context.llm):
        return await branch(context)


@dataclass
class Failed:
    """A branch that raised, as `fan_out_settled` returns it (its error crossed processes by value)."""

    error: Exception


RUN_ENDING: tuple[type[ReasonRayError], ...] = (RunCancelledError, DeadlineExceededError, BudgetExceededError)
"""Errors no branch outlives: the run was cancelled, passed its deadline or spent the caller's budget, so no other
branch can still answer for it."""


def ends_run(exc: BaseException) -> bool:
    """True when `exc` fails the whole run at once: one of `RUN_ENDING`, or an error ReasonRay does not raise on
    purpose (a bug, not a lost vote). Any other error (the provider failed, the model's reply was unusable) costs
    only the branch that met it."""
    return isinstance(exc, RUN_ENDING) or not isinstance(exc, ReasonRayError)


def failure_kinds(errors: Sequence[BaseException]) -> dict[str, int]:
    """How many failed branches failed each way, by the error type clients see (`provider_unavailable`: 2)."""
    return dict(Counter(error_type_of(exc) for exc in errors))


async def settled(branch: Branch[T], context: StrategyContext) -> T | Failed:
    """Run `branch`, returning its error as a value, so the other branches' results survive it; an error that
    `ends_run` is raised, failing the fan-out at once (which stops the other branches)."""
    try:
        return await branch(context)
    except Exception as exc:
        if ends_run(exc):
            raise
        return Failed(exc)


Resolver = Callable[[str, dict[str, Any]], tuple["ReasoningStrategy", dict[str, Any]]]
"""Looks up another enabled strategy by name with its effective config (system defaults merged in)."""


def no_resolver(name: str, config: dict[str, Any]) -> tuple[ReasoningStrategy, dict[str, Any]]:
    raise InvalidParamsError(f"strategy {name!r} cannot be composed here: this context has no strategy catalogue")


@dataclass
class StrategyContext:
    llm: ObservedLLM
    tokens: TokenCounter
    emit: EventSink
    trace_id: str
    fanout: Fanout = local_fanout
    resolve: Resolver = no_resolver
    started: float = field(default_factory=time.perf_counter)
    trajectories: list[Trajectory] = field(default_factory=list)
    """Attempts a strategy reports for learning (MaTTS, refine); empty: the run's LLM output is the trajectory."""
    progress: dict[str, Any] = field(default_factory=dict)
    """What the run achieved so far, in the strategy's documented partial shape (docs/strategies/*.md),
    kept up to date as it goes: when the run fails part-way (provider, budget, deadline, cancellation)
    the service returns it as `error.data.partial`. An `answer` key is one the strategy could stand
    behind (a majority of finished samples, the best answer seen): with `[reasoning] degraded_answers`
    the service returns it, marked degraded, instead of the error."""

    def result(self, strategy: str, answer: str, **strategy_specific: Any) -> ReasoningResult:
        return ReasoningResult(answer=answer, strategy_used=strategy, metrics=self.metrics(**strategy_specific))

    def metrics(self, **strategy_specific: Any) -> ReasoningMetrics:
        """The run's standard metrics so far, from what its LLM calls (branches included) added up to."""
        tally = msgspec.structs.asdict(self.llm.tally)  # the token counts, cache hits, retries and simulated by their own names
        calls, model = tally.pop("calls"), tally.pop("model")
        return ReasoningMetrics(
            **tally,
            total_tokens=tally["prompt_tokens"] + tally["completion_tokens"],
            execution_time_ms=self.elapsed_ms(),
            llm_calls=calls,
            model=model or self.llm.model,
            strategy_specific=strategy_specific,
        )

    async def fan_out(self, branches: Sequence[Branch[T]], *, label: str) -> list[T]:
        """Run `branches` concurrently through this context's fanout; values come back in order."""
        return await self.fanout(self, self._thinking(branches), label=label)

    async def fan_out_settled(
        self, branches: Sequence[Branch[T]], *, label: str, arrived: Arrived[T | Failed] | None = None
    ) -> list[T | Failed]:
        """Like `fan_out`, but a failing branch becomes a `Failed` in its place instead of failing the lot;
        `arrived` sees each branch's value or `Failed` as it settles."""
        return await self.fanout(self, [partial(settled, branch) for branch in self._thinking(branches)], label=label, arrived=arrived)

    @staticmethod
    def _thinking(branches: Sequence[Branch[T]]) -> Sequence[Branch[T]]:
        """The branches, carrying the running strategy's thinking settings when it has any."""
        settings = RUN_THINKING.get()
        return [partial(thinking_branch, settings, branch) for branch in branches] if settings else branches

    def warn(self, strategy: str, code: str, message: str) -> None:
        """A WARNING event: something was degraded to keep the run going."""
        self.emit(RunWarning(trace_id=self.trace_id, strategy=strategy, code=code, message=message))

    def elapsed_ms(self) -> int:
        return round((time.perf_counter() - self.started) * 1000)


@runtime_checkable
class ReasoningStrategy(Protocol):
    """What every strategy implements. `reason` takes `context=` and `config=`."""

    name: ClassVar[str]

    async def reason(self, query: str, **kwargs: Any) -> ReasoningResult: ...

    def get_config_schema(self) -> dict[str, Any]: ...

    def get_capabilities(self) -> list[str]: ...


class StrategyConfig(BaseModel):
    """Base of per-request strategy configs: unknown keys are errors, every field has a description."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        None, description="How hard a reasoning model thinks on every call of the run (low, medium, high); None: the model's default."
    )
    thinking_budget: int | None = Field(
        None,
        ge=0,
        le=262_144,
        description="Most tokens a reasoning model may think per call of the run before it must answer; None: no limit.",
    )

    @property
    def thinking(self) -> Thinking:
        return Thinking(self.reasoning_effort, self.thinking_budget)


class StrategySettings(BaseModel):
    """Base of system-level strategy settings (limits from config.toml, not per-request knobs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Strategy:
    """Convenience base: config/settings models as class attributes, schema and capabilities derived."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Config: ClassVar[type[StrategyConfig]] = StrategyConfig
    Settings: ClassVar[type[StrategySettings]] = StrategySettings
    extra_capabilities: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        reason = cls.__dict__.get("reason")
        if reason is not None and not getattr(reason, "applies_thinking", False):
            cls.reason = _applying_thinking(reason)  # type: ignore[method-assign,assignment]

    def __init__(self, settings: StrategySettings | None = None) -> None:
        self.settings = settings or self.Settings()

    def get_config_schema(self) -> dict[str, Any]:
        return self.Config.model_json_schema()

    def get_capabilities(self) -> list[str]:
        return [f"reasoning.strategy.{self.name}", *self.extra_capabilities]

    def parse_config(self, config: StrategyConfig | dict[str, Any] | None) -> StrategyConfig:
        if isinstance(config, self.Config):
            return config
        try:
            return self.Config.model_validate(config or {})
        except ValidationError as exc:
            raise InvalidParamsError(
                f"invalid strategy_config for {self.name}: {describe_errors(exc)}",
                {"errors": json_safe_errors(exc), "config_schema": self.get_config_schema()},
            ) from None

    async def reason(self, query: str, **kwargs: Any) -> ReasoningResult:
        raise NotImplementedError


Reason = Callable[..., Awaitable[ReasoningResult]]


def _applying_thinking(reason: Reason) -> Reason:
    """`reason` run with its config's `reasoning_effort` / `thinking_budget` on every request of the run, so no
    strategy has to pass them into each LLMRequest it builds."""

    @functools.wraps(reason)
    async def wrapper(self: Strategy, query: str, *args: Any, **kwargs: Any) -> ReasoningResult:
        context, config = kwargs.get("context"), kwargs.get("config")
        if not isinstance(context, StrategyContext):
            return await reason(self, query, *args, **kwargs)
        if isinstance(config, dict) and (config.get("reasoning_effort") is not None or config.get("thinking_budget") is not None):
            config = self.parse_config(config)  # a config is parsed here only when it names them: the strategy parses it
        with thinking_of(config.thinking if isinstance(config, StrategyConfig) else Thinking(), context.llm):
            return await reason(self, query, *args, **kwargs)

    wrapper.applies_thinking = True  # type: ignore[attr-defined]
    return wrapper
