"""Strategies compared on the same examples: exact sign tests (McNemar's test when each example ran once),
example-clustered paired bootstraps of the accuracy difference, Holm's adjustment over every comparison of a
report, a one-sided non-inferiority test, and the cost-accuracy Pareto front.

The unit of analysis is the example. Seeds of one example are repeated measures of that example, not new
examples: a strategy's outcome on an example is its mean correctness over the seeds it ran (0 or 1 with one
seed), and every test and interval counts examples. The exact test is a sign test on the per-example
differences of those means: an example where A's mean is higher favours A, one where B's is higher favours B,
ties carry no evidence; under "equally good" each untied example favours either with probability 1/2. With
one seed this is exactly McNemar's test on the discordant examples; with several it does not multiply the
evidence by the number of seeds (2 discordant examples against 10 stay 2 against 10 whatever the seeds). The
bootstrap resamples examples, each carrying the mean difference over its seeds, so its interval is clustered
by example. An example that failed (status "error") counts as not correct, as it does in the accuracy.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
BOOTSTRAP_RESAMPLES = 5_000
Outcomes = Mapping[tuple[str, int], bool]  # (example id, seed) -> whether the answer was right


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar (sign test) p-value: under "the strategies are equally good", each of the n =
    only_a + only_b discordant examples is equally likely to favour either, so min(only_a, only_b) is binomial
    (n, 1/2); the p-value is twice its lower tail, capped at 1 (1 when nothing is discordant)."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"discordant counts must be non-negative, got {only_a} and {only_b}")
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2**n)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment (family-wise error over every p-value given), in the input's order: the
    i-th smallest p is multiplied by (m - i), made non-decreasing along the sorted order and capped at 1."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = itertools.accumulate((min(1.0, (m - rank) * p_values[i]) for rank, i in enumerate(order)), max)
    return [p for _, p in sorted(zip(order, adjusted, strict=True))]


@dataclass(frozen=True)
class Bootstrap:
    difference: float  # mean of a minus mean of b over the paired examples
    ci_low: float  # 95% percentile interval of the difference
    ci_high: float
    p_value: float  # two-sided Monte-Carlo p: twice the share of resamples on the far side of 0 (0 at the floor)
    resamples: int  # B: the p-value's resolution is 1/B
    at_floor: bool  # no resample fell on the far side of 0: the p-value is below 1/B, not a number


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Bootstrap:
    """Resample the examples (pairs kept together) with replacement, `resamples` times: the difference of
    means with its 95% percentile interval and a two-sided p-value. Each value is one example's outcome (its
    mean correctness over seeds). Seeded: the same inputs give the same figures."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    if not a:
        raise ValueError("no paired examples to compare")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if np.all(diff == 0):
        return Bootstrap(0.0, 0.0, 0.0, 1.0, resamples, False)
    means = _resampled_means(diff, resamples, seed)
    low, high = np.percentile(means, [2.5, 97.5])
    far = int((means <= 0).sum()) if diff.mean() > 0 else int((means >= 0).sum())
    p = min(1.0, 2 * far / resamples)
    return Bootstrap(float(diff.mean()), float(low), float(high), p, resamples, far == 0)


def _resampled_means(values: Sequence[float] | np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The mean of `values` in each of `resamples` seeded resamples with replacement (the same inputs, the same means)."""
    values = np.asarray(values, dtype=float)
    return values[np.random.default_rng(seed).integers(0, values.size, size=(resamples, values.size))].mean(axis=1)


def rounded(values: dict[str, Any]) -> dict[str, Any]:
    """A result's floats as reports give them: 6 decimals."""
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in values.items()}


def group_by(items: Iterable[T], key: Callable[[T], Any]) -> dict[Any, list[T]]:
    """`items` in lists by `key`, keys and items in first-seen order."""
    groups: dict[Any, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def per_example(outcomes: Mapping[tuple[str, int], bool | float]) -> dict[str, float]:
    """(example id, seed) -> correctness as example id -> mean correctness over its seeds."""
    by_example = group_by(outcomes.items(), lambda item: item[0][0])
    return {example: sum(float(value) for _, value in pairs) / len(pairs) for example, pairs in by_example.items()}


def clustered_interval(
    outcomes: Mapping[tuple[str, int], bool | float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """95% interval of an accuracy whose records cluster by example (several seeds each): examples resampled."""
    means = list(per_example(outcomes).values())
    if not means:
        return 0.0, 0.0
    low, high = np.percentile(_resampled_means(means, resamples, seed), [2.5, 97.5])
    return float(low), float(high)


def _paired(name_a: str, a: Outcomes, name_b: str, b: Outcomes) -> tuple[list[tuple[str, int]], list[float], list[float]]:
    """The (example, seed) keys both ran, and each example's mean outcome over them in a and in b, by example id."""
    keys = sorted(a.keys() & b.keys())
    if not keys:
        raise ValueError(f"{name_a} and {name_b} ran no example in common")
    mean_a, mean_b = per_example({k: a[k] for k in keys}), per_example({k: b[k] for k in keys})
    examples = sorted(mean_a)
    return keys, [mean_a[e] for e in examples], [mean_b[e] for e in examples]


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    paired: int  # examples both ran (seeds of one example are one example)
    seeds: int  # most seeds any paired example ran
    both: int  # examples where both are equally good and right (mean 1 in both with one seed)
    only_a: int  # examples where a's mean over seeds is higher
    only_b: int
    neither: int  # examples tied below both right (both wrong with one seed)
    mcnemar_p: float  # exact sign test on only_a against only_b (McNemar's with one seed)
    difference: float
    ci_low: float
    ci_high: float
    bootstrap_p: float | str  # a number, or "< 1/B" when no resample reached the other side of 0
    bootstrap_resamples: int


def compare(name_a: str, a: Outcomes, name_b: str, b: Outcomes, *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> Comparison:
    """`a` and `b` map (example id, seed) to correctness; only the (example, seed) keys both hold are compared,
    and they are then pooled by example."""
    keys, xs, ys = _paired(name_a, a, name_b, b)
    only_a = sum(x > y for x, y in zip(xs, ys, strict=True))
    only_b = sum(y > x for x, y in zip(xs, ys, strict=True))
    both = sum(x == y == 1.0 for x, y in zip(xs, ys, strict=True))
    boot = paired_bootstrap(xs, ys, seed=seed, resamples=resamples)
    return Comparison(
        a=name_a,
        b=name_b,
        paired=len(xs),
        seeds=max(Counter(example for example, _ in keys).values()),
        both=both,
        only_a=only_a,
        only_b=only_b,
        neither=len(xs) - both - only_a - only_b,
        mcnemar_p=mcnemar_exact(only_a, only_b),
        difference=boot.difference,
        ci_low=boot.ci_low,
        ci_high=boot.ci_high,
        bootstrap_p=f"< {1 / boot.resamples:.2g}" if boot.at_floor else boot.p_value,  # below its resolution: a bound
        bootstrap_resamples=boot.resamples,
    )


@dataclass(frozen=True)
class NonInferiority:
    a: str  # the new strategy (e.g. bounded context)
    b: str  # the reference (e.g. chain of thought at equal capacity)
    paired: int  # examples
    margin: float  # a is non-inferior when a - b > -margin, in accuracy points as a fraction
    difference: float
    lower_bound: float  # one-sided 95% lower bound of a - b (the bootstrap's 5th percentile), examples resampled
    non_inferior: bool  # lower_bound > -margin


def non_inferiority(
    name_a: str, a: Outcomes, name_b: str, b: Outcomes, *, margin: float = 0.10, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> NonInferiority:
    """Is a no worse than b by more than `margin`? The one-sided 95% lower confidence bound of the paired,
    example-clustered difference a - b must lie above -margin."""
    if not 0 < margin < 1:
        raise ValueError(f"the margin is a fraction between 0 and 1, got {margin}")
    _, xs, ys = _paired(name_a, a, name_b, b)
    diff = np.asarray(xs, dtype=float) - np.asarray(ys, dtype=float)
    lower = float(np.percentile(_resampled_means(diff, resamples, seed), 5))
    return NonInferiority(name_a, name_b, int(diff.size), margin, float(diff.mean()), lower, lower > -margin)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, accuracy) points no other point dominates (costs no more and is at least as
    accurate, and is better in one of the two), by increasing cost."""
    front = [
        i
        for i, (cost, accuracy) in enumerate(points)
        if not any(c <= cost and acc >= accuracy and (c < cost or acc > accuracy) for c, acc in points)
    ]
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))
