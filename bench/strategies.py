"""Strategies side by side on the simulated model with its latency model: accuracy, calls, tokens, time.

    .venv/bin/python bench/strategies.py [--problems 30] [--slip 0.3] [--ttft-ms 150] [--tokens-per-second 200]

Every strategy answers the same arithmetic problems. Sampled replies (temperature > 0) "slip" with
probability `--slip` (a wrong intermediate result, see docs/simulator.md); greedy replies never do,
so chain of thought at temperature 0 is always right here, unlike with a real model. The sampled
chain-of-thought row shows what one noisy chain gets; the others show what voting and search recover
from the same noise, and at what cost. Branches run concurrently (asyncio, as Ray tasks do behind
Serve), so the wall time is that of the sequential rounds, not of the calls. Ratios are against
greedy chain of thought measured in the same run. The figures go in docs/strategies/comparison.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time

import _env  # noqa: F401  (sets up the environment first)
import structlog

from reasonray.gateway.observed import ObservedLLM
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.events import EventRecorder
from reasonray.strategies.base import StrategyContext
from reasonray.strategies.chain_of_thought import ChainOfThought
from reasonray.strategies.self_consistency import SelfConsistency
from reasonray.strategies.tree_of_thought import TreeOfThought

RUNS = [
    ("chain_of_thought (greedy)", ChainOfThought(), {}),
    ("chain_of_thought (sampled, T=0.7)", ChainOfThought(), {"temperature": 0.7, "seed": 1}),
    ("self_consistency (5 samples)", SelfConsistency(), {"samples": 5}),
    ("self_consistency (9 samples)", SelfConsistency(), {"samples": 9}),
    ("tree_of_thought (bfs, value)", TreeOfThought(), {"search": "bfs", "evaluation": "value"}),
    ("tree_of_thought (dfs, value)", TreeOfThought(), {"search": "dfs", "evaluation": "value"}),
    ("tree_of_thought (bfs, vote)", TreeOfThought(), {"search": "bfs", "evaluation": "vote"}),
]


def problems(count: int, slip: float) -> list[tuple[str, str]]:
    out = []
    for i in range(count):
        a, b, c = 12 + 7 * i % 83, 3 + 5 * i % 29, 100 + 13 * i % 400
        out.append((f"What is {a} * {b} + {c}? [[sim slip={slip}]]", str(a * b + c)))
    return out


async def run_one(llm: SimulatedLLM, strategy, config: dict, query: str):
    recorder = EventRecorder(None, keep=False)
    context = StrategyContext(
        llm=ObservedLLM(llm, recorder, trace_id="bench", strategy=strategy.name),
        tokens=counter_for_model("simulated"),
        emit=recorder,
        trace_id="bench",
    )
    started = time.perf_counter()
    result = await strategy.reason(query, context=context, config=config)
    return result, time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=30)
    parser.add_argument("--slip", type=float, default=0.3)
    parser.add_argument("--ttft-ms", type=float, default=150.0)
    parser.add_argument("--tokens-per-second", type=float, default=200.0)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    llm = SimulatedLLM(ttft_ms=args.ttft_ms, tokens_per_second=args.tokens_per_second)
    tasks = problems(args.problems, args.slip)
    print(f"{args.problems} problems, slip {args.slip}, latency model: ttft {args.ttft_ms} ms, {args.tokens_per_second} tokens/s\n")
    header = f"{'strategy':36} {'accuracy':>8} {'calls':>6} {'tokens':>7} {'p50 s':>6} {'tokens x':>8} {'time x':>7}"
    print(header)
    print("-" * len(header))
    baseline: tuple[float, float] | None = None
    for label, strategy, config in RUNS:
        correct, calls, tokens, times = 0, [], [], []
        for query, expected in tasks:
            result, seconds = await run_one(llm, strategy, config, query)
            correct += result.answer.strip() == expected
            calls.append(result.metrics.llm_calls)
            tokens.append(result.metrics.total_tokens)
            times.append(seconds)
        mean_tokens, p50 = statistics.mean(tokens), statistics.median(times)
        baseline = baseline or (mean_tokens, p50)
        print(
            f"{label:36} {correct / len(tasks):>8.0%} {statistics.mean(calls):>6.1f} {mean_tokens:>7.0f} {p50:>6.2f} "
            f"{mean_tokens / baseline[0]:>8.1f} {p50 / baseline[1]:>7.1f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
