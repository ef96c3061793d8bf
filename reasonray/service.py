"""The reasoning service: validated API parameters in, a strategy resolved and run, a result out.

Transport-free and Ray-free: the Serve ingress and the in-process tests drive the same object.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.protocol import LLM
from gateway.tokens import TokenCounter
from reasonray.agents import AGENT_ID, AgentCard
from reasonray.errors import InvalidParamsError, NotFoundError
from reasonray.events import EventRecorder, ObservedLLM, RunEnd, event_log_path
from reasonray.redact import redact
from strategies.base import Fanout, ReasoningResult, StrategyContext, local_fanout
from strategies.registry import Catalogue, Resolution

log = structlog.get_logger(__name__)

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


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
    ) -> None:
        self.catalogue = catalogue
        self.llm = llm
        self.tokens = tokens
        self.fanout = fanout
        self.agents = agents
        self.selection_budget_ms = selection_budget_ms
        self.data_dir = data_dir
        self.log_queries = log_queries

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

    async def execute(self, params: ExecuteParams, trace_id: str) -> ExecuteResult:
        resolution = await self.resolve(params)
        if self.log_queries:  # opt-in debug logging, personal data redacted
            log.debug("query.received", query=redact(params.query), strategy=resolution.strategy)
        strategy = self.catalogue.entries[resolution.strategy].strategy
        path = event_log_path(self.data_dir, trace_id) if self.data_dir is not None else None
        recorder = EventRecorder(path, keep=params.include_trace)
        context = StrategyContext(
            llm=ObservedLLM(self.llm, recorder, trace_id=trace_id, strategy=resolution.strategy),
            tokens=self.tokens,
            emit=recorder,
            trace_id=trace_id,
            fanout=self.fanout,
        )
        try:
            result = await strategy.reason(params.query, context=context, config=resolution.config)
        except Exception as exc:
            recorder(self._run_end(context, resolution.strategy, error=exc))
            raise
        else:
            recorder(self._run_end(context, resolution.strategy))
        finally:
            recorder.close()
        return ExecuteResult(
            **result.model_dump(exclude={"trace"}),
            trace=recorder.as_trace() if params.include_trace else None,
            trace_id=trace_id,
            resolution=resolution,
        )

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
