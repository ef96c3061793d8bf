"""The reasoning methods: `reasoning.execute`, `reasoning.bounded_context`, `reasoning.strategies`.

Each is a module-level function declared once with its params, result and access (`REASONING`), served by
`Dispatcher.add` on every surface.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from reasonray.api import results
from reasonray.api.a2a_remote import forward
from reasonray.api.context import Context, NoParams
from reasonray.api.declarations import EVERYONE, REASONERS, RESOLVED, Access, Resource
from reasonray.api.jsonrpc import Call, Params, Table, declare
from reasonray.api.service import EXTRA_BODY_RIGHT, ExecuteParams, ExecuteResult

REASONING: Table = {}


class BoundedContextParams(Params):
    """Parameters of `reasoning.bounded_context`; omitted settings take the server's defaults."""

    query: str = Field(min_length=1, description="The problem to solve (at most `[limits] max_query_chars` characters).")
    chunk_size: int | None = Field(None, description="Max tokens per iteration (128-32768).")
    carryover_size: int | None = Field(None, description="Tokens carried forward (16-16384, below chunk_size).")
    max_iterations: int | None = Field(None, description="Max reasoning iterations (1-50).")
    carryover_mode: Literal["auto", "delethink", "tail", "summary"] | None = Field(
        None, description="auto, delethink (continue the model's thinking), tail or summary."
    )
    on_max_iterations: Literal["auto", "error", "final_answer"] | None = Field(None, description="What happens when iterations run out.")
    include_trace: bool = Field(False, description="Return the run's events as `trace`.")


def _uses_memory(params: ExecuteParams) -> bool:
    return params.memory is not None and (params.memory.enabled or params.memory.learn)


def _learns(params: ExecuteParams) -> bool:
    return params.memory is not None and params.memory.learn


EXECUTE_ACCESS = Access(
    REASONERS,
    (Resource("workspace", "memory.workspace", personal=True, applies=_uses_memory, claims=_learns),),
    strategy=RESOLVED,
    limits="run",
    # fields passed unchecked to the model endpoint: a trusted caller's right, not every reasoner's
    right=lambda params: EXTRA_BODY_RIGHT if params.extra_body else None,
)


@declare(REASONING, "reasoning.execute", access=EXECUTE_ACCESS, stream=True, mcp_tool="reason")
async def execute(ctx: Context, params: ExecuteParams, call: Call) -> ExecuteResult:
    """Run a reasoning strategy on a query and return the answer with metrics (naming a remote A2A agent: its answer)."""
    if params.agent_id is not None and (card := await ctx.registry.get_agent(params.agent_id)).a2a_card_url:
        deadline_s = ctx.service.deadline_s(params.budget)
        return await forward(
            card.model_dump(mode="json"), params.query, params.strategy, call.trace_id, ctx.egress, deadline_s=deadline_s
        )  # docs/interop.md
    return await ctx.service.execute(params, call.trace_id)


@declare(
    REASONING,
    "reasoning.bounded_context",
    access=Access(REASONERS, strategy="bounded_context", limits="run"),
)
async def bounded_context(ctx: Context, params: BoundedContextParams, call: Call) -> results.BoundedContextResult:
    """Bounded-context reasoning with its settings as flat parameters, answered with per-iteration results and savings."""
    config = params.model_dump(exclude_none=True, exclude={"query", "include_trace"})
    run = ExecuteParams.checked(query=params.query, strategy="bounded_context", strategy_config=config, include_trace=params.include_trace)
    result = await ctx.service.execute(run, call.trace_id)
    m = result.metrics
    record = {k: m.strategy_specific[k] for k in ("iterations", "compute_savings_pct", "total_iterations")}
    record |= {"answer": result.answer, "reasoning": result.reasoning, "total_tokens": m.total_tokens, "trace": result.trace}
    return results.BoundedContextResult.of({**record, "execution_time_ms": m.execution_time_ms, "metrics": m}, result.trace_id)


@declare(REASONING, "reasoning.strategies", access=Access(EVERYONE))
async def strategies(ctx: Context, params: NoParams, call: Call) -> results.StrategiesResult:
    """The enabled strategies with their capabilities and config schemas, the default, and plugin failures."""
    return results.StrategiesResult.of(await ctx.registry.describe(), call.trace_id)
