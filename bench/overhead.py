"""What ReasonRay adds to one LLM call: `reasoning.execute` (chain_of_thought) through Ray Serve versus
the same chat completion sent straight to the same simulated model with the openai client, in one run;
and the cost of strategy resolution.

    .venv/bin/python bench/overhead.py [--requests 300]

Targets (issue 2): resolution under 1 ms p50; added latency through Serve under 15 ms p50.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from _env import REPO  # noqa: E402  (sets up the environment first)

from gateway.simulator.server import free_port  # noqa: E402
from reasonray.config import Settings, load_settings  # noqa: E402
from strategies.chain_of_thought import SYSTEM_PROMPT  # noqa: E402
from strategies.registry import StrategyRegistry, build_catalogue  # noqa: E402


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - started) * 1000)
    return out


def resolution_overhead(settings: Settings, n: int = 20_000) -> tuple[list[float], list[float]]:
    catalogue = build_catalogue(StrategyRegistry().discover(), settings.reasoning)

    def by_default(_):
        catalogue.resolve(None)

    def by_request(_):
        catalogue.resolve("chain_of_thought", {"max_tokens": 256, "temperature": 0.0})

    return timed(by_default, n), timed(by_request, n)


def wait_for(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()

    import ray
    from ray import serve

    from serve_app import build_app, ray_environment

    sim_port, api_port = free_port(), free_port()
    sim = subprocess.Popen(
        [Path(sys.executable).parent / "reasonray", "sim", "--port", str(sim_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    sim_url = f"http://127.0.0.1:{sim_port}/v1"
    try:
        wait_for(f"http://127.0.0.1:{sim_port}/healthz")
        base = load_settings(REPO / "config.toml", environ={}).model_dump(mode="json")
        base["llm"].update(provider="simulated", base_url=sim_url)
        base["logging"]["level"] = "warning"
        settings = Settings.model_validate(base)

        by_default, by_request = resolution_overhead(settings)

        if os.environ.get("BENCH_INGRESS") != "default":  # BENCH_INGRESS=default measures Serve's plain proxy
            os.environ.update(ray_environment(settings))  # the ingress `reasonray serve` uses
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": api_port})
        serve.run(build_app({"settings": settings.model_dump(mode="json"), "app_name": "bench"}), name="bench", route_prefix="/")

        direct = openai.OpenAI(base_url=sim_url, api_key="x", max_retries=0)
        max_tokens = settings.reasoning.strategies["chain_of_thought"]["default_max_tokens"]

        def call_direct(i: int) -> None:
            direct.chat.completions.create(
                model="simulated",
                messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"What is {i} * 7?"}],
                max_tokens=max_tokens,
                temperature=0.0,
            )

        api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=30)

        def call_serve(i: int) -> None:
            # distinct queries, so every call misses the cache and reaches the model like the direct call
            body = {"jsonrpc": "2.0", "id": i, "method": "reasoning.execute", "params": {"query": f"What is {i} * 7?"}}
            response = api.post("/rpc", json=body).json()
            assert "result" in response, response

        offset = 10_000
        timed(lambda i: call_direct(i + offset), args.warmup)
        timed(lambda i: call_serve(i + offset), args.warmup)
        # interleave in blocks so both paths see the same machine load
        direct_ms, serve_ms = [], []
        for block in range(0, args.requests, 50):
            direct_ms += timed(lambda i: call_direct(block + i), min(50, args.requests - block))
            serve_ms += timed(lambda i: call_serve(block + i), min(50, args.requests - block))
        cached_ms = timed(lambda i: call_serve(0), 100)
    finally:
        sim.terminate()
        sim.wait()
        try:
            serve.shutdown()
            ray.shutdown()
        except Exception:
            pass

    d50, d95, s50, s95 = pct(direct_ms, 0.5), pct(direct_ms, 0.95), pct(serve_ms, 0.5), pct(serve_ms, 0.95)
    print(f"requests: {args.requests} sequential per path (after {args.warmup} warm-up), simulated model, chain_of_thought")
    print(f"direct openai client -> simulator   p50 {d50:7.2f} ms   p95 {d95:7.2f} ms")
    print(f"reasoning.execute via Ray Serve      p50 {s50:7.2f} ms   p95 {s95:7.2f} ms")
    print(f"added by ReasonRay + Serve           p50 {s50 - d50:7.2f} ms   p95 {s95 - d95:7.2f} ms   ratio p50 {s50 / d50:.2f}x")
    print(f"  same query again (cache hit)       p50 {pct(cached_ms, 0.5):7.2f} ms   (ratio to direct {pct(cached_ms, 0.5) / d50:.2f}x)")
    r50, r95 = pct(by_default, 0.5) * 1000, pct(by_default, 0.95) * 1000
    q50, q95 = pct(by_request, 0.5) * 1000, pct(by_request, 0.95) * 1000
    print(f"strategy resolution (system default) p50 {r50:7.1f} us   p95 {r95:7.1f} us")
    print(f"strategy resolution (request+config) p50 {q50:7.1f} us   p95 {q95:7.1f} us   "
          f"(ratio to one direct LLM call p50: {q50 / 1000 / d50:.4f})")
    ok_resolution = q50 < 1000
    ok_added = s50 - d50 < 15
    print(f"target resolution < 1 ms p50: {'PASS' if ok_resolution else 'FAIL'};  "
          f"target added < 15 ms p50: {'PASS' if ok_added else 'FAIL'}")
    print(f"mean direct {statistics.mean(direct_ms):.2f} ms, mean serve {statistics.mean(serve_ms):.2f} ms")


if __name__ == "__main__":
    main()
