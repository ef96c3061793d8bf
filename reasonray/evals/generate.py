"""Arithmetic task families generated from a seed, for studies on small models: `gen:FAMILY?key=value&...`.

    gen:sums?n=100&seed=0                  single-digit sums ("What is 7 + 5?")
    gen:differences?n=100&seed=0           single-digit differences, never negative ("What is 9 - 4?")
    gen:comparisons?n=100&seed=0           the larger of two two-digit numbers ("Which is larger, 47 or 52?")
    gen:running_sums?steps=4-16&n=100&seed=0
                                           a start and STEPS single-digit additions and subtractions, the total
                                           never negative; steps is a number or a range LOW-HIGH (each example
                                           draws its own): state carried across many steps

`n` (default 100) examples, `seed` (default 0): the same spec always gives the same examples, ids and order.
Families are chosen so that a ~100M-parameter model is partly right (sums, differences, comparisons) and so
that running sums grow harder with their steps, for bounded context against chain of thought.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from urllib.parse import parse_qsl

PREFIX = "gen:"


class GenerationError(ValueError):
    """The spec names no family or a bad parameter; evals.datasets reports it as the dataset's fault."""


def _sums(rng: random.Random, _: dict[str, str]) -> tuple[str, str]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"What is {a} + {b}?", str(a + b)


def _differences(rng: random.Random, _: dict[str, str]) -> tuple[str, str]:
    a, b = sorted((rng.randint(0, 9), rng.randint(0, 9)), reverse=True)
    return f"What is {a} - {b}?", str(a - b)


def _comparisons(rng: random.Random, _: dict[str, str]) -> tuple[str, str]:
    a, b = rng.sample(range(10, 100), 2)
    return f"Which is larger, {a} or {b}? Answer with the number.", str(max(a, b))


def _steps(value: str) -> tuple[int, int]:
    low, _, high = value.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise GenerationError(f"steps={value!r}: give a number or a range, e.g. steps=8 or steps=4-16") from None
    if not 1 <= bounds[0] <= bounds[1] <= 200:
        raise GenerationError(f"steps={value!r}: need 1 <= low <= high <= 200")
    return bounds


def _running_sums(rng: random.Random, params: dict[str, str]) -> tuple[str, str]:
    low, high = _steps(params.get("steps", "4-16"))
    total = rng.randint(0, 9)
    lines = [f"Start with {total}."]
    for _ in range(rng.randint(low, high)):
        step = rng.randint(1, 9)
        if total - step >= 0 and rng.random() < 0.5:
            total -= step
            lines.append(f"Subtract {step}.")
        else:
            total += step
            lines.append(f"Add {step}.")
    return " ".join(lines) + " What is the number now?", str(total)


FAMILIES: dict[str, Callable[[random.Random, dict[str, str]], tuple[str, str]]] = {
    "sums": _sums,
    "differences": _differences,
    "comparisons": _comparisons,
    "running_sums": _running_sums,
}
_KNOWN_PARAMS = {"n", "seed", "steps"}


def generate(spec: str) -> list[tuple[str, str, str]]:
    """The (id, question, answer) of a `gen:FAMILY?...` spec's examples, in their generated order."""
    family, _, query = spec.removeprefix(PREFIX).partition("?")
    make = FAMILIES.get(family)
    if make is None:
        raise GenerationError(f"{spec!r}: no generated family {family!r}; known: {', '.join(FAMILIES)}")
    params = dict(parse_qsl(query, keep_blank_values=True))
    if unknown := set(params) - _KNOWN_PARAMS:
        raise GenerationError(f"{spec!r}: unknown parameter(s) {', '.join(sorted(unknown))}; known: n, seed, steps")
    try:
        n, seed = int(params.get("n", "100")), int(params.get("seed", "0"))
    except ValueError:
        raise GenerationError(f"{spec!r}: n and seed are whole numbers") from None
    if not 1 <= n <= 100_000:
        raise GenerationError(f"{spec!r}: n must be between 1 and 100000")
    rng = random.Random(f"{family}:{seed}")  # the family in the seed: two families at one seed differ
    return [(f"{family}-s{seed}-{i}", *make(rng, params)) for i in range(n)]
