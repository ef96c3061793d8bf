"""One place turns every reply form into the same Choice and Usage (reasonray/gateway/replies.py), and the
scripted doubles hand out thinking replies in that same shape."""

from __future__ import annotations

import asyncio

from reasonray.gateway.protocol import LLMRequest, user
from reasonray.gateway.testing import ScriptedLLM, Thinking

REQUEST = LLMRequest(messages=(user("What is 2 + 2?"),))


def test_scripted_thinking_replies_carry_reasoning_counts_and_unfinished_thinking() -> None:
    llm = ScriptedLLM(
        [
            Thinking("Two and two make four.", "4"),
            Thinking("Okay, the answer is 340 so far", "340 so far", unfinished=True),
            Thinking("", "4", reasoning_tokens=2000),
        ]
    )

    async def run() -> list:
        return [await llm.complete(REQUEST) for _ in range(3)]

    done, cut, hidden = asyncio.run(run())
    llm.assert_complete()
    assert (done.text, done.reasoning, done.thinking_unfinished) == ("4", "Two and two make four.", False)
    assert 0 < done.usage.reasoning_tokens < done.usage.completion_tokens
    assert (cut.text, cut.finish_reason, cut.thinking_unfinished) == ("", "length", True)
    assert cut.reasoning.endswith("so far") and cut.usage.completion_tokens == cut.usage.reasoning_tokens
    assert (hidden.text, hidden.reasoning, hidden.usage.reasoning_tokens) == ("4", "", 2000)
    assert hidden.usage.completion_tokens > 2000
