"""Reasoning tags: strip `<thinking>` from what is carried forward, extract `<answer>` (or any tag).

The full text, thinking included, goes to the event log; everything carried into a later prompt or
returned as an answer goes through `strip_thinking`, so the model's private reasoning is never carried forward. Nested, unclosed and R1-style
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


def extract_tag(text: str, tag: str) -> str | None:
    """The content of the last `<tag>...</tag>` block outside thinking (`<step>`, `<score>`, `<vote>`), or None."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", strip_thinking(text), re.IGNORECASE | re.DOTALL)
    return found[-1].strip() if found else None


_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?$")


def normalize_answer(answer: str) -> str:
    """The form answers are compared in when voting: case, spacing, wrapping and number format ignored.

    "  $1,200.00. " and "1200" compare equal; "The Answer" and "the answer" too.
    """
    text = re.sub(r"\s+", " ", answer).strip().lower()
    text = text.strip(" .;:!")
    text = re.sub(r"^\$|^\\boxed\{(.*)\}$", r"\1", text).strip()
    candidate = text.removesuffix("%").strip()
    if candidate and _NUMBER.match(candidate) and any(ch.isdigit() for ch in candidate):
        value = float(candidate.replace(",", ""))
        return str(int(value)) if value.is_integer() else repr(value)
    return text
