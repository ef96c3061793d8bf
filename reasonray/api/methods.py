"""The JSON-RPC methods ReasonRay serves, bound to a reasoning service.

Transport-free: the Serve ingress hands request bodies to the dispatcher built here.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reasonray.api import results
from reasonray.api.a2a_remote import forward, remote_registration
from reasonray.api.access.auth import REMOTE_AGENTS
from reasonray.api.access.caps import check_text
from reasonray.api.access.egress import Egress
from reasonray.api.declarations import EVERYONE, REASONERS, RESOLVED, Access, Resource
from reasonray.api.jsonrpc import Call, Dispatcher
from reasonray.api.memory import CacheStats, add_memory_methods
from reasonray.api.openrpc import add_discover
from reasonray.api.service import EXTRA_BODY_RIGHT, ExecuteParams, ExecuteResult, ReasoningService
from reasonray.api.stores.registry import (
    Registry,
)
from reasonray.kernel.config import CapSettings
from reasonray.kernel.errors import ForbiddenError, InvalidParamsError, describe_errors
from reasonray.kernel.sandbox import SandboxLimits
from reasonray.kernel.telemetry import Metrics
from reasonray.reasoner.session import SESSION_ID, Sessions, SessionSpec
from reasonray.strategies.agents import AGENT_ID, AgentRegistration

_TRACE_ID = re.compile(r"^[A-Za-z0-9._-]{8,128}$")


def new_trace_id() -> str:
    return uuid.uuid4().hex


def accept_trace_id(header: str | None) -> str | None:
    """A caller-supplied trace id (X-Trace-Id), when it is well formed."""
    return header if header and _TRACE_ID.match(header) else None


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BoundedContextParams(BaseModel):
    """Parameters of `reasoning.bounded_context`; omitted settings take the server's defaults."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, description="The problem to solve (at most `[limits] max_query_chars` characters).")
    chunk_size: int | None = Field(None, description="Max tokens per iteration (128-32768).")
    carryover_size: int | None = Field(None, description="Tokens carried forward (16-16384, below chunk_size).")
    max_iterations: int | None = Field(None, description="Max reasoning iterations (1-50).")
    carryover_mode: Literal["auto", "delethink", "tail", "summary"] | None = Field(
        None, description="auto, delethink (continue the model's thinking), tail or summary."
    )
    on_max_iterations: Literal["auto", "error", "final_answer"] | None = Field(None, description="What happens when iterations run out.")
    include_trace: bool = Field(False, description="Return the run's events as `trace`.")


class AgentIdParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: str = Field(pattern=AGENT_ID, description="The agent's id.")


class DiscoverParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    capabilities: list[str] = Field(
        default_factory=list, max_length=64, description="Agents advertising all of these are returned; empty: every agent."
    )


class SessionIdParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str = Field(pattern=SESSION_ID, description="The session's id, from session.create.")


class TurnParams(SessionIdParams):
    message: str = Field(min_length=1, description="The user's message for this turn (at most `[limits] max_query_chars` characters).")


class ToolResultParam(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=128, description="The id of the pending call this answers.")
    content: str = Field(max_length=1_000_000, description="The tool's output (or its error message).")
    is_error: bool = Field(False, description="True when the client tool failed; the turn then ends with -32006.")


class ResumeParams(SessionIdParams):
    tool_results: list[ToolResultParam] = Field(min_length=1, max_length=64, description="One result per pending client call.")


def _uses_memory(params: ExecuteParams) -> bool:
    return params.memory is not None and (params.memory.enabled or params.memory.learn)


def _learns(params: ExecuteParams) -> bool:
    return params.memory is not None and params.memory.learn


def memory_search_for_admins(params: SessionSpec, sees_all: bool) -> None:
    """The memory_search tool takes its workspace from the model, which no owner check sees: with
    authentication on only admins get it (refused rather than leaked)."""
    if "memory_search" in params.server_tools and not sees_all:
        raise ForbiddenError("forbidden: the memory_search tool is for admins while authentication is on", {"tool": "memory_search"})


# agent ids a client may take for the server's own (as the reserved workspaces are): an admin's to register,
# nobody else's to claim first
RESERVED_AGENT_IDS = frozenset({"default", "shared", "public", "global", "system", "admin", "reasonray"})


def reserved_agent_ids_for_admins(params: AgentRegistration, sees_all: bool) -> None:
    """With authentication on a card id is its first registrant's: a reserved one is left to admins."""
    if params.id in RESERVED_AGENT_IDS and not sees_all:
        raise InvalidParamsError(
            f"agent id {params.id!r} is reserved (reserved ids: {', '.join(sorted(RESERVED_AGENT_IDS))}); register under another id",
            {"id": params.id, "reserved": sorted(RESERVED_AGENT_IDS)},
        )


EXECUTE_ACCESS = Access(
    REASONERS,
    (Resource("workspace", "memory.workspace", personal=True, applies=_uses_memory, claims=_learns),),
    strategy=RESOLVED,
    limits="run",
    # fields passed unchecked to the model endpoint: a trusted caller's right, not every reasoner's
    right=lambda params: EXTRA_BODY_RIGHT if params.extra_body else None,
)
SESSION_RUN = Access(REASONERS, (Resource("session", "session_id", "write"),), limits="run")


def build_dispatcher(
    service: ReasoningService,
    registry: Registry,
    sessions: Sessions | None = None,
    *,
    cache_stats: CacheStats | None = None,
    sandbox: SandboxLimits = SandboxLimits(),
    metrics: Metrics | None = None,
    limits: CapSettings | None = None,
    egress: Egress | None = None,
) -> Dispatcher:
    """The API over a service; memory.*, stats.* and the ReasoningBank MCP tool aliases when the service has a memory bank."""
    limits = limits or CapSettings()
    egress = egress or Egress()  # no [egress] settings: remote agents are off
    rpc = Dispatcher(new_trace_id, metrics, max_batch_size=limits.max_batch_size, batch_concurrency=limits.batch_concurrency)

    @rpc.method("reasoning.execute", ExecuteParams, result=ExecuteResult, access=EXECUTE_ACCESS, stream=True, mcp_tool="reason")
    async def execute(params: ExecuteParams, call: Call) -> ExecuteResult | dict[str, Any]:
        """Run a reasoning strategy on a query and return the answer with metrics (naming a remote A2A agent: its answer)."""
        if params.agent_id is not None and (card := await registry.get_agent(params.agent_id)).get("a2a_card_url"):
            deadline_s = min((d for d in (service.deadline_s, params.budget.deadline_s if params.budget else None) if d), default=None)
            return await forward(card, params.query, params.strategy, call.trace_id, egress, deadline_s=deadline_s)  # docs/interop.md
        return await service.execute(params, call.trace_id)

    @rpc.method(
        "reasoning.bounded_context",
        BoundedContextParams,
        result=results.BoundedContextResult,
        access=Access(REASONERS, strategy="bounded_context", limits="run"),
    )
    async def bounded_context(params: BoundedContextParams, call: Call) -> dict[str, Any]:
        """Bounded-context reasoning with its settings as flat parameters, answered with per-iteration results and savings."""
        config = params.model_dump(exclude_none=True, exclude={"query", "include_trace"})
        try:  # ExecuteParams cleans the query further (found by tests/security fuzzing: a query of " ")
            execute_params = ExecuteParams(
                query=params.query, strategy="bounded_context", strategy_config=config, include_trace=params.include_trace
            )
        except ValidationError as exc:
            raise InvalidParamsError(f"invalid params: {describe_errors(exc)}") from None
        result = await service.execute(execute_params, call.trace_id)
        specific = result.metrics.strategy_specific
        return {
            "answer": result.answer,
            "reasoning": result.reasoning,
            "iterations": specific["iterations"],
            "total_tokens": result.metrics.total_tokens,
            "compute_savings_pct": specific["compute_savings_pct"],
            "total_iterations": specific["total_iterations"],
            "execution_time_ms": result.metrics.execution_time_ms,
            "metrics": result.metrics.model_dump(),
            "trace": result.trace,
            "trace_id": result.trace_id,
        }

    @rpc.method("reasoning.strategies", NoParams, result=results.StrategiesResult, access=Access(EVERYONE))
    async def strategies(params: NoParams, call: Call) -> dict[str, Any]:
        """The enabled strategies with their capabilities and config schemas, the default, and plugin failures."""
        return await registry.describe()

    @rpc.method(
        "agent.register",
        AgentRegistration,
        result=results.AgentRegisterResult,
        access=Access(
            REASONERS,
            (Resource("agent", "id", "claim"),),
            checks=(reserved_agent_ids_for_admins,),
            # the service would call a remote agent on callers' behalf: an operator's right, not every reasoner's
            right=lambda params: REMOTE_AGENTS if params.a2a_card_url is not None else None,
        ),
    )
    async def agent_register(params: AgentRegistration, call: Call) -> dict[str, Any]:
        """Register (or replace) an AgentCard; its strategies must exist and be enabled (a remote A2A agent: its card must be valid)."""
        if params.a2a_card_url is not None:  # a remote agent: its card fetched and validated, its skills advertised
            params = await remote_registration(params, egress)
        return await registry.register_agent(params.model_dump(mode="json"), sorted(rpc.methods))

    @rpc.method("agent.get", AgentIdParams, result=results.AgentResult, access=Access(EVERYONE, (Resource("agent", "agent_id"),)))
    async def agent_get(params: AgentIdParams, call: Call) -> dict[str, Any]:
        """One registered AgentCard."""
        return await registry.get_agent(params.agent_id)

    def visible(agents: list[dict[str, Any]], call: Call | None) -> list[dict[str, Any]]:
        """The cards the caller may see (the guard says which: `Call.visible`), every card without a guard."""
        seen = call.visible if call is not None else None
        return agents if seen is None else [a for a in agents if seen.allows(a["id"])]

    @rpc.method("agent.list", NoParams, result=results.AgentListResult, access=Access(EVERYONE, lists="agent"))
    async def agent_list(params: NoParams, call: Call) -> dict[str, Any]:
        """Every registered AgentCard."""
        return {"agents": visible(await registry.list_agents(), call)}

    @rpc.method("agent.discover", DiscoverParams, result=results.AgentDiscoverResult, access=Access(EVERYONE, lists="agent"))
    async def agent_discover(params: DiscoverParams, call: Call) -> dict[str, Any]:
        """The agents advertising all the given capabilities."""
        return {"capabilities": params.capabilities, "agents": visible(await registry.discover_agents(params.capabilities), call)}

    @rpc.method(
        "agent.unregister",
        AgentIdParams,
        result=results.AgentUnregisterResult,
        access=Access(REASONERS, (Resource("agent", "agent_id", "drop"),)),
    )
    async def agent_unregister(params: AgentIdParams, call: Call) -> dict[str, Any]:
        """Remove an AgentCard; requests naming it fail from then on."""
        return {"unregistered": await registry.unregister_agent(params.agent_id)}

    if sessions is not None:
        _session_methods(rpc, sessions, limits)
    if service.memory_loop is not None:
        add_memory_methods(rpc, service.memory_loop.client, service.memory_loop.settings, service, cache_stats=cache_stats, sandbox=sandbox)
    add_discover(rpc)  # rpc.discover: the OpenRPC document of the methods above
    return rpc


def _session_methods(rpc: Dispatcher, sessions: Sessions, limits: CapSettings) -> None:
    @rpc.method(
        "session.create",
        SessionSpec,
        result=results.SessionCreateResult,
        access=Access(REASONERS, creates="session", checks=(memory_search_for_admins,)),
        mcp_tool="session_create",
    )
    async def session_create(params: SessionSpec, call: Call) -> dict[str, Any]:
        """Start a session with its mode(s), server tools by name, client tools as schemas and bootstrap text."""
        return await sessions.create(params)

    @rpc.method("session.turn", TurnParams, result=results.TurnResult, access=SESSION_RUN, mcp_tool="session_turn")
    async def session_turn(params: TurnParams, call: Call) -> dict[str, Any]:
        """A new turn: the final answer (exit mode 1) or pending client tool calls (exit mode 2), with the trace."""
        check_text("message", params.message, limits)
        return await sessions.turn(params.session_id, params.message, call.trace_id)

    @rpc.method("session.resume", ResumeParams, result=results.TurnResult, access=SESSION_RUN, mcp_tool="session_resume")
    async def session_resume(params: ResumeParams, call: Call) -> dict[str, Any]:
        """Re-enter a turn with the results of its pending client tool calls."""
        results = [r.model_dump() for r in params.tool_results]
        return await sessions.resume(params.session_id, results, call.trace_id)

    @rpc.method(
        "session.get",
        SessionIdParams,
        result=results.SessionGetResult,
        access=Access(EVERYONE, (Resource("session", "session_id"),)),
        mcp_tool="session_get",
    )
    async def session_get(params: SessionIdParams, call: Call) -> dict[str, Any]:
        """The session's status, mode, pending calls and last turn's trace."""
        return await sessions.get(params.session_id)

    @rpc.method(
        "session.close",
        SessionIdParams,
        result=results.SessionCloseResult,
        access=Access(REASONERS, (Resource("session", "session_id", "write"),)),
        mcp_tool="session_close",
    )
    async def session_close(params: SessionIdParams, call: Call) -> dict[str, Any]:
        """Close the session: later turns are refused; its state stays readable."""
        return await sessions.close(params.session_id)

    @rpc.method("session.tools", NoParams, result=results.SessionToolsResult, access=Access(EVERYONE))
    async def session_tools(params: NoParams, call: Call) -> dict[str, Any]:
        """The server tools sessions can use, with their schemas."""
        return {"server_tools": sessions.tools()}
