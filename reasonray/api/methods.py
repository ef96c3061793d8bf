"""The method table: the JSON-RPC methods ReasonRay serves, bound to one application's context.

Each method is a module-level function in its domain's module, declared there with its params, result
and access (`reasonray.api.jsonrpc.declare`): reasoning.* in `reasoning.py`, agent.* in `directory.py`,
session.* in `sessions.py`, memory.* and the ReasoningBank aliases in `memory.py`, stats.* in `stats.py`.
To add a method, declare it in its domain's table; `build_dispatcher` serves the tables.

Transport-free: the Serve ingress hands request bodies to the dispatcher built here.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import replace

from reasonray.api.context import Context
from reasonray.api.directory import AGENTS
from reasonray.api.jsonrpc import Dispatcher, Method
from reasonray.api.memory import MEMORY
from reasonray.api.openrpc import add_discover
from reasonray.api.reasoning import REASONING
from reasonray.api.sessions import SESSIONS
from reasonray.api.stats import STATS
from reasonray.kernel.telemetry import Metrics

_TRACE_ID = re.compile(r"^[A-Za-z0-9._-]{8,128}$")


def new_trace_id() -> str:
    return uuid.uuid4().hex


def accept_trace_id(header: str | None) -> str | None:
    """A caller-supplied trace id (X-Trace-Id), when it is well formed."""
    return header if header and _TRACE_ID.match(header) else None


TABLES = (REASONING, AGENTS, SESSIONS, MEMORY, STATS)


def declared(name: str) -> Method:
    """A method's declaration by name (the REST mirrors take their models from it)."""
    return next(table[name] for table in TABLES if name in table)


def build_dispatcher(ctx: Context, metrics: Metrics | None = None) -> Dispatcher:
    """The API over a context's service; session.* with sessions, memory.*, stats.* and the ReasoningBank MCP
    tool aliases when the service has a memory bank, and rpc.discover."""
    rpc = Dispatcher(new_trace_id, metrics, ctx.limits)
    ctx = replace(ctx, methods=rpc.methods)  # agent.register checks a card's methods against the served table
    rpc.add(REASONING | AGENTS, ctx)
    if ctx.sessions is not None:
        rpc.add(SESSIONS, ctx)
    if ctx.service.memory_loop is not None:
        rpc.add(MEMORY | STATS, ctx)
    add_discover(rpc)  # rpc.discover: the OpenRPC document of the methods above
    return rpc
