"""The session methods: `session.create`, `session.turn`, `session.resume`, `session.get`, `session.close`,
`session.tools`, declared once with their params, result and access (`SESSIONS`), served where the
application has sessions."""

from __future__ import annotations

from pydantic import Field

from reasonray.api import results
from reasonray.api.access.caps import check_text
from reasonray.api.context import Context, NoParams
from reasonray.api.declarations import EVERYONE, REASONERS, Access, Resource
from reasonray.api.jsonrpc import Call, Params, Table, declare
from reasonray.kernel.errors import ForbiddenError
from reasonray.reasoner.session import SESSION_ID, SessionSpec

SESSIONS: Table = {}


class SessionIdParams(Params):
    session_id: str = Field(pattern=SESSION_ID, description="The session's id, from session.create.")


class TurnParams(SessionIdParams):
    message: str = Field(min_length=1, description="The user's message for this turn (at most `[limits] max_query_chars` characters).")


class ToolResultParam(Params):
    tool_call_id: str = Field(min_length=1, max_length=128, description="The id of the pending call this answers.")
    content: str = Field(max_length=1_000_000, description="The tool's output (or its error message).")
    is_error: bool = Field(False, description="True when the client tool failed; the turn then ends with -32006.")


class ResumeParams(SessionIdParams):
    tool_results: list[ToolResultParam] = Field(min_length=1, max_length=64, description="One result per pending client call.")


def memory_search_for_admins(params: SessionSpec, sees_all: bool) -> None:
    """The memory_search tool takes its workspace from the model, which no owner check sees: with
    authentication on only admins get it (refused rather than leaked)."""
    if "memory_search" in params.server_tools and not sees_all:
        raise ForbiddenError("forbidden: the memory_search tool is for admins while authentication is on", {"tool": "memory_search"})


SESSION_RUN = Access(REASONERS, (Resource("session", "session_id", "write"),), limits="run")


@declare(
    SESSIONS, "session.create", access=Access(REASONERS, creates="session", checks=(memory_search_for_admins,)), mcp_tool="session_create"
)
async def session_create(ctx: Context, params: SessionSpec, call: Call) -> results.SessionCreateResult:
    """Start a session with its mode(s), server tools by name, client tools as schemas and bootstrap text."""
    return results.SessionCreateResult.of(await ctx.session_store.create(params), call.trace_id)


@declare(SESSIONS, "session.turn", access=SESSION_RUN, mcp_tool="session_turn")
async def session_turn(ctx: Context, params: TurnParams, call: Call) -> results.TurnResult:
    """A new turn: the final answer (exit mode 1) or pending client tool calls (exit mode 2), with the trace."""
    check_text("message", params.message, ctx.limits)
    return results.TurnResult.of(await ctx.session_store.turn(params.session_id, params.message, call.trace_id), call.trace_id)


@declare(SESSIONS, "session.resume", access=SESSION_RUN, mcp_tool="session_resume")
async def session_resume(ctx: Context, params: ResumeParams, call: Call) -> results.TurnResult:
    """Re-enter a turn with the results of its pending client tool calls."""
    tool_results = [r.model_dump() for r in params.tool_results]
    return results.TurnResult.of(await ctx.session_store.resume(params.session_id, tool_results, call.trace_id), call.trace_id)


@declare(SESSIONS, "session.get", access=Access(EVERYONE, (Resource("session", "session_id"),)), mcp_tool="session_get")
async def session_get(ctx: Context, params: SessionIdParams, call: Call) -> results.SessionGetResult:
    """The session's status, mode, pending calls and last turn's trace."""
    return results.SessionGetResult.of(await ctx.session_store.get(params.session_id), call.trace_id)


@declare(SESSIONS, "session.close", access=Access(REASONERS, (Resource("session", "session_id", "write"),)), mcp_tool="session_close")
async def session_close(ctx: Context, params: SessionIdParams, call: Call) -> results.SessionCloseResult:
    """Close the session: later turns are refused; its state stays readable."""
    return results.SessionCloseResult.of(await ctx.session_store.close(params.session_id), call.trace_id)


@declare(SESSIONS, "session.tools", access=Access(EVERYONE))
async def session_tools(ctx: Context, params: NoParams, call: Call) -> results.SessionToolsResult:
    """The server tools sessions can use, with their schemas."""
    return results.SessionToolsResult(server_tools=ctx.session_store.tools(), trace_id=call.trace_id)
