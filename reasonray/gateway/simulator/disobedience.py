"""How the simulated model disobeys, as real (small, local) models do: what a reply looks like when it ignores
the reply format it was asked for, rambles until `max_tokens`, or fumbles a tool call.

The engine decides whether a reply disobeys (a seeded draw at the plan's rate, or a `disobey=` directive)
and which way; this module only writes the disobedient text from what an obedient reply would have said.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from reasonray.gateway.simulator.structured import NUMBER, TAG

DISOBEY_KINDS = ("prose", "ramble", "tools")
ANY_TAG = re.compile(r"</?\w+>")

_OPENERS = ("Okay, let me think about this.", "Let's see.", "Alright, so the question is interesting.", "Hmm.")
_FILLER = (
    " Let me reconsider the problem from the beginning.",
    " Actually, wait, I should double-check that.",
    " Hmm, that does not seem right, so let me try again.",
    " We have {a} and {b} here, so we need to be careful.",
    " First, let's look at {a} more closely.",
    " The problem is asking us to work with {b}.",
    " It is important to be precise with every step of this.",
    " Let me think about what the question really means.",
)


@dataclass
class Disobedience:
    """What share of replies disobey (a seeded draw per reply) and the ways they may do it."""

    rate: float = 0.0
    kinds: tuple[str, ...] = DISOBEY_KINDS

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"disobey rate must be between 0 and 1, got {self.rate}")
        if not self.kinds:
            raise ValueError(f"disobey kinds is empty; use any of {', '.join(DISOBEY_KINDS)}")
        if unknown := set(self.kinds) - set(DISOBEY_KINDS):
            raise ValueError(f"unknown disobey kinds {sorted(unknown)}; use any of {', '.join(DISOBEY_KINDS)}")

    @classmethod
    def from_directive(cls, value: str) -> Disobedience:
        """`disobey=0.3` (a rate, every kind) or `disobey=prose,tools` (always, one of these kinds)."""
        try:
            return cls(float(value)) if re.fullmatch(r"[\d.]+", value) else cls(1.0, tuple(filter(None, value.split(","))))
        except ValueError as exc:
            raise ValueError(f"[[sim disobey={value}]]: {exc}") from None


def in_prose(text: str, rng: random.Random, problem: str | None) -> str:
    """The reply with its tags ignored: the answer said in words ("The answer is: 76", "#### 76", "17 * 23 = 391.
    The answer is correct."), a score as a rating out of 10 or a bare opinion, a vote as a sentence."""

    def spell(match: re.Match[str]) -> str:
        tag, body = match.group(1), match.group(2).strip()
        if tag == "answer":
            forms = ["The answer is: {x}", "#### {x}", "So the result is {x}."]
            if problem:
                forms.append(f"{problem} = {{x}}. The answer is correct.")
            return rng.choice(forms).format(x=body)
        if tag == "score":
            try:
                value = float(body)
            except ValueError:
                return body
            return rng.choice(
                (f"I would rate this {round(value * 10)}/10.", "This solution looks " + ("correct." if value >= 0.5 else "wrong."))
            )
        if tag == "vote":
            return rng.choice(
                (f"The best one is candidate {body}.", f"I think option {body} is the most promising.", "They all look fine.")
            )
        if tag == "status":
            return "Yes, the agent solved the task." if body == "success" else "No, the agent got it wrong."
        return ANY_TAG.sub(" ", body)

    return ANY_TAG.sub(" ", TAG.sub(spell, text)).strip()


def ramble(question: str, count: Any, budget: int, rng: random.Random) -> str:
    """Talk around the question without ever answering it, until `budget` tokens (by `count`) are used up."""
    numbers = NUMBER.findall(question) or ["it", "the rest"]
    a, b = numbers[0], numbers[min(1, len(numbers) - 1)]
    parts, used = [rng.choice(_OPENERS)], 0
    while used <= budget:
        sentence = rng.choice(_FILLER).format(a=a, b=b)
        parts.append(sentence)
        used += count(sentence)
    return "".join(parts)


def malformed_arguments(arguments: str, rng: random.Random) -> str:
    """Tool-call arguments that are not JSON, the way small models get them wrong."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        parsed = {}
    pairs = parsed.items() if isinstance(parsed, dict) else ()
    forms = (
        arguments.rstrip().removesuffix("}") if arguments.strip().endswith("}") else arguments + ",",  # cut short
        "{" + ", ".join(f"'{k}': '{v}'" for k, v in pairs) + "}",  # Python's quotes
        ", ".join(f"{k}={v}" for k, v in pairs) or "the expression",  # keyword syntax
    )
    broken = rng.choice(forms)
    try:
        json.loads(broken)
    except json.JSONDecodeError:
        return broken
    return "{" + broken  # an empty call still must not parse
