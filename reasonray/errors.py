"""Errors ReasonRay raises on purpose, by whose fault they are. The API maps each to one JSON-RPC code
(`reasonray.jsonrpc.ERROR_TABLE`); the gateway's own errors (`gateway.errors`) cover the provider.

    ReasonRayError
    ├── InvalidParamsError          the caller sent bad parameters                      -32602
    │   └── ReentryError            client tool results do not match the pending calls  -32602
    ├── StrategyUnavailableError    the strategy asked for is unknown, disabled or none  -32002
    ├── MaxIterationsError          a strategy used its iterations without an answer    -32001
    │   └── MaxLLMCallsError        a turn used its LLM calls without finishing         -32001
    ├── ModelBehaviorError          the model's output broke the strategy's protocol    -32003
    │   └── UnregisteredToolError   the model called a tool that is not available       -32003
    ├── BudgetExceededError         the request's token budget ran out                  -32004
    ├── NotFoundError               the agent (session, memory) named does not exist    -32005
    ├── ToolFailedError             a tool (server or client) failed: the turn ends     -32006
    ├── SessionStateError           the session cannot take this request now            -32007
    └── MemoryUnavailableError      the memory store or embedding model cannot serve     -32008
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class ReasonRayError(Exception):
    """Base of the errors ReasonRay raises on purpose; `data` travels to the client."""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data or {}


class InvalidParamsError(ReasonRayError):
    """The caller sent parameters that are missing, malformed or out of range."""


class StrategyUnavailableError(ReasonRayError):
    """The strategy requested (or defaulted to) cannot serve this request; `data.available` lists those that can."""


class MaxIterationsError(ReasonRayError):
    """A strategy used all its iterations without an answer; `data` keeps the partial trace."""


class ModelBehaviorError(ReasonRayError):
    """The model answered in a way the strategy cannot use (e.g. no parsable output after retries)."""


class BudgetExceededError(ReasonRayError):
    """The request's cumulative token budget ran out."""


class NotFoundError(ReasonRayError):
    """The caller named something (an agent, a session, a memory) that does not exist; `data` says what is there."""


class ReentryError(InvalidParamsError):
    """`session.resume` results are missing, extra or mismatched; `data` names the call ids. Nothing changed."""


class MaxLLMCallsError(MaxIterationsError):
    """A turn made its maximum number of LLM calls without a final answer."""


class UnregisteredToolError(ModelBehaviorError):
    """The model called a tool that is not registered (or not available in the current mode)."""


class ToolFailedError(ReasonRayError):
    """A tool failed; AGN-031 ends the turn at the first failure. `data` names the call and the error."""


class SessionStateError(ReasonRayError):
    """The session cannot take this request now (a turn while client results are pending, a closed session)."""


class MemoryUnavailableError(ReasonRayError):
    """The memory bank cannot serve: Chroma unreachable, an embedding model missing or mismatched."""


def attach_partial(exc: BaseException, partial: dict[str, Any]) -> BaseException:
    """Keep what a run achieved before `exc` (iterations, carryover) for the error's `data.partial`."""
    exc.partial_result = partial  # type: ignore[attr-defined]
    return exc


def describe_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors())


def json_safe_errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False)
    ]
