"""JSON-RPC 2.0 in full: single and batch calls, notifications, and one table from errors to codes.

The protocol's own codes (-32700, -32600, -32601, -32602, -32603) are named here; every other code is its
error class's (`reasonray.kernel.errors`: `error_classes` walks the tree). docs/api.md ("Errors") lists them all
with their meaning and `data`. -32001 is "max iterations reached" as the specification fixes it; until
2026-11-28 it was "unauthenticated" and max iterations was -32009. -32009 is retired: nothing answers it, so
no client reads a new meaning into it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
import typing
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Literal, NotRequired, TypedDict, TypeVar

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from reasonray.api.declarations import Access, Visible
from reasonray.gateway.errors import (
    CircuitOpenError,
    LLMConfigError,
    LLMError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from reasonray.kernel.config import CapSettings
from reasonray.kernel.errors import ReasonRayError, describe_errors, json_safe_errors
from reasonray.kernel.telemetry import Metrics, NoMetrics

log = structlog.get_logger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

CODE_NAMES = {
    PARSE_ERROR: "parse_error",
    INVALID_REQUEST: "invalid_request",
    METHOD_NOT_FOUND: "method_not_found",
    INVALID_PARAMS: "invalid_params",
    INTERNAL_ERROR: "internal",
}
PROTOCOL_HTTP_STATUS = {PARSE_ERROR: 400, INVALID_REQUEST: 400, METHOD_NOT_FOUND: 404, INVALID_PARAMS: 400, INTERNAL_ERROR: 500}


def provider_summary(exc: LLMError) -> str:
    """What the caller may know of a provider failure: what happened, never the URL or the body (those are logged)."""
    if isinstance(exc, CircuitOpenError):
        return f"the model provider is failing: calls fail fast for another {exc.retry_after_s:.1f}s (circuit breaker open); retry later"
    if isinstance(exc, ProviderUnavailableError):
        how = f"HTTP {exc.status_code}" if exc.status_code else "no response: timeout or connection error"
        return f"the model provider failed after {exc.attempts} attempt(s) ({how}); retry later"
    if isinstance(exc, ProviderRejectedError):
        return f"the model provider refused the request (HTTP {exc.status_code}); check the model name and the request's size"
    if isinstance(exc, LLMConfigError):
        return "the model provider is not configured correctly; an operator must check the [llm] settings"
    return "the model provider failed; quote the trace_id when reporting it"


class ErrorObject(TypedDict):
    """A JSON-RPC error object as it goes on the wire."""

    code: int
    message: str
    data: NotRequired[dict[str, Any]]


class Response(TypedDict):
    """A JSON-RPC response object as it goes on the wire: `result` when the call succeeded, `error` when it failed."""

    jsonrpc: Literal["2.0"]
    result: NotRequired[Any]
    error: NotRequired[ErrorObject]
    id: Any


class RpcError(ReasonRayError):
    """A JSON-RPC error as it goes on the wire (protocol errors are raised as this directly)."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None, http_status: int | None = None) -> None:
        super().__init__(message, data)
        self.code = code
        # the REST mirrors' status: the raised error class's own, else the protocol error's
        self.http_status = http_status or PROTOCOL_HTTP_STATUS.get(code, 500)

    def body(self) -> ErrorObject:
        """The error object as it goes on the wire: code, message and (when any) data."""
        body = ErrorObject(code=self.code, message=self.message)
        if self.data:
            body["data"] = self.data
        return body


def error_classes(root: type[ReasonRayError] = ReasonRayError) -> list[type[ReasonRayError]]:
    """Every error class of the tree under `root` (the error table: each class names its code, status and type)."""
    below = [cls for sub in reversed(root.__subclasses__()) for cls in error_classes(sub)]
    return [cls for cls in (root, *below) if cls is not RpcError]


def error_for(exc: Exception) -> RpcError:
    """The JSON-RPC error for an exception, from its class; unknown exceptions (bugs) hide their details."""
    if isinstance(exc, RpcError):
        return exc
    if not isinstance(exc, ReasonRayError):
        return RpcError(INTERNAL_ERROR, "internal error; quote the trace_id when reporting it", {"error_type": "internal"})
    data: dict[str, Any] = {"error_type": exc.error_type, **exc.data}
    # what the run achieved and which strategy ran, attached by the service (ReasoningService.execute)
    for key, attribute in (("partial", "partial_result"), ("strategy", "strategy_name")):
        if value := getattr(exc, attribute, None):
            data[key] = value
    message = provider_summary(exc) if isinstance(exc, LLMError) else exc.message
    return RpcError(exc.code, message, data, http_status=exc.http_status)


@dataclass
class Call:
    """What a handler knows about the call it serves: its trace id, its method and that method's declared
    access, and (set by the guard for a method that lists resources) what the caller may see of them."""

    trace_id: str
    method: str
    access: Access | None = None
    visible: Visible | None = None
    usage: dict[str, int] | None = None
    """For a method declared `own_usage`: the caller's own activity, set when it may not see the server's."""


Handler = Callable[..., Awaitable[Any]]
"""Called with the method's params and its `Call`; a domain's declared function takes the application context first."""
_Fn = TypeVar("_Fn", bound=Handler)
Guard = Callable[[Call, BaseModel, Callable[[], Awaitable[Any]]], Awaitable[Any]]
"""Wraps every method call: admits the caller by the method's declared access before `invoke()`
(reasonray.api.access.tenancy)."""


class Params(BaseModel):
    """The base of every method's params model: a member the method does not name is invalid params."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class Method:
    """A method as its domain module declares it (`declare`): a module-level `async def fn(ctx, params, call)`
    that `Dispatcher.add` binds to the application's context, or one declared straight into `Dispatcher.methods`."""

    handler: Handler
    params: type[BaseModel]
    description: str
    access: Access  # who may call it, what it touches, what it is charged against (reasonray.api.declarations)
    result: type[BaseModel]  # what it answers, as rpc.discover advertises it (reasonray.api.results)
    stream: bool = False  # POST /rpc may answer it as SSE (`"stream": true` in its params)
    mcp_tool: str | None = None  # the MCP tool it is served as, if any


Table = dict[str, Method]
"""A domain's methods by name (`declare` fills it, `Dispatcher.add` serves it)."""


def declare(
    table: Table,
    name: str,
    *,
    access: Access,
    result: type[BaseModel] | None = None,
    stream: bool = False,
    mcp_tool: str | None = None,
) -> Callable[[_Fn], _Fn]:
    """Declare the decorated function as method `name` in a domain's `table` (the function stays as it is).
    Its signature is the schema: the params model is its `params` annotation, the result model its return
    annotation (`result` names it for a method that answers a record). `access` is required: a method nobody
    declared access for cannot be served."""
    if not isinstance(access, Access):
        raise TypeError(f"method {name!r} needs an Access declaration (reasonray.api.declarations), not {access!r}")

    def add(fn: _Fn) -> _Fn:
        hints = typing.get_type_hints(fn)
        model = result or hints.get("return")
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError(f"method {name!r} needs a result model: annotate what it returns, or pass result=")
        table[name] = Method(fn, hints["params"], (fn.__doc__ or "").strip(), access, model, stream, mcp_tool)
        return fn

    return add


class Dispatcher:
    """Routes JSON-RPC calls to handlers with Pydantic-validated params."""

    def __init__(self, new_trace_id: Callable[[], str], metrics: Metrics | None = None, limits: CapSettings | None = None) -> None:
        self.methods: dict[str, Method] = {}
        self._new_trace_id = new_trace_id
        self.metrics = metrics or NoMetrics()
        self.limits = limits or CapSettings()  # max_batch_size, and batch_concurrency: the slots one batch's calls share
        self.guard: Guard | None = None

    def add(self, table: Table, ctx: Any) -> None:
        """Serve every method of a domain's table, each called with `ctx` (reasonray.api.context.Context)."""
        for name, method in table.items():
            self.methods[name] = replace(method, handler=functools.partial(method.handler, ctx))

    async def handle(self, body: bytes | str, trace_id: str | None = None) -> tuple[Any, list[str]]:
        """The response payload (None when nothing is to be sent) and the trace ids of the calls."""
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:  # also bad UTF-8, ints past the digit limit, deep nesting
            return error_response(None, RpcError(PARSE_ERROR, f"parse error: the body is not valid JSON ({str(exc)[:200]})")), []
        return await self.handle_payload(payload, trace_id)

    async def handle_payload(self, payload: Any, trace_id: str | None = None) -> tuple[Any, list[str]]:
        """Like `handle`, for a body already parsed from JSON."""
        if isinstance(payload, list):
            if not payload:
                return error_response(None, RpcError(INVALID_REQUEST, "invalid request: an empty batch")), []
            if len(payload) > (cap := self.limits.max_batch_size):
                message = f"invalid params: a batch of {len(payload)} calls; the cap is {cap} ([limits] max_batch_size)"
                return error_response(None, RpcError(INVALID_PARAMS, message, {"cap": "limits.max_batch_size"})), []
            trace_ids = [self._new_trace_id() for _ in payload]
            # a batch is not a way around the replica's concurrency: its calls share batch_concurrency slots
            slots = asyncio.Semaphore(self.limits.batch_concurrency)
            responses = await asyncio.gather(*(self._one(c, t, slots) for c, t in zip(payload, trace_ids, strict=False)))
            sent = [r for r in responses if r is not None]
            return (sent or None), trace_ids
        trace_id = trace_id or self._new_trace_id()
        return await self._one(payload, trace_id, nullcontext()), [trace_id]

    async def _one(self, call: Any, trace_id: str, slot: AbstractAsyncContextManager[Any]) -> Response | None:
        """The response to one call of a body (None for a notification: its call runs, nothing is sent), in `slot`."""
        async with slot:
            if problem := _envelope_problem(call):
                request_id = call.get("id") if isinstance(call, dict) and _valid_id(call.get("id")) else None
                return error_response(request_id, RpcError(INVALID_REQUEST, f"invalid request: {problem}", {"trace_id": trace_id}))
            try:
                response = result_response(call.get("id"), await self.call(call["method"], call.get("params", {}), trace_id))
            except RpcError as error:
                response = error_response(call.get("id"), error)
            return response if "id" in call else None

    async def call(self, name: str, params: Any, trace_id: str | None = None) -> Any:
        """`run`, its result made JSON-ready: what JSON-RPC, the REST mirrors and MCP answer."""
        return wire(await self.run(name, params, trace_id))

    async def run(self, name: str, params: Any, trace_id: str | None = None, *, admitted: Callable[[], None] | None = None) -> Any:
        """Run one method by name, as every surface does (JSON-RPC, the REST mirrors, the OpenAI and MCP
        surfaces, streams): params validated, the guard applied, the call counted (method, `unknown` for
        unregistered names; strategy; status). Returns the method's typed result (its result model; a
        record for the few methods that answer one); raises `RpcError` (with the trace id in its data and
        the error class's `http_status`). Without `trace_id` the call gets a new one. `admitted` is called
        when the params are valid and the guard let the call through, just before the handler runs (a
        stream answers its HTTP status then: refusals come before it)."""
        trace_id = trace_id or self._new_trace_id()
        structlog.contextvars.bind_contextvars(trace_id=trace_id)
        started = time.perf_counter()
        method = self.methods.get(name)
        strategy: Any = None
        status = "ok"
        try:
            if method is None:
                raise RpcError(METHOD_NOT_FOUND, f"method not found: {name!r}; available methods: {', '.join(sorted(self.methods))}")
            if isinstance(params, list):
                raise RpcError(INVALID_PARAMS, "invalid params: pass params as an object of named parameters, not an array")
            try:
                parsed = method.params.model_validate(params)
            except ValidationError as exc:
                raise RpcError(INVALID_PARAMS, f"invalid params: {describe_errors(exc)}", {"errors": json_safe_errors(exc)}) from None
            here = Call(trace_id=trace_id, method=name, access=method.access)

            def invoke() -> Awaitable[Any]:
                if admitted is not None:
                    admitted()
                return method.handler(parsed, here)

            # authorization, ownership, limits and audit wrap every method (reasonray.api.access.tenancy)
            result = await (invoke() if self.guard is None else self.guard(here, parsed, invoke))
            strategy = getattr(result, "strategy_used", None)
            return result
        except Exception as exc:
            error = error_for(exc)
            if error is exc:  # an RpcError: already the caller's answer
                pass
            elif error.data.get("error_type") == "internal":
                log.exception("rpc.internal_error", method=name)
            else:
                # the caller gets a summary; the provider's own words (URL, body) stay in the log
                detail = str(exc)[:500] if isinstance(exc, LLMError) else None
                log.warning("rpc.error", method=name, code=error.code, error_type=error.data.get("error_type"), detail=detail)
            error.data.setdefault("trace_id", trace_id)
            strategy = error.data.get("strategy")
            status = error.data.get("error_type") or CODE_NAMES.get(error.code, "error")
            raise error from (None if error is exc else exc)
        finally:
            label = name if method is not None else "unknown"
            strategy = strategy if isinstance(strategy, str) else "none"  # "none": no strategy ran (bad params, other methods)
            self.metrics.record("reasonray_requests", method=label, strategy=strategy, status=status)
            self.metrics.record("reasonray_request_latency_seconds", time.perf_counter() - started, method=label, strategy=strategy)
            structlog.contextvars.unbind_contextvars("trace_id")


def wire(result: Any) -> Any:
    """A method's result as it goes on the wire: a result model serialised (JSON mode), a record as it is."""
    return result.model_dump(mode="json") if isinstance(result, BaseModel) else result


MAX_ID_CHARS = 256
MAX_ID_INT = 2**63


_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate cannot be encoded, so it cannot be echoed


def _valid_id(value: Any) -> bool:
    """A string (short, encodable) or an integer (64-bit) or null: anything else cannot be echoed safely."""
    if isinstance(value, str):
        return len(value) <= MAX_ID_CHARS and not _SURROGATE.search(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return -MAX_ID_INT <= value < MAX_ID_INT
    return value is None


def _envelope_problem(call: Any) -> str | None:
    if not isinstance(call, dict):
        return f"a request must be a JSON object, not {type(call).__name__}"
    if call.get("jsonrpc") != "2.0":
        return '"jsonrpc" must be exactly "2.0"'
    if not isinstance(call.get("method"), str) or not call["method"]:
        return '"method" must be a non-empty string'
    if "params" in call and not isinstance(call["params"], dict | list):
        return '"params" must be an object or an array'
    if "id" in call and not _valid_id(call["id"]):
        return f'"id" must be a string, an integer or null (at most {MAX_ID_CHARS} valid Unicode characters; 64 bits)'
    unknown = set(call) - {"jsonrpc", "method", "params", "id"}
    if unknown:
        return f"unknown members {sorted(unknown)}"
    return None


def well_formed(call: Any) -> bool:
    """Whether `call` is one valid JSON-RPC 2.0 request object (a transport that answers a call its own
    way, a stream say, takes only these; the dispatcher answers the others)."""
    return _envelope_problem(call) is None


def result_response(request_id: Any, result: Any) -> Response:
    """The response object of a call that succeeded."""
    return {"jsonrpc": "2.0", "result": result, "id": request_id}


def error_response(request_id: Any, error: RpcError) -> Response:
    """The response object of a call that failed."""
    return {"jsonrpc": "2.0", "error": error.body(), "id": request_id}
