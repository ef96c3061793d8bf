"""Strict test doubles for the LLM protocol, for unit tests and notebooks.

`ScriptedLLM` answers from a script and raises on any call the script did not foresee;
`assert_complete()` checks that the whole script was used. `FunctionLLM` computes each reply
from the request. Both report usage with the real token counter. A `Thinking` reply scripts a reasoning
model: its thinking (visible or hidden), its answer, and whether it ran out while still thinking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

import msgspec

from reasonray.gateway.protocol import Choice, Completion, FinishReason, LLMRequest, ToolCall, Usage
from reasonray.gateway.tokens import TokenCounter, count_messages, counter_for_model


class Thinking(msgspec.Struct, frozen=True):
    """A reasoning model's reply, as the gateway hands it over whatever the server's form: thinking apart from the answer."""

    reasoning: str
    """The thinking, as text ("" for a model that thinks out of sight: give `reasoning_tokens` then)."""
    text: str = ""
    """The answer after the thinking (ignored when `unfinished`: unfinished thinking has no answer)."""
    unfinished: bool = False
    """The reply ran out of `max_tokens` inside its thinking: empty text, finish reason "length"."""
    reasoning_tokens: int | None = None
    """Tokens spent thinking; None counts `reasoning` with the double's token counter."""
    tool_calls: tuple[ToolCall, ...] = ()


Reply = str | Thinking | Completion | ToolCall | tuple[ToolCall, ...] | BaseException


class UnexpectedCall(AssertionError):
    """The code under test called the model more often than the script allows."""


def make_completion(
    request: LLMRequest,
    reply: str | Thinking | ToolCall | tuple[ToolCall, ...],
    *,
    model: str,
    counter: TokenCounter,
    finish_reason: str | None = None,
) -> Completion:
    if isinstance(reply, ToolCall):
        reply = (reply,)
    if not isinstance(reply, Thinking):  # an answer, or tool calls, without thinking
        reply = Thinking("", tool_calls=reply) if isinstance(reply, tuple) else Thinking("", reply)
    text, calls, unfinished = "" if reply.unfinished else reply.text, reply.tool_calls, reply.unfinished
    reasoning_tokens = counter.count(reply.reasoning) if reply.reasoning_tokens is None else reply.reasoning_tokens
    completion_tokens = reasoning_tokens + counter.count(text) + sum(counter.count(c.name + c.arguments) for c in calls)
    choice = Choice(
        text=text,
        finish_reason=cast(FinishReason, "length" if unfinished else finish_reason or ("tool_calls" if calls else "stop")),
        tool_calls=calls,
        reasoning=reply.reasoning,
        thinking_unfinished=unfinished,
    )
    return Completion(
        choices=(choice,),
        usage=Usage(count_messages(counter, request.messages), completion_tokens, reasoning_tokens),
        model=model,
    )


class FunctionLLM:
    """Computes each reply from the request; records every request it saw."""

    def __init__(self, fn: Callable[[LLMRequest], Reply], model: str = "function") -> None:
        self._fn = fn
        self.model = model
        self._counter = counter_for_model(model)
        self.requests: list[LLMRequest] = []

    async def complete(self, request: LLMRequest) -> Completion:
        self.requests.append(request)
        reply = self._fn(request)
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Completion):
            return reply
        return make_completion(request, reply, model=self.model, counter=self._counter)


class ScriptedLLM(FunctionLLM):
    """Replies from a script, in order; a call the script did not foresee raises UnexpectedCall."""

    def __init__(self, replies: Iterable[Reply], model: str = "scripted") -> None:
        super().__init__(self._next, model)
        self._replies = list(replies)

    def _next(self, request: LLMRequest) -> Reply:
        if not self._replies:
            last = request.messages[-1].content if request.messages else None
            raise UnexpectedCall(f"call {len(self.requests)} was not scripted; its last message: {last!r:.200}")
        return self._replies.pop(0)

    def assert_complete(self) -> None:
        if self._replies:
            raise AssertionError(f"{len(self._replies)} scripted repl(ies) never used: {self._replies!r:.300}")
