"""How long a model thinks: its own control where it has one, else budget forcing through prefix continuation.

Budget forcing (Muennighoff et al., s1): the reply is generated with the thinking budget as its limit; thinking the
limit cut is closed (`</think>`) and continued from, as the model's own reply, so that the model answers. Thinking
that closes before `min_thinking` is reopened with "Wait" and continued. A request's `continue_thinking` goes through
the same continuation: the reply carries on that text as its own thinking. The continuation is the endpoint's
(`ModelTraits.prefix_continuation`); where it has none and no effort control, `Completion.thinking_control` says
the budget was not enforced.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from reasonray.gateway.families import EFFORT_BUDGET, ModelTraits
from reasonray.gateway.protocol import Choice, Completion, LLMRequest, Usage

OPEN, CLOSE, WAIT = "<think>\n", "\n</think>\n\n", "\nWait"
MAX_EXTENSIONS = 3
"""Times thinking that closed too early is extended before the reply stands as it is."""

Send = Callable[[LLMRequest, "str | None", "int | None"], Awaitable[Completion]]
"""One call: the request, the text the reply continues (None: a fresh reply), and its output limit (None: the usual)."""


class Plan(msgspec.Struct, frozen=True):
    """How one call's thinking is controlled."""

    control: str
    """"" (nothing asked), "native" (the server's effort control), "forced" (budget forcing), "continued" (thinking
    continued from given text, no budget), "unsupported" (neither possible on the endpoint)."""
    effort: str | None = None
    """The `reasoning_effort` sent upstream (None: none)."""
    budget: int | None = None
    """The thinking budget in tokens, where it is enforced or at least made room for."""


def plan(
    request: LLMRequest, traits: ModelTraits, *, refused: frozenset[str], default_effort: str | None, default_budget: int | None
) -> Plan:
    """What a request's effort and budget become on a model of `traits`."""
    effort = request.reasoning_effort or default_effort
    budget = request.thinking_budget if request.thinking_budget is not None else default_budget
    if budget is None and request.min_thinking is None and request.continue_thinking is None:
        if effort is None:
            return Plan("")
        if "reasoning_effort" not in refused and (traits.takes_reasoning_effort or not traits.family):
            return Plan("native", effort=effort)
        budget = EFFORT_BUDGET[effort]
    if traits.prefix_continuation == "none":  # no budget forcing on this endpoint
        if budget is not None and request.continue_thinking is None and traits.takes_reasoning_effort and "reasoning_effort" not in refused:
            nearest = next((name for name, tokens in EFFORT_BUDGET.items() if budget <= tokens), "high")  # the effort nearest the budget
            return Plan("native", effort=effort or nearest, budget=budget)
        return Plan("unsupported", budget=budget)
    return Plan("forced" if budget is not None or request.min_thinking is not None else "continued", budget=budget)


async def controlled(send: Send, request: LLMRequest, chosen: Plan, *, visible_cap: int | None) -> Completion:
    """The reply to `request`, its thinking held to `chosen.budget` and `request.min_thinking` by continuation.

    Its `reasoning` is the thinking this reply did (after `request.continue_thinking`, which it does not repeat), and its
    usage that of every call it took. Without a budget, a reply cut while thinking stays unfinished (a caller carrying
    the thinking from call to call continues it); with one, the cut thinking is closed and the model made to answer."""
    given = OPEN + (request.continue_thinking or "")
    if chosen.budget == 0:  # no (more) thinking: close it at once and have the model answer
        reply = await send(request, given + CLOSE, visible_cap)
        choice, used = _answered(reply, "", "", Usage())
        return msgspec.structs.replace(reply, choices=(choice, *reply.choices[1:]), usage=used, thinking_control=chosen.control)
    reply = await send(request, given if request.continue_thinking is not None else None, chosen.budget)
    used, choice = reply.usage, reply.choices[0]
    thinking, text = choice.reasoning, choice.text
    for _ in range(MAX_EXTENSIONS):  # thinking that closed before the minimum is reopened with "Wait"
        if choice.thinking_unfinished or request.min_thinking is None or used.reasoning_tokens >= request.min_thinking:
            break
        reply = await send(request, given + thinking + WAIT, chosen.budget)
        used, choice = _add(used, reply.usage), reply.choices[0]
        thinking, text = thinking + WAIT + choice.reasoning, choice.text
    if chosen.budget is not None and choice.finish_reason == "length" and not choice.tool_calls:
        # the budget ran out while thinking (or the answer was cut): close what there is and have the model answer
        reply = await send(request, given + thinking + CLOSE + text, visible_cap)
        choice, used = _answered(reply, thinking, text, used)
    else:
        choice = msgspec.structs.replace(choice, text=text, reasoning=thinking)
    return msgspec.structs.replace(reply, choices=(choice, *reply.choices[1:]), usage=used, thinking_control=chosen.control)


def _answered(reply: Completion, thinking: str, head: str, used: Usage) -> tuple[Choice, Usage]:
    """The answer to a prefix whose thinking was closed (after `head`, answer text the prefix already held): all of the
    reply is answer, even what a reader took for thinking (an R1 parser sees no closing tag in it; a model known to think
    in its text may open an aside), and counted as answer, as the server counts it."""
    after = reply.choices[0]
    usage = Usage(reply.usage.prompt_tokens, reply.usage.completion_tokens, 0)
    choice = msgspec.structs.replace(after, text=head + (after.text or after.reasoning), reasoning=thinking, thinking_unfinished=False)
    return choice, _add(used, usage)


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(a.prompt_tokens + b.prompt_tokens, a.completion_tokens + b.completion_tokens, a.reasoning_tokens + b.reasoning_tokens)
