"""ContextProviders and the request builder that materialises them.

Session-scoped providers are emitted on every LLM call and persist across turns; turn-scoped ones
are emitted once and then cleared by the reasoner. The pipeline populates them all before a turn
(and the tool executor writes tool results into the ledger); the reasoner only clears turn context.
Every provider dumps to and loads from plain JSON, which is what the session repository stores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from reasonray.gateway.protocol import LLMRequest, Message, ToolCall
from reasonray.kernel.tags import strip_thinking


class ModeSpec(BaseModel):
    """A mode of a session: its instructions, the tools it may use and its bootstrap text."""

    model_config = ConfigDict(extra="forbid")

    instructions: str = Field("", max_length=20_000, description="Added to the system message while the mode is active.")
    tools: list[str] | None = Field(None, description="Tools available in this mode (server and client names); null: all.")
    bootstrap: str | None = Field(None, max_length=20_000, description="Shown once when the mode is entered (turn-scoped).")


@dataclass
class ModeState:
    """Session-scoped: the active mode and every mode's spec. Changed only by the mode_state_change tool."""

    mode: str
    modes: dict[str, ModeSpec]

    def allows(self, tool: str) -> bool:
        allowed = self.modes[self.mode].tools
        return allowed is None or tool in allowed


class LedgerEntry(msgspec.Struct):
    tool_call_id: str
    tool: str
    kind: str  # "server" or "client"
    arguments: str
    status: str = "pending"  # "pending", "ok", "failed" or "rejected" (unusable arguments, sent back to the model)
    content: str | None = None


class Round(msgspec.Struct):
    """One LLM reply's tool calls, in the order the model issued them."""

    calls: list[ToolCall]
    entries: list[LedgerEntry]


class SubmittedResult(msgspec.Struct):
    tool_call_id: str
    content: str
    is_error: bool = False


@dataclass
class ToolLedger:
    """The ToolResults provider and tool ledger of the current turn: expected calls, status, results.

    Emitted on every call of the turn (each round as the assistant's tool calls followed by their
    results). The tool executor records server results, the pipeline records client results on
    re-entry (`submit`, which keeps results it did not expect for the reasoner to reject), and the
    pipeline starts a fresh ledger with each turn.
    """

    rounds: list[Round] = field(default_factory=list)
    unexpected: list[SubmittedResult] = field(default_factory=list)

    def entries(self) -> list[LedgerEntry]:
        return [entry for r in self.rounds for entry in r.entries]

    def pending(self) -> list[LedgerEntry]:
        return [e for e in self.entries() if e.status == "pending"]

    def submit(self, results: list[SubmittedResult]) -> None:
        by_id = {e.tool_call_id: e for e in self.entries()}
        for result in results:
            entry = by_id.get(result.tool_call_id)
            if entry is None or entry.kind != "client" or entry.status != "pending":
                self.unexpected.append(result)
                continue
            entry.status = "failed" if result.is_error else "ok"
            entry.content = result.content

    def messages(self) -> list[Message]:
        out: list[Message] = []
        for r in self.rounds:
            out.append(Message(role="assistant", tool_calls=tuple(r.calls)))
            out += [Message(role="tool", tool_call_id=e.tool_call_id, content=e.content or "") for e in r.entries if e.status != "pending"]
        return out


@dataclass
class ContextProviders:
    """Every provider of a session, in the order the request builder emits them (the mode's instructions join
    the system prompt)."""

    instructions: str  # session-scoped: the session's system prompt
    mode: ModeState
    history: list[Message] = field(default_factory=list)  # session-scoped: the user messages and final answers so far (no thinking)
    bootstrap: list[str] = field(default_factory=list)  # turn-scoped: welcome and initialisation text, armed by creation or a mode change
    ledger: ToolLedger = field(default_factory=ToolLedger)  # a conversation begins with no tool results

    def dump(self) -> dict[str, Any]:
        return {
            "instructions": self.instructions,
            "mode": {"mode": self.mode.mode, "modes": {k: v.model_dump() for k, v in self.mode.modes.items()}},
            "conversation": msgspec.to_builtins(self.history),
            "bootstrap": list(self.bootstrap),
            "tool_results": msgspec.to_builtins(self.ledger),  # {"rounds": [...], "unexpected": [...]}
        }

    @classmethod
    def load(cls, state: dict[str, Any]) -> ContextProviders:
        return cls(
            instructions=state["instructions"],
            mode=ModeState(state["mode"]["mode"], {k: ModeSpec.model_validate(v) for k, v in state["mode"]["modes"].items()}),
            history=msgspec.convert(state["conversation"], list[Message]),
            bootstrap=list(state["bootstrap"]),
            ledger=msgspec.convert(state["tool_results"], ToolLedger),
        )


def build_request(providers: ContextProviders, tools: list[dict[str, Any]], *, max_tokens: int) -> LLMRequest:
    """Materialise the providers into one LLM request (at temperature 0): instructions, bootstrap, conversation, tool rounds."""
    mode, spec = providers.mode.mode, providers.mode.modes[providers.mode.mode]
    instructions = f"{providers.instructions}\n\nCurrent mode: {mode}." + (f"\n{spec.instructions}" if spec.instructions else "")
    messages = [
        Message(role="system", content=instructions),
        *(Message(role="system", content=text) for text in providers.bootstrap),
        *providers.history,
        *providers.ledger.messages(),
    ]
    carried = tuple(  # an assistant message carries its answer forward, never its thinking
        msgspec.structs.replace(m, content=strip_thinking(m.content)) if m.role == "assistant" and m.content else m for m in messages
    )
    return LLMRequest(messages=carried, tools=tuple(tools), max_tokens=max_tokens, temperature=0.0)
