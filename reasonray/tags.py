"""Reasoning tags: strip `<thinking>` from what is carried forward, extract `<answer>`.

The full text, thinking included, goes to the event log; everything carried into a later prompt or
returned as an answer goes through `strip_thinking` (seed 004). Nested, unclosed and R1-style
(closing tag only) forms are handled; `<think>` is treated like `<thinking>`.
"""

from __future__ import annotations

import re

_THINK_TAG = re.compile(r"<(/?)(?:thinking|think)\s*>", re.IGNORECASE)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.IGNORECASE | re.DOTALL)


def strip_thinking(text: str) -> str:
    kept: list[str] = []
    depth = 0
    pos = 0
    for tag in _THINK_TAG.finditer(text):
        if depth == 0:
            kept.append(text[pos : tag.start()])
        closing = tag.group(1) == "/"
        if not closing:
            depth += 1
        elif depth > 0:
            depth -= 1
        else:  # a closing tag with no opening one: everything before it was reasoning
            kept.clear()
        pos = tag.end()
    if depth == 0:
        kept.append(text[pos:])
    return re.sub(r"\n{3,}", "\n\n", "".join(kept)).strip()


def extract_answer(text: str) -> str | None:
    """The content of the last `<answer>` block outside thinking (an unclosed one runs to the end), or None."""
    found = _ANSWER.findall(strip_thinking(text))
    return found[-1].strip() if found else None
