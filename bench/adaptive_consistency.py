"""Adaptive consistency against fixed k: accuracy, tokens and samples per question on the simulated model.

    .venv/bin/python bench/adaptive_consistency.py [--questions 60] [--slips 0.2,0.4]

Self-consistency over two-digit products that the simulated model gets wrong at a given rate
(`[[sim slip=p]]`: each sampled chain slips independently), run in process (no Ray, no HTTP): fixed
k = 5 and k = 10, the same with `adaptive: true` (stop once further chains cannot change the vote: the
same answers by construction), and k <= 10 with the Beta stopping rule at 0.95. Each question has its
own seed, shared by every configuration, so the adaptive runs' chains are the fixed runs' first ones.
"""

from __future__ import annotations

import argparse
import asyncio
import random

import _env  # noqa: F401  (sets up the environment first)

CONFIGS = {
    "fixed k=5": {"samples": 5},
    "adaptive k<=5": {"samples": 5, "adaptive": True},
    "fixed k=10": {"samples": 10},
    "adaptive k<=10": {"samples": 10, "adaptive": True},
    "adaptive k<=10, Beta 0.95": {"samples": 10, "adaptive": True, "stop_confidence": 0.95},
}


async def measure(slip: float, questions: int) -> None:
    from reasonray.gateway.simulator.inprocess import SimulatedLLM
    from reasonray.strategies.self_consistency import SelfConsistency
    from tests.unit.strategy_harness import context_for

    rng = random.Random(0)
    pairs = [(rng.randint(11, 99), rng.randint(11, 99)) for _ in range(questions)]
    for name, config in CONFIGS.items():
        right = tokens = used = 0
        for i, (a, b) in enumerate(pairs):
            context, _ = context_for(SimulatedLLM(), strategy="self_consistency", keep=False)
            query = f"What is {a} * {b}? [[sim slip={slip}]]"
            result = await SelfConsistency().reason(query, context=context, config={**config, "seed": 100 * i})
            right += result.answer == str(a * b)
            tokens += result.metrics.total_tokens
            used += result.metrics.strategy_specific["samples_used"]
        print(
            f"slip {slip}  {name:26s} accuracy {right}/{questions}  tokens/question {tokens / questions:7.1f}"
            f"  samples/question {used / questions:5.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--slips", default="0.2,0.4", help="comma-separated slip rates of the simulated chains")
    args = parser.parse_args()
    for slip in (float(s) for s in args.slips.split(",")):
        asyncio.run(measure(slip, args.questions))


if __name__ == "__main__":
    main()
