"""MaTTS parallel on Ray: wall time of k=5 against k=1, with the simulated model's latency model.

    .venv/bin/python bench/matts.py [--runs 8] [--ttft-ms 400] [--tokens-per-second 200]

Starts a local Ray cluster and the simulated model over HTTP, and runs MaTTS through the service
with the Ray fan-out (each attempt and each judge call a branch on the pool, as behind Serve). For
k=1 and k=5 it reports the median time of the attempt phase and of the whole run, for two tasks:
one whose attempts agree (no judge call is made: the whole run takes about the time of one attempt)
and one whose sampled attempts slip (`[[sim slip=0.3]]`: attempts disagree, and the judges that
start as soon as two finished attempts disagree add about one judge call after the slowest attempt).
Target: the whole run at k=5 within 1.2x of k=1 when the attempts agree.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _env import simulated_settings, start_ray  # (sets up the environment first)

TASKS = {"agree": "What is {a} * {b}?", "slip": "What is {a} * {b}? [[sim slip=0.3]]"}


async def measure(service, task: str, k: int, runs: int) -> tuple[list[float], list[float], list[str]]:
    from reasonray.api.service import ExecuteParams

    attempts, totals, selections = [], [], []
    for i in range(runs):
        query = TASKS[task].format(a=13 + i, b=17 + k)
        params = ExecuteParams(query=query, strategy="matts", strategy_config={"k": k, "seed": 100 * k + i})
        started = time.perf_counter()
        result = await service.execute(params, f"bench-{task}-{k}-{i}")
        totals.append((time.perf_counter() - started) * 1000)
        attempts.append(result.metrics.strategy_specific["attempts_ms"])
        selections.append(result.metrics.strategy_specific["selection"])
    return attempts, totals, selections


async def measure_all(app, runs: int) -> dict[tuple[str, int], tuple[list[float], list[float], list[str]]]:
    """Every cell in one event loop, the model client closed at the end (its connections belong to that loop)."""
    try:
        await measure(app.service, "slip", 5, 2)  # start the worker processes the branches run in
        return {(task, k): await measure(app.service, task, k, runs) for task in TASKS for k in (1, 5)}
    finally:
        await app.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--ttft-ms", type=float, default=400)
    parser.add_argument("--tokens-per-second", type=float, default=200)
    args = parser.parse_args()

    import ray

    from reasonray.actors.fanout import BranchPool, LLMSpec, RayFanout
    from reasonray.api.app import Backends, build_application
    from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings

    sim = SimulatorServer(SimulatorSettings(port=0, ttft_ms=args.ttft_ms, tokens_per_second=args.tokens_per_second)).start()
    settings = simulated_settings(sim.url, cache=False)
    start_ray(settings)
    try:
        pool = BranchPool("bench-matts", LLMSpec(settings.model_dump_json(), "bench-matts"), settings.fanout)
        pool.start()
        backends = Backends(cache=None, fanout=RayFanout(pool))
        app = build_application(settings, backends=backends, data_dir=None, memory=False)
        rows = asyncio.run(measure_all(app, args.runs))
    finally:
        ray.shutdown()
        sim.stop()
    m = statistics.median
    print(
        f"simulated model: ttft {args.ttft_ms:.0f} ms, {args.tokens_per_second:.0f} tokens/s; {args.runs} runs each; branches on a pool of async branch runners"
    )
    print("| MaTTS parallel | attempts phase p50 (ms) | whole run p50 (ms) | selections at k=5 |")
    print("|---|---:|---:|---|")
    for task in TASKS:
        a1, t1, _ = rows[(task, 1)]
        a5, t5, chosen = rows[(task, 5)]
        tally = ", ".join(f"{name} {chosen.count(name)}" for name in sorted(set(chosen)))
        print(f"| {task}: k=1 | {m(a1):.0f} | {m(t1):.0f} | |")
        print(f"| {task}: k=5 | {m(a5):.0f} | {m(t5):.0f} | {tally} |")
        print(f"| {task}: k=5 / k=1 | {m(a5) / m(a1):.2f}x | {m(t5) / m(t1):.2f}x | |")


if __name__ == "__main__":
    main()
