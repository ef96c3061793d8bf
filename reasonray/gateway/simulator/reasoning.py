"""How the simulated model thinks before it answers, and the three forms servers hand the thinking over in.

`field`: the thinking in the message's (and every stream delta's) `reasoning_content`, the answer in `content`,
which is null when `max_tokens` ran out while thinking (vLLM and SGLang with a reasoning parser, DeepSeek).
`r1`: raw text, the thinking first and then `</think>` and the answer, with no opening tag (an R1 chat template
writes it into the prompt); a reply cut while thinking has no closing tag. `hidden`: the thinking out of sight,
only counted in `usage.completion_tokens_details.reasoning_tokens`, with the parameters OpenAI's reasoning models
refuse refused as they refuse them.

The thinking is deterministic text of `thinking_tokens` tokens (scaled by `reasoning_effort`), carrying markers
(`[thought 120/800]`) so that a reply continuing earlier thinking (prefix continuation) resumes from the furthest
marker it was given, as the `think=` directive's visible reasoning does from its progress markers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reasonray.gateway.tokens import TokenCounter

REASONING_FORMS = ("off", "field", "r1", "hidden")
EFFORT_SCALE = {"minimal": 0.1, "low": 0.25, "medium": 1.0, "high": 4.0}
DEFAULT_THINKING_TOKENS = 300
THOUGHT = re.compile(r"\[thought (\d+)/(\d+)\]")
OPEN = re.compile(r"^\s*<think(?:ing)?>", re.IGNORECASE)
CLOSE = re.compile(r"</think(?:ing)?>", re.IGNORECASE)
_THOUGHTS = (
    "restating what is given before touching it",
    "trying the most direct route first",
    "checking that route against a small case",
    "questioning the assumption behind the last line",
    "redoing the last computation another way",
    "noting what is still open",
)


@dataclass
class ReasoningPlan:
    """How replies think: the form the thinking is handed over in, and how many tokens of it at medium effort."""

    form: str = "off"
    thinking_tokens: int = DEFAULT_THINKING_TOKENS

    def __post_init__(self) -> None:
        if self.form not in REASONING_FORMS:
            raise ValueError(f"unknown reasoning form {self.form!r}; use one of {', '.join(REASONING_FORMS)}")
        if self.thinking_tokens < 0:
            raise ValueError(f"thinking_tokens must be 0 or more, got {self.thinking_tokens}")

    def directed(self, directives: dict[str, str]) -> ReasoningPlan:
        """This plan as a request's `[[sim reasoning=FORM thinking=N]]` directives change it."""
        if "reasoning" not in directives and "thinking" not in directives:
            return self
        try:
            return ReasoningPlan(directives.get("reasoning", self.form), int(directives.get("thinking", self.thinking_tokens)))
        except ValueError as exc:
            raise ValueError(f"[[sim reasoning=... thinking=...]]: {exc}") from None


def handed_over(reasoning: str, text: str, unfinished: bool, form: str) -> tuple[str | None, str | None]:
    """A reply's `content` and `reasoning_content` as a server of `form` hands them over."""
    if form == "r1" and reasoning:  # the template opened the thinking: the text closes it, unless cut inside it
        return (reasoning if unfinished else f"{reasoning}\n</think>\n\n{text}"), None
    if form == "field" and reasoning:
        return text or None, reasoning
    return text or None, None


def resume_point(prefix: str | None, total: int, marker: re.Pattern[str] = THOUGHT) -> int:
    """How far a continued thinking (or a `think=` reasoning's progress) had got: its furthest marker of a thinking
    `total` tokens long (0: none)."""
    return max((int(done) for done, of in marker.findall(prefix or "") if int(of) == total), default=0)


def think(total: int, done: int, budget: int, counter: TokenCounter) -> tuple[str, bool]:
    """The thinking from `done` to `total` tokens, within `budget`: (text, whether it finished)."""

    def sentence(i: int, used: int) -> tuple[str, bool]:
        lead, step = " " if i or done else "", done // 20 + i
        if done + used >= total:  # the closing sentence is the last
            return f"{lead}So I am done thinking [thought {total}/{total}].", True
        return f"{lead}Thought {step}: {_THOUGHTS[step % len(_THOUGHTS)]} [thought {done + used}/{total}].", False

    return written(sentence, budget, counter)


def written(sentence: Callable[[int, int], tuple[str, bool]], budget: int, counter: TokenCounter) -> tuple[str, bool]:
    """The sentences `sentence(i, tokens so far)` writes, up to the one it says is the last (an empty one costs nothing),
    or until `budget` tokens run out inside one, cut there: (text, whether it finished)."""
    parts: list[str] = []
    used = 0
    while True:
        text, last = sentence(len(parts), used)
        cost = counter.count(text)
        if cost and used + cost > budget:
            return "".join(parts) + counter.head(text, max(budget - used, 0)), False
        parts.append(text)
        used += cost
        if last:
            return "".join(parts), True


def refusal(body: dict[str, Any]) -> dict[str, str] | None:
    """What OpenAI's reasoning models (o1, o3, o4-mini, gpt-5) answer 400 to, the first such parameter of `body`: the
    error's message (in their words), param and code."""
    if body.get("max_tokens") is not None:
        message = "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
        return {"message": message, "param": "max_tokens", "code": "unsupported_parameter"}
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None and value != 1:
            message = f"Unsupported value: '{name}' does not support {value} with this model. Only the default (1) value is supported."
            return {"message": message, "param": name, "code": "unsupported_value"}
    for name in ("stop", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty"):
        if body.get(name):  # an empty or 0 value, the default, is accepted
            message = f"Unsupported parameter: '{name}' is not supported with this model."
            return {"message": message, "param": name, "code": "unsupported_parameter"}
    for name in ("continue_final_message", "add_generation_prompt", "chat_template_kwargs"):
        if name in body:
            return {"message": f"Unrecognized request argument supplied: {name}", "param": name, "code": "unrecognized_argument"}
    return None


def continued_prefix(body: dict[str, Any]) -> str | None:
    """The assistant text a request asks to continue (vLLM's `continue_final_message`, DeepSeek's `prefix: true` on
    its last message), its opening thinking tag removed; None for a fresh reply."""
    messages = body.get("messages") or []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if last.get("role") != "assistant" or not (body.get("continue_final_message") or last.get("prefix")):
        return None
    content = last.get("content") or ""
    return OPEN.sub("", content, count=1) if isinstance(content, str) else ""
