"""Fitting a prompt that embeds earlier replies (an attempt, a review, candidates) to the model's context.

A reply that rambled to the end of the context cannot be shown back whole: the prompt quoting it would be
refused. `fitted` shortens the embedded texts, keeping each one's head (the approach) and tail (where the
answer is stated) around an elision mark, until the prompt by the run's token counter leaves room for the
reply in `capabilities_of(llm).context_length`. With the context length unknown the request is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reasonray.gateway.capabilities import capabilities_of
from reasonray.gateway.protocol import LLMRequest
from reasonray.gateway.tokens import TokenCounter, count_messages
from reasonray.strategies.base import StrategyContext

ELISION = "\n[...]\n"
SAFETY_TOKENS = 16
"""Kept free beyond the reply's room: texts joined into a template may encode a token or two longer than apart."""
MAX_REPLY_SHARE = 0.5
"""The reply's room is its `max_tokens`, but at most this share of the context: the quoted texts get the rest."""
ATTEMPTS = 4


def shorten(counter: TokenCounter, text: str, n: int) -> str:
    """`text` in at most `n` tokens by `counter`'s count: unchanged when it fits, else its head and tail around ELISION."""
    n = max(n, 0)
    if counter.count(text) <= n:
        return text
    room = n - counter.count(ELISION)
    if room < 2:
        return counter.tail(text, n)
    return counter.head(text, room // 2) + ELISION + counter.tail(text, room - room // 2)


def shares(sizes: Sequence[int], budget: int) -> list[int]:
    """Each text's most tokens so they sum to at most `budget`: short texts keep all they have, long ones split the rest evenly."""
    caps = [0] * len(sizes)
    left = max(budget, 0)
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for done, i in enumerate(order):
        caps[i] = min(sizes[i], left // (len(order) - done))
        left -= caps[i]
    return caps


def fitted(context: StrategyContext, build: Callable[[tuple[str, ...]], LLMRequest], parts: tuple[str, ...]) -> LLMRequest:
    """The request `build(parts)` makes, with `parts` (the embedded texts) shortened so the prompt leaves its reply room
    in the model's context: `max_tokens`, at most MAX_REPLY_SHARE of it. As built when the context is unknown or it fits."""
    request = build(parts)
    window = capabilities_of(context.llm).context_length
    if window is None:
        return request
    counter = context.tokens
    reply = min(request.max_tokens or window, int(window * MAX_REPLY_SHARE))
    limit = window - reply - SAFETY_TOKENS
    if count_messages(counter, request.messages) <= limit:
        return request
    sizes = [counter.count(p) for p in parts]
    budget = limit - count_messages(counter, build(tuple("" for _ in parts)).messages)
    for _ in range(ATTEMPTS):
        request = build(tuple(shorten(counter, p, cap) for p, cap in zip(parts, shares(sizes, budget), strict=True)))
        over = count_messages(counter, request.messages) - limit
        if over <= 0 or budget <= 0:
            break
        budget -= over
    return request  # still too long (the template alone fills the context): the client refuses it with the counts
