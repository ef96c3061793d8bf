"""What a model needs from the requests sent to it, known from its name (the families below) or stated in `[llm]`.

A model of a known family starts with what it needs (no refusal to learn first); any other model starts plain and
learns its refusals (`gateway.refusals`). Configuration states any trait outright and wins over the name.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

PrefixContinuation = Literal["none", "continue_final_message", "deepseek_prefix", "completions"]
"""How the endpoint continues a reply from given text: not at all; vLLM's `continue_final_message` with
`add_generation_prompt: false` on a final assistant message; DeepSeek's `prefix: true` on that message; a raw
`/v1/completions` prompt rendered with the model's chat template (`gateway.chat_template`)."""

_SAMPLING = frozenset({"temperature", "top_p", "stop", "logprobs", "presence_penalty", "frequency_penalty"})


class ModelTraits(msgspec.Struct, frozen=True):
    """What requests to one model must take into account."""

    family: str = ""
    """The family the name matched ("" for none)."""
    refuses: frozenset[str] = frozenset()
    """Parameters it refuses (`refusals.REFUSABLE`), left out of its requests from the first call."""
    max_tokens_param: str = "max_tokens"
    """How it names the output limit."""
    thinks: bool = False
    """It thinks before it answers, in tokens that count against the output limit."""
    takes_reasoning_effort: bool = False
    """It takes `reasoning_effort` (OpenAI's reasoning models, gpt-oss); others get a thinking budget instead."""
    prefix_continuation: PrefixContinuation = "none"
    """How a reply can be continued from given text (budget forcing, continued thinking)."""
    thinking_room: int = 0
    """Tokens added to a call's visible output limit for the thinking, when the call sets no thinking budget."""


_OPENAI = ModelTraits(
    family="openai-reasoning",
    refuses=_SAMPLING,
    max_tokens_param="max_completion_tokens",
    thinks=True,
    takes_reasoning_effort=True,
    thinking_room=8192,
)
_FAMILIES: tuple[tuple[re.Pattern[str], ModelTraits], ...] = (
    # o1-mini and o1-preview take no system message either
    (re.compile(r"(^|/)o1-(mini|preview)"), msgspec.structs.replace(_OPENAI, refuses=_SAMPLING | {"system"})),
    (re.compile(r"(^|/)(o\d+(-mini|-pro)?|gpt-5(?!.*chat)[\w.-]*)(-\d{4}-\d\d-\d\d)?$"), _OPENAI),
    # DeepSeek's API: the thinking in reasoning_content; sampling parameters are ignored, logprobs refused
    (
        re.compile(r"(^|/)deepseek-reasoner"),
        ModelTraits(family="deepseek-reasoner", refuses=frozenset({"logprobs"}), thinks=True, thinking_room=8192),
    ),
    (
        re.compile(r"(^|/)(deepseek-r1|.*r1-distill|qwq)", re.IGNORECASE),
        ModelTraits(family="deepseek-r1", thinks=True, prefix_continuation="continue_final_message", thinking_room=4096),
    ),
    (
        re.compile(r"(^|/)gpt-oss", re.IGNORECASE),
        ModelTraits(family="gpt-oss", thinks=True, takes_reasoning_effort=True, thinking_room=4096),
    ),
    # Qwen3's hybrid and thinking models (its -Instruct-2507 models do not think)
    (
        re.compile(r"(^|/)qwen3(?!.*instruct)", re.IGNORECASE),
        ModelTraits(family="qwen3", thinks=True, prefix_continuation="continue_final_message", thinking_room=4096),
    ),
)


def traits_for(model: str) -> ModelTraits:
    """The traits a model's name says it has (plain ones for a name no family matches)."""
    return next((traits for pattern, traits in _FAMILIES if pattern.search(model)), ModelTraits())


EFFORT_BUDGET = {"low": 1024, "medium": 4096, "high": 16384}
"""The thinking budget a `reasoning_effort` becomes on a model that takes no effort but can be budgeted."""
