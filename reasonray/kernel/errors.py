"""Errors ReasonRay raises on purpose, by whose fault they are: one tree under `ReasonRayError`. Each
class carries how every surface shows it: its JSON-RPC `code`, the `http_status` every HTTP surface answers
with (REST mirrors, OpenAI, A2A, MCP), its `openai_type` (OpenAI's `error.type`), its `a2a_state` (what an
A2A task becomes: `failed`, or `rejected` for a refusal before any run) and the `error_type` clients see in
`error.data`. One renderer reads them for every surface (`reasonray.api.errors`).
The gateway's errors (`reasonray.gateway.errors`), configuration, evaluation, tool-argument and
simulator errors are branches of the same tree.

docs/api.md ("Errors") tables every code with its meaning and `data`; the classes below, each with its code
in its header, are the tree itself.

The model provider's own failures (`reasonray.gateway.errors`) map to -32013 with a summary that
never carries the provider's URL or body (those go to the log).

-32001 is "max iterations reached without an answer", the code the specification fixes for bounded
context; -32009 (its code before 2026-11-28) is retired and answers nothing, so an old client cannot
mistake a new failure for it.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError


class ReasonRayError(Exception):
    """Base of the errors ReasonRay raises on purpose; `data` travels to the client."""

    code: int = -32603
    http_status: int = 500
    error_type: str = "internal"
    openai_type: str = "server_error"
    a2a_state: str = "failed"

    def __init_subclass__(cls, **surfaces: Any) -> None:
        """`class X(ReasonRayError, code=..., http_status=...)` sets how every surface shows X; the rest is its parent's."""
        super().__init_subclass__()
        for name, value in surfaces.items():
            setattr(cls, name, value)

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data or {}

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in an actor or a Ray task, re-raised in the caller: restore every attribute (`data` and a subclass's
        # own fields) without calling __init__ again, which fails for keyword-only fields (CircuitOpenError's retry_after_s).
        return Exception.__new__, (type(self), *self.args), self.__dict__


class InvalidParamsError(ReasonRayError, code=-32602, http_status=400, error_type="invalid_params", openai_type="invalid_request_error"):
    """The caller sent parameters that are missing, malformed or out of range."""


class CapExceededError(InvalidParamsError, ValueError):
    """What the request asked for is over a configured cap (`data.cap` names it): -32602, even when a tool
    the model called on the caller's behalf is what hit it (still a ValueError for the tool's own callers)."""


class StrategyUnavailableError(
    ReasonRayError, code=-32002, http_status=404, error_type="strategy_unavailable", openai_type="invalid_request_error"
):
    """The strategy requested (or defaulted to) cannot serve this request; `data.available` lists those that can."""


class MaxIterationsError(ReasonRayError, code=-32001, http_status=422, error_type="max_iterations", openai_type="invalid_request_error"):
    """A strategy used all its iterations without an answer; `data` keeps the partial trace."""


class ModelBehaviorError(ReasonRayError, code=-32010, http_status=502, error_type="model_behavior"):
    """The model answered in a way the strategy cannot use (e.g. no parsable output after retries)."""


class BudgetExceededError(ReasonRayError, code=-32004, http_status=422, error_type="budget_exceeded", openai_type="invalid_request_error"):
    """The request's cumulative token budget ran out."""


class NotFoundError(ReasonRayError, code=-32005, http_status=404, error_type="not_found", openai_type="not_found_error"):
    """The caller named something (an agent, a session, a memory) that does not exist; `data` says what is there."""


class ReentryError(InvalidParamsError, error_type="reentry_mismatch"):
    """`session.resume` results are missing, extra or mismatched; `data` names the call ids. Nothing changed."""


class MaxLLMCallsError(MaxIterationsError, error_type="max_llm_calls"):
    """A turn made its maximum number of LLM calls without a final answer."""


class UnregisteredToolError(ModelBehaviorError, error_type="unregistered_tool"):
    """The model called a tool that is not registered (or not available in the current mode)."""


class ToolFailedError(ReasonRayError, code=-32006, http_status=502, error_type="tool_failed"):
    """A tool failed; the turn ends at the first failure. `data` names the call and the error."""


class SandboxUnavailableError(ToolFailedError):
    """The python sandbox cannot isolate code on this host (bubblewrap missing, no user namespaces): nothing runs."""


class SessionStateError(ReasonRayError, code=-32007, http_status=409, error_type="session_state", openai_type="invalid_request_error"):
    """The session cannot take this request now (a turn while client results are pending, a closed session)."""


class MemoryUnavailableError(ReasonRayError, code=-32008, http_status=503, error_type="memory_unavailable"):
    """The memory bank cannot serve: Chroma unreachable, an embedding model missing or mismatched."""


class RunCancelledError(ReasonRayError, code=-32014, http_status=409, error_type="cancelled", openai_type="invalid_request_error"):
    """The run was cancelled before it answered (the caller went away, the service is shutting down)."""


class DeadlineExceededError(
    ReasonRayError, code=-32015, http_status=422, error_type="deadline_exceeded", openai_type="invalid_request_error"
):
    """The request's deadline (`budget.deadline_s`, or the server's) passed before the run answered.

    A time budget ran out, like a token budget (422, not 504): proxies retry 5xx answers on their own,
    and a run that was too slow for its deadline should not be run again behind the caller's back."""


class UnauthenticatedError(
    ReasonRayError, code=-32016, http_status=401, error_type="unauthenticated", openai_type="authentication_error", a2a_state="rejected"
):
    """The request carries no valid credentials; the message says what is missing or wrong (never which part of a signature)."""


class ForbiddenError(
    ReasonRayError, code=-32003, http_status=403, error_type="forbidden", openai_type="permission_error", a2a_state="rejected"
):
    """The caller is known but may not do this, or the thing named is not theirs (whether it exists is not said)."""


class RateLimitedError(
    ReasonRayError, code=-32012, http_status=429, error_type="rate_limited", openai_type="rate_limit_error", a2a_state="rejected"
):
    """The caller's rate limit or token budget is used up for now; `data.retry_after_s` says when to try again."""


def attach_partial(exc: BaseException, partial: dict[str, Any]) -> BaseException:
    """Keep what a run achieved before `exc` (iterations, carryover) for the error's `data.partial`."""
    exc.partial_result = partial  # type: ignore[attr-defined]
    return exc


def error_type_of(exc: BaseException) -> str:
    """What kind of failure `exc` is, for a person reading a command's output: its `error_type` as the API
    names it, or (for errors the API never answers with) its class in snake case, e.g. `config_error`."""
    named = getattr(exc, "error_type", "internal")
    return str(named) if named != "internal" else re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


def describe_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors())


def json_safe_errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [{"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors(include_url=False)]


class OverloadedError(ReasonRayError, code=-32011, http_status=503, error_type="overloaded"):
    """This server has no room for the request now (every session slot of a host is busy, or a replica has
    `[fanout] max_in_flight` branches running); nothing was done. `data.retry_after_s` says when to try again."""
