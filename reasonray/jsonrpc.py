"""JSON-RPC 2.0 in full: single and batch calls, notifications, and one table from errors to codes.

| code   | meaning                                   | raised for                                            |
|--------|-------------------------------------------|-------------------------------------------------------|
| -32700 | parse error                               | the body is not JSON                                  |
| -32600 | invalid request                           | not a JSON-RPC 2.0 request object, or an empty batch  |
| -32601 | method not found                          | unknown method (the message lists the methods)        |
| -32602 | invalid params                            | InvalidParamsError, Pydantic validation (in `data`)   |
| -32603 | internal error                            | LLM provider failure (`data.error_type`), or a bug    |
| -32001 | max iterations reached                    | MaxIterationsError (partial trace in `data`)          |
| -32002 | strategy unavailable                      | StrategyUnavailableError (`data.available`)           |
| -32003 | model misbehaved                          | ModelBehaviorError                                    |
| -32004 | token budget exceeded                     | BudgetExceededError                                   |
| -32005 | not found                                 | NotFoundError: no such agent or session               |
| -32006 | tool failed                               | ToolFailedError: the turn ended at a failed tool      |
| -32007 | session state conflict                    | SessionStateError: e.g. a turn while calls are pending|
| -32008 | memory unavailable                        | MemoryUnavailableError: Chroma or the embedding model |
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError

from reasonray.telemetry import Metrics, NoMetrics

from gateway.errors import (
    CircuitOpenError,
    LLMConfigError,
    LLMError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from reasonray.errors import (
    BudgetExceededError,
    InvalidParamsError,
    MaxIterationsError,
    MaxLLMCallsError,
    MemoryUnavailableError,
    ModelBehaviorError,
    NotFoundError,
    ReasonRayError,
    ReentryError,
    SessionStateError,
    StrategyUnavailableError,
    ToolFailedError,
    UnregisteredToolError,
    describe_errors,
    json_safe_errors,
)

log = structlog.get_logger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
MAX_ITERATIONS = -32001
STRATEGY_UNAVAILABLE = -32002
MODEL_BEHAVIOR = -32003
BUDGET_EXCEEDED = -32004
NOT_FOUND = -32005
TOOL_FAILED = -32006
SESSION_STATE = -32007
MEMORY_UNAVAILABLE = -32008

CODE_NAMES = {PARSE_ERROR: "parse_error", INVALID_REQUEST: "invalid_request", METHOD_NOT_FOUND: "method_not_found",
              INVALID_PARAMS: "invalid_params", INTERNAL_ERROR: "internal"}

# Most specific first: the first matching row decides.
ERROR_TABLE: list[tuple[type[Exception], int, str]] = [
    (ReentryError, INVALID_PARAMS, "reentry_mismatch"),
    (InvalidParamsError, INVALID_PARAMS, "invalid_params"),
    (MaxLLMCallsError, MAX_ITERATIONS, "max_llm_calls"),
    (UnregisteredToolError, MODEL_BEHAVIOR, "unregistered_tool"),
    (MaxIterationsError, MAX_ITERATIONS, "max_iterations"),
    (StrategyUnavailableError, STRATEGY_UNAVAILABLE, "strategy_unavailable"),
    (ModelBehaviorError, MODEL_BEHAVIOR, "model_behavior"),
    (BudgetExceededError, BUDGET_EXCEEDED, "budget_exceeded"),
    (NotFoundError, NOT_FOUND, "not_found"),
    (ToolFailedError, TOOL_FAILED, "tool_failed"),
    (SessionStateError, SESSION_STATE, "session_state"),
    (MemoryUnavailableError, MEMORY_UNAVAILABLE, "memory_unavailable"),
    (CircuitOpenError, INTERNAL_ERROR, "circuit_open"),
    (ProviderUnavailableError, INTERNAL_ERROR, "provider_unavailable"),
    (ProviderRejectedError, INTERNAL_ERROR, "provider_rejected"),
    (LLMConfigError, INTERNAL_ERROR, "llm_config"),
    (LLMError, INTERNAL_ERROR, "llm_error"),
]


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data or {}


def error_for(exc: Exception) -> RpcError:
    """The JSON-RPC error for an exception, by the table above; unknown exceptions hide their details."""
    for kind, code, error_type in ERROR_TABLE:
        if isinstance(exc, kind):
            data: dict[str, Any] = {"error_type": error_type}
            if isinstance(exc, ReasonRayError):
                data.update(exc.data)
            if isinstance(exc, ProviderUnavailableError):
                data["attempts"] = exc.attempts
            if isinstance(exc, CircuitOpenError):
                data["retry_after_s"] = round(exc.retry_after_s, 3)
            if isinstance(exc, ProviderRejectedError):
                data["status_code"] = exc.status_code
            if getattr(exc, "partial_result", None):
                data["partial"] = exc.partial_result
            message = exc.message if isinstance(exc, ReasonRayError) else str(exc)
            if error_type == "provider_unavailable" or error_type == "circuit_open":
                message = f"Reasoning service temporarily unavailable: {message}"
            return RpcError(code, message, data)
    return RpcError(INTERNAL_ERROR, "internal error; quote the trace_id when reporting it", {"error_type": "internal"})


@dataclass
class Call:
    """What a handler knows about the call it serves."""

    trace_id: str
    method: str


Handler = Callable[[Any, Call], Awaitable[Any]]


@dataclass
class Method:
    handler: Handler
    params: type[BaseModel]
    description: str


class Dispatcher:
    """Routes JSON-RPC calls to handlers with Pydantic-validated params."""

    def __init__(self, new_trace_id: Callable[[], str], metrics: Metrics | None = None) -> None:
        self.methods: dict[str, Method] = {}
        self._new_trace_id = new_trace_id
        self.metrics = metrics or NoMetrics()

    def method(self, name: str, params: type[BaseModel], description: str = "") -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.methods[name] = Method(handler, params, description or (handler.__doc__ or "").strip())
            return handler

        return register

    async def handle(self, body: bytes | str, trace_id: str | None = None) -> tuple[Any, list[str]]:
        """The response payload (None when nothing is to be sent) and the trace ids of the calls."""
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error_response(None, RpcError(PARSE_ERROR, f"parse error: the body is not valid JSON ({exc})")), []
        return await self.handle_payload(payload, trace_id)

    async def handle_payload(self, payload: Any, trace_id: str | None = None) -> tuple[Any, list[str]]:
        """Like `handle`, for a body already parsed from JSON."""
        if isinstance(payload, list):
            if not payload:
                return _error_response(None, RpcError(INVALID_REQUEST, "invalid request: an empty batch")), []
            trace_ids = [self._new_trace_id() for _ in payload]
            responses = await asyncio.gather(*(self._one(c, t) for c, t in zip(payload, trace_ids)))
            sent = [r for r in responses if r is not None]
            return (sent or None), trace_ids
        trace_id = trace_id or self._new_trace_id()
        return await self._one(payload, trace_id), [trace_id]

    async def _one(self, call: Any, trace_id: str) -> dict[str, Any] | None:
        structlog.contextvars.bind_contextvars(trace_id=trace_id)
        try:
            problem = _envelope_problem(call)
            if problem:
                request_id = call.get("id") if isinstance(call, dict) and _valid_id(call.get("id")) else None
                return _error_response(request_id, RpcError(INVALID_REQUEST, f"invalid request: {problem}", {"trace_id": trace_id}))
            is_notification = "id" not in call
            response = await self._invoke(call, trace_id)
            return None if is_notification else response
        finally:
            structlog.contextvars.unbind_contextvars("trace_id")

    async def _invoke(self, call: dict[str, Any], trace_id: str) -> dict[str, Any]:
        """Answer the call and count it: method (`unknown` for unregistered names), strategy, status."""
        started = time.perf_counter()
        response = await self._answer(call, trace_id)
        method = call["method"] if call["method"] in self.methods else "unknown"
        result, error = response.get("result"), response.get("error")
        strategy = result.get("strategy_used") if isinstance(result, dict) else None
        strategy = strategy if isinstance(strategy, str) else "none"
        status = "ok" if error is None else (error.get("data") or {}).get("error_type") or CODE_NAMES.get(error["code"], "error")
        self.metrics.record("reasonray_requests", method=method, strategy=strategy, status=status)
        self.metrics.record("reasonray_request_latency_ms", (time.perf_counter() - started) * 1000, method=method, strategy=strategy)
        return response

    async def _answer(self, call: dict[str, Any], trace_id: str) -> dict[str, Any]:
        request_id = call.get("id")
        method = self.methods.get(call["method"])
        try:
            if method is None:
                raise RpcError(
                    METHOD_NOT_FOUND,
                    f"method not found: {call['method']!r}; available methods: {', '.join(sorted(self.methods))}",
                )
            params = call.get("params", {})
            if isinstance(params, list):
                raise RpcError(INVALID_PARAMS, "invalid params: pass params as an object of named parameters, not an array")
            try:
                parsed = method.params.model_validate(params)
            except ValidationError as exc:
                raise RpcError(INVALID_PARAMS, f"invalid params: {describe_errors(exc)}", {"errors": json_safe_errors(exc)}) from None
            result = await method.handler(parsed, Call(trace_id=trace_id, method=call["method"]))
        except RpcError as exc:
            return _error_response(request_id, _with_trace(exc, trace_id))
        except Exception as exc:
            error = error_for(exc)
            if error.data.get("error_type") == "internal":
                log.exception("rpc.internal_error", method=call["method"])
            else:
                log.warning("rpc.error", method=call["method"], code=error.code, error_type=error.data.get("error_type"))
            return _error_response(request_id, _with_trace(error, trace_id))
        if isinstance(result, BaseModel):
            result = result.model_dump(mode="json")
        return {"jsonrpc": "2.0", "result": result, "id": request_id}


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, str | int) and not isinstance(value, bool))


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
        return '"id" must be a string, an integer or null'
    unknown = set(call) - {"jsonrpc", "method", "params", "id"}
    if unknown:
        return f"unknown members {sorted(unknown)}"
    return None


def _with_trace(error: RpcError, trace_id: str) -> RpcError:
    error.data.setdefault("trace_id", trace_id)
    return error


def _error_response(request_id: Any, error: RpcError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data:
        body["data"] = error.data
    return {"jsonrpc": "2.0", "error": body, "id": request_id}
