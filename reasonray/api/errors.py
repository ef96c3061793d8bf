"""One view of every failure, rendered per surface from one table.

Each error class of the kernel's tree carries its JSON-RPC code, HTTP status, OpenAI error type and A2A
task state (`reasonray.kernel.errors`); the JSON-RPC protocol's own errors (parse error, invalid request,
unknown method) are added here. A failure reaches a surface as a JSON-RPC error object (`RpcError.body()`),
so the table is keyed by code: the classes that share a code share their whole view (a unit test holds
that), and every surface (the REST mirrors, OpenAI's `/v1`, A2A, MCP, the gate in front of them) answers
the same failure with the same HTTP status.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from reasonray.api.jsonrpc import CODE_NAMES, INTERNAL_ERROR, PROTOCOL_HTTP_STATUS, error_classes
from reasonray.kernel.errors import RateLimitedError, StrategyUnavailableError


@dataclass(frozen=True)
class ErrorView:
    """How one kind of failure shows on every surface."""

    code: int  # JSON-RPC error code (also MCP's: MCP is JSON-RPC)
    http_status: int  # the status of every HTTP surface: REST mirrors, /v1 (OpenAI), A2A refusals, the gate
    openai_type: str  # OpenAI's `error.type`: invalid_request_error, not_found_error, rate_limit_error, ...
    a2a_state: str  # what an A2A task becomes: `failed`, or `rejected` (a refusal: answered as an error, no task)


_OPENAI_TYPES = {400: "invalid_request_error", 404: "not_found_error", 500: "server_error"}
# the protocol's own errors, which no exception class of the tree stands for, with the status the protocol gives them
PROTOCOL_VIEWS = tuple(ErrorView(code, status, _OPENAI_TYPES[status], "failed") for code, status in PROTOCOL_HTTP_STATUS.items())
INTERNAL = next(view for view in PROTOCOL_VIEWS if view.code == INTERNAL_ERROR)


@cache
def error_table() -> dict[int, ErrorView]:
    """Every JSON-RPC code ReasonRay answers with, and its view (built once, from the error classes)."""
    table = {view.code: view for view in PROTOCOL_VIEWS}
    for cls in error_classes():
        table.setdefault(cls.code, ErrorView(cls.code, cls.http_status, cls.openai_type, cls.a2a_state))
    return table


def view_of(code: int) -> ErrorView:
    """The view of a JSON-RPC error code; an unknown code is shown as an internal error."""
    return error_table().get(code, INTERNAL)


def error_headers(error: Mapping[str, Any]) -> dict[str, str]:
    """The HTTP headers of an error object: `Retry-After` when it says when to come back (overloaded, rate
    limited), and `X-RateLimit-*` for a rate limit (-32012)."""
    data = error.get("data") or {}
    if "retry_after_s" not in data:
        return {}
    if error.get("code") != RateLimitedError.code:
        return {"Retry-After": str(max(1, math.ceil(data["retry_after_s"])))}
    wait = str(max(1, round(data["retry_after_s"] + 0.4999)))
    return {"Retry-After": wait, "X-RateLimit-Limit": str(data.get("limit", "")), "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": wait}


def rest_error(error: Mapping[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """A REST mirror's answer to an error object: status, body `{"error": {code, message, data, type, param}}`,
    headers. The REST mirrors live under /v1, where clients read OpenAI's error fields: `type` and `param` (the
    first invalid field, if any) ride beside the JSON-RPC code, message and data."""
    view = view_of(error["code"])
    errors = (error.get("data") or {}).get("errors")
    first = errors[0] if isinstance(errors, list) and errors and isinstance(errors[0], dict) else {}
    param = ".".join(str(p) for p in first.get("loc", ())) or None
    return view.http_status, {"error": {**error, "type": view.openai_type, "param": param}}, error_headers(error)


def openai_error(error: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """OpenAI's shape of an error object, `{"error": {message, type, param, code}}`, and its status. `code` is
    ReasonRay's error type (`model_not_found` for a strategy that is not there, as OpenAI names an unknown
    model); the JSON-RPC code and data ride along in `reasonray`."""
    view = view_of(error["code"])
    data = error.get("data") or {}
    unavailable = error["code"] == StrategyUnavailableError.code
    code = "model_not_found" if unavailable else data.get("error_type") or CODE_NAMES.get(error["code"]) or "reasonray_error"
    body = {"message": error["message"], "type": view.openai_type, "param": None, "code": code}
    return view.http_status, {"error": {**body, "reasonray": {"code": error["code"], "data": data}}}


def a2a_refused(error: Mapping[str, Any]) -> bool:
    """Whether an A2A request is refused outright (answered with the error and its HTTP status, no task is
    kept) rather than leaving a `failed` task: the caller's credentials, roles or limits said no."""
    return view_of(error["code"]).a2a_state == "rejected"
