"""The first request against a warm one: right after the service is deployed, and after a scale-up.

    .venv/bin/python bench/cold_start.py [--ttft-ms 1500] [--tokens-per-second 200] [--k 5] [--requests 10]

Starts what `reasonray serve --llm simulated` starts (a local Ray cluster, Serve on loopback, the application
deployed by `serve_app.build_app`) against a simulated model with a slow first token, then over HTTP:

1. after deploy: MaTTS requests one after another; the first against the median of the 2nd..Nth;
2. after a scale-up (`[server] num_replicas` 1 -> 2, redeployed): requests one after another until the new
   replica has answered some (the replicas are told apart by their first request's extra time: the slowest of
   the requests right after the scale-up against the warm median);
3. the endpoint actor's round trip: what a call to a one-slot endpoint pays to take and give back its cluster slot.

Prints the latencies and their ratios (first / warm): near 1.0 is the goal.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
from _env import simulated_settings, start_ray  # (sets up the environment first)


def execute(client: httpx.Client, i: int, k: int) -> float:
    body = {
        "jsonrpc": "2.0",
        "id": i,
        "method": "reasoning.execute",
        "params": {"query": f"What is {13 + i} * {17 + k}?", "strategy": "matts", "strategy_config": {"k": k, "seed": i}},
    }
    started = time.perf_counter()
    response = client.post("/rpc", json=body)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200 and "result" in response.json(), response.text[:300]
    return elapsed


def deploy(settings: dict, name: str, replicas: int) -> None:
    from ray import serve

    from reasonray.serve_app import build_app

    settings = {**settings, "server": {**settings["server"], "num_replicas": replicas}}
    serve.run(build_app({"settings": settings, "app_name": name}), name=name, route_prefix="/")


async def lease_round_trip(n: int) -> list[float]:
    from reasonray.actors.endpoint import share_endpoints

    slots = share_endpoints("bench-cold-slots")
    assert slots is not None
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        lease = await slots.acquire("http://bench-endpoint/v1/", 1)
        slots.release(lease)
        samples.append((time.perf_counter() - started) * 1000)
    slots.stop()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ttft-ms", type=float, default=1500)
    parser.add_argument("--tokens-per-second", type=float, default=200)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()

    import ray
    from ray import serve

    from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings, free_port

    sim = SimulatorServer(SimulatorSettings(port=0, ttft_ms=args.ttft_ms, tokens_per_second=args.tokens_per_second)).start()
    settings = simulated_settings(
        sim.url, cache=False, memory={"enabled": False}, logging={"level": "warning"}, server={"replica_num_cpus": 0}
    )
    start_ray(settings)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)
    try:
        started = time.perf_counter()
        deploy(settings.model_dump(mode="json"), "bench-cold", 1)
        deployed_s = time.perf_counter() - started
        after_start = [execute(client, i, args.k) for i in range(args.requests)]
        deploy(settings.model_dump(mode="json"), "bench-cold", 2)  # a new replica; the first keeps running
        after_scale = [execute(client, 100 + i, args.k) for i in range(args.requests)]
        leases = asyncio.run(lease_round_trip(200))
    finally:
        client.close()
        serve.shutdown()
        ray.shutdown()
        sim.stop()

    m = statistics.median
    warm = m(after_start[1:])
    print(
        f"simulated model: ttft {args.ttft_ms:.0f} ms, {args.tokens_per_second:.0f} tokens/s; MaTTS k={args.k}; deploy took {deployed_s:.1f} s"
    )
    print(
        f"after deploy:   first {after_start[0]:.2f} s   warm (2nd..{args.requests}th) p50 {warm:.2f} s   ratio {after_start[0] / warm:.2f}"
    )
    print("                all: " + " ".join(f"{s:.2f}" for s in after_start))
    slowest = max(after_scale)
    print(
        f"after scale-up: slowest of the next {args.requests} {slowest:.2f} s (the new replica's first)   warm p50 {m(after_scale):.2f} s   "
        f"ratio {slowest / warm:.2f}"
    )
    print("                all: " + " ".join(f"{s:.2f}" for s in after_scale))
    print(
        f"endpoint actor slot (acquire + release, one-slot endpoint): p50 {m(leases):.2f} ms   "
        f"p95 {sorted(leases)[int(len(leases) * 0.95)]:.2f} ms   (n={len(leases)})"
    )


if __name__ == "__main__":
    main()
