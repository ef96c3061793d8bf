"""Evaluation throughput: examples per second in this process one at a time (the baseline), in this
process 8 at a time, and as Ray tasks 8 at a time, with the simulated model's latency model.

    .venv/bin/python bench/evals.py [--examples 30] [--ttft-ms 300] [--tokens-per-second 200]

Chain of thought over the repository's GSM8K-format sample, the response cache off so every
example reaches the model. The Ray row starts a local Ray cluster (its start-up is not counted:
the figure is the grid's wall time, as the report's run measures it). Ratios are against the
baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

from _env import REPO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=30)
    parser.add_argument(
        "--dataset",
        type=Path,
        default=REPO / "evals" / "samples" / "word_problems.jsonl",
        help="GSM8K-format JSONL (default: the repository's 30-problem sample)",
    )
    parser.add_argument("--ttft-ms", type=float, default=300.0)
    parser.add_argument("--tokens-per-second", type=float, default=200.0)
    args = parser.parse_args()
    os.environ["REASONRAY_LLM__SIMULATOR__TTFT_MS"] = str(args.ttft_ms)
    os.environ["REASONRAY_LLM__SIMULATOR__TOKENS_PER_SECOND"] = str(args.tokens_per_second)

    from reasonray.evals.run import EvalOptions, run_async

    rows = []
    for label, use_ray, concurrency in [
        ("in-process, 1 at a time (baseline)", False, 1),
        ("in-process, 8 at a time", False, 8),
        ("Ray tasks, 8 in flight", True, 8),
    ]:
        report = asyncio.run(
            run_async(
                EvalOptions(
                    dataset=args.dataset,
                    strategies=["chain_of_thought"],
                    limit=args.examples,
                    out=Path(tempfile.mkdtemp()) / "bench",
                    use_ray=use_ray,
                    concurrency=concurrency,
                    cache=False,
                    progress=False,
                )
            )
        )
        [row] = report["rows"]
        assert row["examples"] == args.examples and row["errors"] == 0, row
        rows.append((label, report["grid_seconds"], args.examples / report["grid_seconds"]))

    base = rows[0][2]
    print(f"evaluation throughput, {args.examples} examples, simulated model ttft {args.ttft_ms:g} ms, {args.tokens_per_second:g} tok/s")
    print(f"{'':38} {'wall s':>8} {'examples/s':>11} {'vs baseline':>12}")
    for label, seconds, rate in rows:
        print(f"{label:38} {seconds:8.2f} {rate:11.2f} {rate / base:11.2f}x")


if __name__ == "__main__":
    main()
