"""The ToolExecutor: checks a round of tool calls, runs the server ones in order, records everything in
the ledger, and hands client calls over (their server-side partner step: a pending ledger entry).

The failure policy is explicit here: a tool that is not available is a hard error before
anything runs, and the first failing tool ends the turn (ToolFailedError), with a trace step.
Arguments that are not JSON or do not fit the tool's parameters are the model's mistake, not the
tool's: with `argument_retries` left, the call is rejected (status "rejected") and its result tells
the model what was wrong, so its next step can call again; without, they fail the turn like a tool.
`mode_state_change` is the one tool that changes providers: it switches the mode and arms the new
mode's bootstrap text, effective from the next LLM call.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from reasonray.gateway.protocol import ToolCall
from reasonray.kernel import tracing
from reasonray.kernel.errors import CapExceededError, ToolFailedError, UnregisteredToolError
from reasonray.kernel.events import Event, EventSink
from reasonray.reasoner.providers import ContextProviders, LedgerEntry, Round
from reasonray.reasoner.tools import ClientTool, ServerTool, ToolArgumentsError
from reasonray.reasoner.trace import ClientToolPending, ModeChanged, ToolExecuted

MODE_TOOL = "mode_state_change"


@dataclass
class ToolExecutor:
    server: dict[str, ServerTool]
    client: dict[str, ClientTool]
    providers: ContextProviders
    emit: EventSink
    trace_id: str
    strategy: str
    argument_retries: int = 0
    """Calls with unusable arguments that are sent back to the model (with the error) before one fails the turn."""

    def available(self) -> list[dict[str, Any]]:
        """The tool schemas the model may use in the current mode."""
        mode = self.providers.mode
        schemas = [t.schema() for n, t in self.server.items() if mode.allows(n)]
        schemas += [t.model_dump() for n, t in self.client.items() if mode.allows(n)]
        if len(mode.modes) > 1:
            description = "Switch the session to another mode; it applies from your next step and may change your tools."
            parameters = {
                "type": "object",
                "properties": {"mode": {"type": "string", "enum": sorted(mode.modes), "description": "The mode to switch to."}},
                "required": ["mode"],
                "additionalProperties": False,
            }
            schemas.append({"type": "function", "function": {"name": MODE_TOOL, "description": description, "parameters": parameters}})
        return schemas

    async def run_round(self, calls: tuple[ToolCall, ...]) -> None:
        """Validate every call, record the round, then run server calls in order; client calls stay pending."""
        names = {schema["function"]["name"] for schema in self.available()}
        if unknown := [c for c in calls if c.name not in names]:
            raise UnregisteredToolError(
                f"the model called {', '.join(repr(c.name) for c in unknown)}, not available in mode "
                f"{self.providers.mode.mode!r} (available: {', '.join(sorted(names)) or 'none'})",
                {"tool_call_ids": [c.id for c in unknown], "available": sorted(names)},
            )
        entries = [LedgerEntry(c.id, c.name, "client" if c.name in self.client else "server", c.arguments) for c in calls]
        self.providers.ledger.rounds.append(Round(list(calls), entries))
        for entry in entries:
            if entry.kind == "client":
                self._emit(ClientToolPending, tool_call_id=entry.tool_call_id, tool=entry.tool)
            else:
                await self._run_server(entry)

    def raise_for_failed_client_calls(self) -> None:
        """A client result marked is_error is that tool's failure: the turn ends there, as for a server tool."""
        for entry in self.providers.ledger.entries():
            if entry.kind == "client" and entry.status == "failed":
                self._executed(entry, error=entry.content)
                raise ToolFailedError(
                    f"client tool {entry.tool!r} (call {entry.tool_call_id}) reported an error, which ends the turn: {entry.content}",
                    {"tool_call_id": entry.tool_call_id, "tool": entry.tool, "error": entry.content},
                )

    async def _run_server(self, entry: LedgerEntry) -> None:
        if self._rejected(entry):
            return
        started = time.perf_counter()
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": entry.tool, "gen_ai.tool.call.id": entry.tool_call_id}
        capped: CapExceededError | None = None
        with tracing.span(f"execute_tool {entry.tool}", attributes) as span:
            try:
                entry.content = await self._execute(entry)
                entry.status = "ok"
            except Exception as exc:  # the tool's own failure: recorded, then the turn ends (a turn never runs on past a failed tool)
                entry.status, entry.content = "failed", f"{type(exc).__name__}: {exc}"
                capped = exc if isinstance(exc, CapExceededError) else None
                span.error(exc)
        failed = entry.status == "failed"
        self._executed(entry, round((time.perf_counter() - started) * 1000, 3), entry.content if failed else None)
        data = {"tool_call_id": entry.tool_call_id, "tool": entry.tool, "error": entry.content}
        if capped is not None:  # over a configured cap: the caller's request asked for too much (-32602, naming the cap)
            raise CapExceededError(
                f"tool {entry.tool!r} (call {entry.tool_call_id}) refused its input, which ends the turn: {capped.message}",
                {**capped.data, **data},
            )
        if failed:
            raise ToolFailedError(f"tool {entry.tool!r} (call {entry.tool_call_id}) failed, which ends the turn: {entry.content}", data)

    def _rejected(self, entry: LedgerEntry) -> bool:
        """Send a call with unusable arguments back to the model while `argument_retries` lasts."""
        tool = self.server.get(entry.tool)
        if tool is None or self.argument_retries <= 0:
            return False
        try:
            tool.parse(entry.arguments)
        except ToolArgumentsError as exc:
            self.argument_retries -= 1
            entry.status = "rejected"
            entry.content = f"error: {exc}. Call {entry.tool} again with a JSON object that fits its parameters."
            self._executed(entry, error=str(exc))
            return True
        return False

    async def _execute(self, entry: LedgerEntry) -> str:
        if entry.tool == MODE_TOOL:
            return self._change_mode(entry)
        try:
            return await self.server[entry.tool](entry.arguments)
        except ToolArgumentsError as exc:
            raise ValueError(str(exc)) from None

    def _change_mode(self, entry: LedgerEntry) -> str:
        mode = self.providers.mode
        try:
            target = json.loads(entry.arguments or "{}").get("mode")
        except (ValueError, AttributeError):
            target = None
        if target not in mode.modes:
            raise ValueError(f"unknown mode {target!r}; modes: {', '.join(sorted(mode.modes))}")
        previous, mode.mode = mode.mode, target
        if bootstrap := mode.modes[target].bootstrap:
            self.providers.bootstrap.append(bootstrap)
        self._emit(ModeChanged, tool_call_id=entry.tool_call_id, previous=previous, mode=target)
        return f"Mode is now {target}."

    def _executed(self, entry: LedgerEntry, elapsed_ms: float = 0.0, error: str | None = None) -> None:
        self._emit(ToolExecuted, tool_call_id=entry.tool_call_id, tool=entry.tool, status=entry.status, elapsed_ms=elapsed_ms, error=error)

    def _emit(self, kind: type[Event], **fields: Any) -> None:
        self.emit(kind(trace_id=self.trace_id, strategy=self.strategy, **fields))
