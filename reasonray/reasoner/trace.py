"""The CompositionTrace: ordered, stable, lightweight steps of a turn.

Steps are events of the shared event model (`reasonray.events.Event`), so a ReAct run records them
in its event log like any strategy, and a session keeps its turn's steps with its state. They carry
ids, names, counts and statuses, never prompt text: correctness never depends on them, and they stay
small enough to persist with every turn.
"""

from __future__ import annotations

import msgspec

from reasonray.kernel.events import Event


class TurnStarted(Event, tag="TURN_STARTED"):
    turn: int
    mode: str


class LLMCalled(Event, tag="LLM_CALL"):
    call: int  # 1-based within the turn
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    tool_call_ids: list[str]


class ToolExecuted(Event, tag="TOOL_EXECUTED"):
    tool_call_id: str
    tool: str
    status: str  # "ok", "failed" or "rejected" (arguments unusable, sent back to the model)
    elapsed_ms: float
    error: str | None = None


class ClientToolPending(Event, tag="CLIENT_TOOL_PENDING"):
    """The server-side partner step of a client tool call: recorded in the ledger, handed to the client."""

    tool_call_id: str
    tool: str


class ModeChanged(Event, tag="MODE_CHANGE"):
    tool_call_id: str
    previous: str
    mode: str


class ReentryVerified(Event, tag="REENTRY_VERIFIED"):
    tool_call_ids: list[str]


class ReentryRejected(Event, tag="REENTRY_REJECTED"):
    missing: list[str]
    unexpected: list[str]
    mismatched: list[str]


class Continued(Event, tag="CONTINUATION"):
    """The turn continues after client results were accepted."""


class Exited(Event, tag="EXIT"):
    exit_mode: int  # 1: final answer; 2: pending client tool calls; 0: failed
    reason: str
    pending_tool_call_ids: list[str] = msgspec.field(default_factory=list)
