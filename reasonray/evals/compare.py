"""Strategies compared on the same examples: exact McNemar tests and paired bootstraps of the accuracy
difference, and the cost-accuracy Pareto front.

Two strategies that ran the same examples are compared pair by pair (same example, same seed), which
is far more sensitive than comparing two accuracies with their separate intervals: what differs
between the two is only the examples on which exactly one of them was right. An example that failed
(status "error") counts as not correct, as it does in the accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_RESAMPLES = 10_000


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: under "the strategies are equally good", each of the n = only_a +
    only_b discordant examples is equally likely to favour either, so min(only_a, only_b) is binomial
    (n, 1/2); the p-value is twice its lower tail, capped at 1 (1 when nothing is discordant)."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"discordant counts must be non-negative, got {only_a} and {only_b}")
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2**n)


@dataclass(frozen=True)
class Bootstrap:
    difference: float  # accuracy of a minus accuracy of b, on the paired examples
    ci_low: float  # 95% percentile interval of the difference
    ci_high: float
    p_value: float  # two-sided: how often a resample's difference falls on the other side of 0


def paired_bootstrap(a: Sequence[bool], b: Sequence[bool], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Bootstrap:
    """Resample the examples (pairs kept together) with replacement, `resamples` times; the difference of
    accuracies with its 95% percentile interval and a two-sided p-value, (k + 1) / (resamples + 1)-style so
    that it is never exactly 0. Seeded: the same inputs give the same figures."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    if not a:
        raise ValueError("no paired examples to compare")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[picks].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    at_most, at_least = int((means <= 0).sum()), int((means >= 0).sum())
    p = min(1.0, 2 * (min(at_most, at_least) + 1) / (resamples + 1))
    return Bootstrap(float(diff.mean()), float(low), float(high), p)


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    paired: int  # examples both ran (same example and seed)
    both: int  # right in both
    only_a: int  # right with a only
    only_b: int
    neither: int
    mcnemar_p: float
    difference: float
    ci_low: float
    ci_high: float
    bootstrap_p: float


def compare(name_a: str, a: dict[tuple[str, int], bool], name_b: str, b: dict[tuple[str, int], bool], *, seed: int = 0) -> Comparison:
    """`a` and `b` map (example id, seed) to correctness; only the keys both hold are compared."""
    keys = sorted(a.keys() & b.keys())
    if not keys:
        raise ValueError(f"{name_a} and {name_b} ran no example in common")
    xs, ys = [a[k] for k in keys], [b[k] for k in keys]
    only_a = sum(x and not y for x, y in zip(xs, ys, strict=True))
    only_b = sum(y and not x for x, y in zip(xs, ys, strict=True))
    both = sum(x and y for x, y in zip(xs, ys, strict=True))
    boot = paired_bootstrap(xs, ys, seed=seed)
    return Comparison(
        a=name_a,
        b=name_b,
        paired=len(keys),
        both=both,
        only_a=only_a,
        only_b=only_b,
        neither=len(keys) - both - only_a - only_b,
        mcnemar_p=mcnemar_exact(only_a, only_b),
        difference=boot.difference,
        ci_low=boot.ci_low,
        ci_high=boot.ci_high,
        bootstrap_p=boot.p_value,
    )


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, accuracy) points no other point dominates (costs no more and is at least as
    accurate, and is better in one of the two), by increasing cost."""
    front = [
        i
        for i, (cost, accuracy) in enumerate(points)
        if not any(c <= cost and acc >= accuracy and (c < cost or acc > accuracy) for c, acc in points)
    ]
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))
