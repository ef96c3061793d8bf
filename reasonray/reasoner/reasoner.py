"""The turn reasoner: validate, call the LLM, run tools, verify, clear turn context, exit.

Each step is one LLM call: its reply is the turn's answer (`Completed`) or a round of tool calls, after which the
turn calls the model again or hands the client's calls over (`AwaitingClient`). A turn exits
in mode 1 (`Completed`) or mode 2 (`AwaitingClient`); hard errors are typed exceptions after a trace step. The reasoner does
not populate providers, persist state or compose prompts; its one provider mutation is clearing
turn-scoped context once it has been emitted. A reply without tool calls is the final answer: its
`<answer>` when it has one, else its whole visible text (`found_by` says which).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from reasonray.gateway.protocol import LLM, ToolCall
from reasonray.kernel.errors import MaxLLMCallsError, ModelBehaviorError, ReentryError
from reasonray.kernel.events import Event, EventSink
from reasonray.kernel.extraction import FoundBy
from reasonray.kernel.tags import extract_answer, strip_thinking
from reasonray.reasoner.executor import ToolExecutor
from reasonray.reasoner.providers import ContextProviders, LedgerEntry, build_request
from reasonray.reasoner.trace import (
    Continued,
    Exited,
    LLMCalled,
    ReentryRejected,
    ReentryVerified,
)

REENTRY_PROBLEMS = {
    "missing": "no result for pending call(s) {}",
    "unexpected": "results for unknown call id(s) {}",
    "mismatched": "results for call(s) {} that are not pending client calls (duplicates or already answered)",
}


@dataclass(frozen=True)
class Completed:
    """Exit mode 1: the turn's final answer, and how it was found (its `<answer>`, or the whole reply)."""

    answer: str
    found_by: FoundBy = "tag"


@dataclass(frozen=True)
class AwaitingClient:
    """Exit mode 2: the client must run these calls and send their results back (`session.resume`)."""

    calls: tuple[LedgerEntry, ...]


TurnExit = Completed | AwaitingClient


@dataclass
class TurnReasoner:
    llm: LLM
    providers: ContextProviders
    executor: ToolExecutor
    emit: EventSink
    trace_id: str
    strategy: str
    max_llm_calls: int
    llm_calls: int = 0  # calls made so far in this turn, across a client hand-off
    max_tokens: int = 2048
    first_tool_choice: str | None = None
    """`tool_choice` of the turn's first call ("required": it must call a tool), for endpoints that enforce it."""

    async def resume(self) -> TurnExit:
        """Continue a turn after the pipeline restored its providers and submitted the client's results."""
        self.verify_reentry()
        self._emit(Continued)
        return await self.run()

    def verify_reentry(self) -> None:
        """Every expected client call has a result and nothing else came back; else a hard ReentryError."""
        ledger = self.providers.ledger
        missing = [e.tool_call_id for e in ledger.pending()]
        known = {e.tool_call_id for e in ledger.entries()}  # a known id here is a server call or a duplicate
        unexpected = [r.tool_call_id for r in ledger.unexpected if r.tool_call_id not in known]
        mismatched = [r.tool_call_id for r in ledger.unexpected if r.tool_call_id in known]
        wrong = {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}
        if parts := [REENTRY_PROBLEMS[kind].format(", ".join(ids)) for kind, ids in wrong.items() if ids]:
            self._emit(ReentryRejected, **wrong)
            raise ReentryError(
                f"client tool results do not match the pending calls: {'; '.join(parts)}. "
                "Send exactly one result per pending tool_call_id (see session.get)",
                wrong,
            )
        verified = [e.tool_call_id for e in ledger.entries() if e.kind == "client"]
        self._emit(ReentryVerified, tool_call_ids=verified)
        self.executor.raise_for_failed_client_calls()

    async def run(self) -> TurnExit:
        """Run a new turn whose providers the pipeline has populated (with a fresh ledger), or go on with a resumed one."""
        while True:
            reply = await self._next_step()
            if isinstance(reply, Completed):
                self._emit(Exited, exit_mode=1, reason="final_answer")
                return reply
            await self.executor.run_round(reply)
            if pending := tuple(self.providers.ledger.pending()):
                ids = [e.tool_call_id for e in pending]
                self._emit(Exited, exit_mode=2, reason="client_tool_calls", pending_tool_call_ids=ids)
                return AwaitingClient(pending)

    async def _next_step(self) -> Completed | tuple[ToolCall, ...]:
        """One LLM call: the turn's answer, or the tool calls to run."""
        if self.llm_calls >= self.max_llm_calls:
            self._emit(Exited, exit_mode=0, reason="max_llm_calls")
            raise MaxLLMCallsError(
                f"the turn made {self.llm_calls} LLM calls without a final answer (limit {self.max_llm_calls}); "
                "raise max_llm_calls or simplify the task",
                {"llm_calls": self.llm_calls},
            )
        request = build_request(self.providers, self.executor.available(), max_tokens=self.max_tokens)
        if self.llm_calls == 0 and self.first_tool_choice is not None and request.tools:
            request = msgspec.structs.replace(request, tool_choice=self.first_tool_choice)
        self.providers.bootstrap = []  # turn-scoped context (the bootstrap) is shown to the model once, then dropped
        completion = await self.llm.complete(request)
        self.llm_calls += 1
        calls = completion.choices[0].tool_calls
        self._emit(
            LLMCalled,
            call=self.llm_calls,
            prompt_tokens=completion.usage.prompt_tokens,
            completion_tokens=completion.usage.completion_tokens,
            finish_reason=completion.finish_reason,
            tool_call_ids=[c.id for c in calls],
        )
        if calls:
            return calls
        if completion.thinking_unfinished:  # the thinking so far is no answer, whatever it says
            raise ModelBehaviorError(
                f"the model's reply ended inside its thinking, cut at the turn's {self.max_tokens} tokens per call, before it "
                "answered (unfinished thinking is no answer); a model that thinks longer needs a larger max_tokens",
                {"llm_calls": self.llm_calls, "reasoning_tokens": completion.usage.reasoning_tokens},
            )
        # a turn's reply is a whole message: only a tag marks an answer inside it, never a phrase or a number
        tagged = extract_answer(completion.text)
        answer = tagged if tagged is not None else strip_thinking(completion.text)
        if not answer:
            raise ModelBehaviorError("the model ended the turn with neither tool calls nor an answer", {"llm_calls": self.llm_calls})
        return Completed(answer, "tag" if tagged is not None else "whole_text")

    def _emit(self, kind: type[Event], **fields: Any) -> None:
        self.emit(kind(trace_id=self.trace_id, strategy=self.strategy, **fields))
