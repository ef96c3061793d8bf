"""The reasoning service: validated API parameters in, a strategy resolved and run, a result out.

Transport-free and Ray-free: the Serve ingress and the in-process tests drive the same object.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.protocol import LLM
from gateway.tokens import TokenCounter
from memory.learning import Verifier
from memory.service import MemoryClient
from reasonray.agents import AGENT_ID, AgentCard
from reasonray.config import BudgetSettings, MemorySettings
from reasonray.errors import InvalidParamsError, NotFoundError, StrategyUnavailableError
from reasonray.events import Budget, EventRecorder, ObservedLLM, RunEnd, event_log_path
from reasonray.memory_loop import MemoryLoop, MemoryParams, MemoryReport, TrajectoryCapture
from reasonray.redact import redact
from reasonray.telemetry import Metrics, NoMetrics, record_run
from strategies.base import Fanout, ReasoningResult, ReasoningStrategy, StrategyContext, local_fanout
from strategies.registry import Catalogue, Resolution

log = structlog.get_logger(__name__)

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class BudgetParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_prompt_tokens: int | None = Field(None, ge=64, description="Prompts above this are cut, head and tail kept, with a WARNING event.")
    max_output_tokens: int | None = Field(None, ge=1, description="Caps every call's max_tokens.")
    max_total_tokens: int | None = Field(None, ge=1, description="Prompt plus completion tokens the whole request may spend.")


class ExecuteParams(BaseModel):
    """Parameters of `reasoning.execute` (seed 000, FR-6.2)."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=100_000, description="The problem to solve.")
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


AgentLookup = Callable[[str], Awaitable[AgentCard]]
"""Fetches a registered AgentCard by id, raising NotFoundError when there is none."""


async def no_agents(agent_id: str) -> AgentCard:
    raise NotFoundError(f"no agent with id {agent_id!r}; this service has no agent directory", {"agent_id": agent_id})


class ReasoningService:
    """Resolves and runs strategies against one LLM stack."""

    def __init__(
        self,
        catalogue: Catalogue,
        llm: LLM,
        tokens: TokenCounter,
        *,
        fanout: Fanout = local_fanout,
        agents: AgentLookup = no_agents,
        selection_budget_ms: float = 50.0,
        data_dir: Path | None = None,
        log_queries: bool = False,
        memory: MemoryClient | None = None,
        memory_settings: MemorySettings | None = None,
        budget: BudgetSettings | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.llm = llm
        self.tokens = tokens
        self.fanout = fanout
        self.agents = agents
        self.selection_budget_ms = selection_budget_ms
        self.data_dir = data_dir
        self.log_queries = log_queries
        self.memory = memory
        self.memory_loop = MemoryLoop(memory, memory_settings or MemorySettings()) if memory is not None else None
        self.budget = Budget(**(budget or BudgetSettings()).model_dump())
        self.metrics = metrics or NoMetrics()
        self._background: set[asyncio.Task] = set()

    def resolve_strategy(self, name: str, config: dict[str, Any]) -> tuple[ReasoningStrategy, dict[str, Any]]:
        """Another enabled strategy with its effective config, for strategies that compose others (MaTTS)."""
        resolution = self.catalogue.resolve(name, config)
        return self.catalogue.entries[resolution.strategy].strategy, resolution.config

    async def resolve(self, params: ExecuteParams) -> Resolution:
        agent = await self.agents(params.agent_id) if params.agent_id else None
        if agent is not None and "reasoning.execute" not in agent.supported_methods:
            raise InvalidParamsError(
                f"agent {agent.id!r} does not support reasoning.execute (its methods: {', '.join(agent.supported_methods)}); "
                "re-register it with reasoning.execute in supported_methods",
                {"agent_id": agent.id},
            )
        started = time.perf_counter()
        resolution = self.catalogue.resolve(params.strategy, params.strategy_config, agent=agent)
        took_ms = (time.perf_counter() - started) * 1000
        if took_ms > self.selection_budget_ms:
            log.warning("strategy.selection_slow", took_ms=round(took_ms, 3), budget_ms=self.selection_budget_ms)
        return resolution

    async def execute(self, params: ExecuteParams, trace_id: str, *, verifier: Verifier | None = None) -> ExecuteResult:
        resolution = await self.resolve(params)
        if self.log_queries:  # opt-in debug logging, personal data redacted
            log.debug("query.received", query=redact(params.query), strategy=resolution.strategy)
        memory = self._memory_params(params)
        strategy = self.catalogue.entries[resolution.strategy].strategy
        path = event_log_path(self.data_dir, trace_id) if self.data_dir is not None else None
        recorder = EventRecorder(path, keep=params.include_trace)
        # a run that learns keeps its replies (its trajectory); others keep no history in memory
        capture = TrajectoryCapture(recorder) if memory is not None and memory.learn else None
        sink = capture or recorder
        budget = self.budget.tightest(Budget(**params.budget.model_dump()) if params.budget else None)
        context = StrategyContext(
            llm=ObservedLLM(self.llm, sink, trace_id=trace_id, strategy=resolution.strategy, budget=budget, counter=self.tokens),
            tokens=self.tokens,
            emit=sink,
            trace_id=trace_id,
            fanout=self.fanout,
            resolve=self.resolve_strategy,
        )
        report = self.memory_loop.report(memory, trace_id) if self.memory_loop is not None else None
        try:
            if memory is not None and memory.enabled and report is not None:
                await self.memory_loop.retrieve(memory, report, context.llm, sink, params.query)
            result = await strategy.reason(params.query, context=context, config=resolution.config)
            if report is not None:
                await self._learn(memory, report, context, capture, params.query, result, verifier)
                result.metrics = context.metrics(**result.metrics.strategy_specific)  # learning's calls count too
        except Exception as exc:
            recorder(self._run_end(context, resolution.strategy, error=exc))
            self._record_run(context, ok=False)
            self._meter(context, resolution.strategy, getattr(exc, "data", None))
            raise
        else:
            recorder(self._run_end(context, resolution.strategy))
            self._record_run(context, ok=True)
            self._meter(context, resolution.strategy, result.metrics.strategy_specific)
        finally:
            recorder.close()
        return ExecuteResult(
            **result.model_dump(exclude={"trace"}),
            trace=recorder.as_trace() if params.include_trace else None,
            trace_id=trace_id,
            resolution=resolution,
            memory=report if memory is not None or (report is not None and report.passive) else None,
        )

    def _memory_params(self, params: ExecuteParams) -> MemoryParams | None:
        if params.memory is not None and self.memory_loop is None:
            raise StrategyUnavailableError(
                "this server has no memory bank ([memory] enabled = false); omit `memory` or ask an operator to enable it",
                {"available": []},
            )
        return params.memory

    async def _learn(
        self,
        memory: MemoryParams | None,
        report: MemoryReport,
        context: StrategyContext,
        capture: TrajectoryCapture | None,
        query: str,
        result: ReasoningResult,
        verifier: Verifier | None,
    ) -> None:
        assert self.memory_loop is not None
        if memory is not None and capture is not None:  # memory.learn
            trajectories = context.trajectories or [capture.trajectory(result.answer)]
            await self.memory_loop.learn(memory, report, context.llm, capture, query, trajectories, verifier)
        elif self.memory_loop.settings.passive_learning:
            await self.memory_loop.passive(report, context.llm, context.emit, query, result.answer)

    def _meter(self, context: StrategyContext, strategy: str, specific: dict[str, Any] | None) -> None:
        t = context.llm.tally
        record_run(self.metrics, strategy, t.prompt_tokens, t.completion_tokens, specific)

    def _record_run(self, context: StrategyContext, ok: bool) -> None:
        """Count the run in the bank's statistics (LLM calls, cache hits), without making the caller wait."""
        if self.memory is None:
            return
        t = context.llm.tally
        tally = {"calls": t.calls, "cache_hits": t.cache_hits, "retries": t.retries,
                 "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens}
        task = asyncio.ensure_future(self.memory.call("record_run", tally, ok))
        self._background.add(task)
        task.add_done_callback(self._recorded)

    def _recorded(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("memory.stats_not_recorded", error=f"{type(task.exception()).__name__}: {task.exception()}"[:300])

    @staticmethod
    def _run_end(context: StrategyContext, strategy: str, error: Exception | None = None) -> RunEnd:
        t = context.llm.tally
        return RunEnd(
            trace_id=context.trace_id,
            strategy=strategy,
            status="error" if error else "ok",
            total_tokens=t.prompt_tokens + t.completion_tokens,
            execution_time_ms=context.elapsed_ms(),
            error=type(error).__name__ if error else None,
        )
