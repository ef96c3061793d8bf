"""The JSON-RPC methods ReasonRay serves, bound to a reasoning service.

Transport-free: the Serve ingress hands request bodies to the dispatcher built here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from reasonray.jsonrpc import Call, Dispatcher
from reasonray.service import ExecuteParams, ExecuteResult, ReasoningService

_TRACE_ID = re.compile(r"^[A-Za-z0-9._-]{8,128}$")


def new_trace_id() -> str:
    return uuid.uuid4().hex


def accept_trace_id(header: str | None) -> str | None:
    """A caller-supplied trace id (X-Trace-Id), when it is well formed."""
    return header if header and _TRACE_ID.match(header) else None


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


def build_dispatcher(
    service: ReasoningService, describe_strategies: Callable[[], Awaitable[dict[str, Any]]]
) -> Dispatcher:
    rpc = Dispatcher(new_trace_id)

    @rpc.method("reasoning.execute", ExecuteParams)
    async def execute(params: ExecuteParams, call: Call) -> ExecuteResult:
        """Run a reasoning strategy on a query and return the answer with metrics."""
        return await service.execute(params, call.trace_id)

    @rpc.method("reasoning.strategies", NoParams)
    async def strategies(params: NoParams, call: Call) -> dict[str, Any]:
        """The enabled strategies with their capabilities and config schemas, and the default."""
        return await describe_strategies()

    return rpc
