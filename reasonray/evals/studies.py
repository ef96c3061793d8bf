"""Curves derived from a run's records: the memory's learning curve (memory on against memory off on the same
streams) and test-time scaling curves from one MaTTS run at k = K (majority@k, judge-selected@k, oracle pass@k).

Learning curve: each arm's accuracy by block of the stream (the stream split into `BLOCKS` consecutive blocks
by position, seeds and stream orders pooled), and the paired on - off difference over the later part of the
stream (positions from `LATER_FROM` of its length on: the memory has had the earlier part to learn from), as
an exact sign test and an interval from a bootstrap that resamples examples (evals/compare.py); with a placebo
arm (memories of a learned item's length that hold nothing), the same difference of memory on against placebo.
Beside them, each arm's manipulation check: how many memory items it stored over its streams and the share of its
runs that retrieved one (a memory-on arm that stored nothing has not tested learning, whatever its curve says).

Scaling curves: MaTTS logs every attempt in order (`attempts`: its normalized answer, judge score, chosen, or
how it failed). The first k attempts of a run at K are a run at k (attempt i is sampled with seed + i at the
same temperature whatever K is), so for k = 1..K: majority@k is the most common answer among the first k
finished attempts as the scorer reads them (ties to the earlier), judge-selected@k is the attempt the run's own rule would choose among
them (`strategies.matts.judge_selected`), oracle pass@k is whether any of them is right (an upper bound no
selector reaches). Intervals resample examples. Three paired tests go with each curve: majority@K and
judge-selected@K against the same rule at k = 1, and judge-selected@K against majority@K.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict
from typing import Any

from reasonray.evals.compare import clustered_interval, compare, group_by, rounded
from reasonray.evals.runner import Record
from reasonray.evals.scoring import extract_number, same_number
from reasonray.strategies.matts import judge_selected

BLOCKS = 5
LATER_FROM = 0.5


def _accuracy(outcomes: dict[tuple[str, int], bool]) -> dict[str, Any]:
    n = len(outcomes)
    low, high = clustered_interval(outcomes)  # (0, 0) when there are none
    return rounded({"records": n, "accuracy": sum(outcomes.values()) / n if n else 0.0, "ci_low": low, "ci_high": high})


def learning_curves(records: list[Any], *, blocks: int = BLOCKS, later_from: float = LATER_FROM) -> list[dict[str, Any]]:
    """One curve per strategy/config that ran both memory arms."""
    curves = []
    for group, members in group_by([r for r in records if r.arm and r.position is not None], _config).items():
        length = max(r.position for r in members) + 1
        size = math.ceil(length / blocks)
        arms: dict[str, Any] = {}
        memory: dict[str, Any] = {}
        for arm, ours in sorted(group_by(members, lambda r: r.arm).items()):
            reports = [r.memory or {} for r in ours]
            memory[arm] = {
                "stored": sum(m.get("stored") or 0 for m in reports),
                "retrieved_share": round(sum(bool(m.get("retrieved")) for m in reports) / len(ours), 6),
            }
            arms[arm] = [
                {
                    "block": b,
                    "positions": [b * size, min(length, (b + 1) * size) - 1],
                    **_accuracy({(r.example_id, repeat(r)): r.correct for r in ours if b * size <= r.position < (b + 1) * size}),
                }
                for b in range(math.ceil(length / size))
            ]
        curve: dict[str, Any] = {"group": group, "stream_length": length, "block_size": size, "arms": arms, "memory": memory}
        curve |= {"later": None, "later_vs_placebo": None}
        start = math.floor(length * later_from)
        later = {arm: {(r.example_id, repeat(r)): r.correct for r in members if r.arm == arm and r.position >= start} for arm in arms}
        for other, field in (("off", "later"), ("placebo", "later_vs_placebo")):
            if {"on", other} <= later.keys() and later["on"].keys() & later[other].keys():
                c = compare("memory on", later["on"], f"memory {other}", later[other])
                curve[field] = {"from_position": start, **rounded(asdict(c))}
        curves.append(curve)
    return curves


def _config(r: Record) -> str:
    return f"{r.strategy}/{r.config_name}"


def repeat(r: Record) -> int:
    """The repetition of an example within a group: its seed and stream order."""
    return r.seed * 10_000 + r.order


def _right(answer: str | None, reference: str) -> bool:
    number = extract_number(answer or "")
    return number is not None and same_number(number, reference)


def majority(attempts: list[dict[str, Any]]) -> str | None:
    """The most common answer among finished attempts with one, each read as the scorer reads it (its last number,
    else its text: two prose replies ending in the same number are one vote); ties to the answer given first."""
    answers = [extract_number(a["answer"]) or a["answer"] for a in attempts if a.get("failed") is None and a.get("answer")]
    return Counter(answers).most_common(1)[0][0] if answers else None  # equal counts keep first-seen order


def k_outcomes(attempts: list[dict[str, Any]], reference: str, k: int) -> dict[str, bool]:
    """majority@k, judge-selected@k and oracle pass@k of one run from its first k logged attempts."""
    first = attempts[:k]
    chosen = judge_selected(first)
    by_index = {a["index"]: a for a in first}
    return {
        "majority": _right(majority(first), reference),
        "judge": chosen is not None and _right(by_index[chosen].get("answer"), reference),
        "oracle": any(a.get("failed") is None and _right(a.get("answer"), reference) for a in first),
    }


def k_curves(records: list[Any]) -> list[dict[str, Any]]:
    """For every strategy/config whose records log attempts: accuracy at k = 1..K by each selection rule."""
    curves = []
    for group, members in group_by([r for r in records if r.attempts], _config).items():
        top = min(len(r.attempts or []) for r in members)
        points, by_k = [], {}
        for k in range(1, top + 1):
            per_rule: dict[str, dict[tuple[str, int], bool]] = {"majority": {}, "judge": {}, "oracle": {}}
            for r in members:
                for rule, right in k_outcomes(r.attempts or [], r.reference, k).items():
                    per_rule[rule][(r.example_id, repeat(r))] = right
            by_k[k] = per_rule
            points.append({"k": k, **{rule: _accuracy(outcomes) for rule, outcomes in per_rule.items()}})
        # the paired questions a scaling claim rests on: does k = K beat k = 1, and does the judge beat the vote?
        tests = [(f"{rule}@{top}", by_k[top][rule], f"{rule}@1", by_k[1][rule]) for rule in ("majority", "judge")]
        tests.append((f"judge@{top}", by_k[top]["judge"], f"majority@{top}", by_k[top]["majority"]))
        gains = [rounded(asdict(compare(*test))) for test in tests] if top > 1 else []
        curves.append({"group": group, "k_max": top, "points": points, "comparisons": gains})
    return curves
