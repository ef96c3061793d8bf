"""What recording the service's metrics costs per request: `reasoning.execute` (chain_of_thought,
in-process simulated model, no HTTP) through the JSON-RPC dispatcher inside a Ray actor, with the
`ray.util.metrics` recorder (`actors/metrics.py`) against none, in alternating rounds of one run.

    .venv/bin/python bench/metrics.py [--requests 2000]

Each request records about ten metrics (request, latency, tokens, LLM call, cache, breaker...).
"""

from __future__ import annotations

import argparse
import logging

import _env  # noqa: F401  (sets up the environment first)
import ray


@ray.remote(num_cpus=0)
class Bench:
    async def run(self, requests: int) -> dict[str, list[float]]:
        import time

        import structlog

        from reasonray.actors.metrics import RayMetrics
        from reasonray.api.app import local_dispatcher
        from reasonray.gateway.cache import CachingLLM, LRUTTLCache
        from reasonray.gateway.metered import MeteredLLM
        from reasonray.gateway.resilience import (
            CircuitBreaker,
            ResilientLLM,
            RetryPolicy,
        )
        from reasonray.gateway.simulator.inprocess import SimulatedLLM
        from reasonray.kernel.config import ReasoningSettings
        from reasonray.kernel.telemetry import NoMetrics

        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought")

        def dispatcher(metrics):
            breaker = CircuitBreaker()
            llm = CachingLLM(ResilientLLM(SimulatedLLM(), RetryPolicy(), breaker), LRUTTLCache())
            llm = MeteredLLM(llm, metrics, caching=True, breaker=breaker, endpoint="bench")
            return local_dispatcher(reasoning, llm, metrics=metrics)

        rpcs = {"off": dispatcher(NoMetrics()), "on": dispatcher(RayMetrics())}
        times: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(requests):
            for label in ("off", "on") if i % 2 else ("on", "off"):
                call = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "reasoning.execute",
                    "params": {"query": f"What is {i} * 7?", "strategy_config": {"temperature": 0.5}},
                }  # sampled: no cache hits
                started = time.perf_counter()
                payload, _ = await rpcs[label].handle_payload(call, None)
                times[label].append((time.perf_counter() - started) * 1000)
                assert "result" in payload, payload
        return times


def main() -> None:
    import statistics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        times = ray.get(Bench.remote().run.remote(args.requests))
    finally:
        ray.shutdown()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"reasoning.execute in a Ray actor, {args.requests} requests each, alternating")
    print(f"  metrics off  p50 {off:.3f} ms")
    print(f"  metrics on   p50 {on:.3f} ms   ({on / off:.2f}x, +{(on - off) * 1000:.0f} us per request)")


if __name__ == "__main__":
    main()
