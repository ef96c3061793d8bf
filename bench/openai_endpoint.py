"""The OpenAI-compatible endpoint against reasoning.execute, for the same runs, through the same Serve app:

- time to the first streamed chunk, and how long after the model's first reply the first progress
  chunk reaches the client (first progress chunk - first chunk - the first LLM call's latency);
- the latency the OpenAI surface adds to a plain run (chat.completions.create vs reasoning.execute).

    .venv/bin/python bench/openai_endpoint.py [--requests 200] [--streams 30]

Targets: the first progress chunk under 100 ms after the first model reply; added p50 under 2 ms.
"""

from __future__ import annotations

import argparse
import time

import httpx
import openai
from _env import pct, serve_bench_app, simulated_settings, simulator_process, start_ray, timed

from reasonray.gateway.simulator.server import free_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    api_port = free_port()
    with simulator_process() as (sim_url, _):
        settings = simulated_settings(sim_url, cache=False, logging={"level": "warning"}, memory={"enabled": False})
        start_ray(settings)  # with the ingress `reasonray serve` uses
        serve_bench_app(settings, api_port)
        url = f"http://127.0.0.1:{api_port}"
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        rpc = httpx.Client(base_url=url, timeout=60)

        def call_rpc(i: int) -> None:
            body = {
                "jsonrpc": "2.0",
                "id": i,
                "method": "reasoning.execute",
                "params": {"query": f"What is {i} * 7?", "strategy": "chain_of_thought"},
            }
            response = rpc.post("/rpc", json=body)
            assert response.status_code == 200 and "result" in response.json(), (response.status_code, response.text[:500])

        def call_openai(i: int) -> None:  # the same HTTP client as call_rpc: what the endpoint adds, not the SDK
            request = {"model": "reasonray/chain_of_thought", "messages": [{"role": "user", "content": f"What is {i} * 7?"}]}
            response = rpc.post("/v1/chat/completions", json=request)
            assert response.status_code == 200, response.text[:500]

        def call_sdk(i: int) -> None:
            sdk.chat.completions.create(model="reasonray/chain_of_thought", messages=[{"role": "user", "content": f"What is {i} * 7?"}])

        timed(call_rpc, args.warmup)
        timed(call_openai, args.warmup)
        timed(call_sdk, args.warmup)
        rpc_ms, openai_ms, sdk_ms = [], [], []
        for block in range(0, args.requests, 25):  # interleaved, so all see the same machine load
            n = min(25, args.requests - block)
            rpc_ms += timed(lambda i, block=block: call_rpc(1000 + block + i), n)
            openai_ms += timed(lambda i, block=block: call_openai(1000 + block + i), n)
            sdk_ms += timed(lambda i, block=block: call_sdk(5000 + block + i), n)

        first_chunk_ms, after_model_ms, total_ms = [], [], []
        for i in range(args.streams):
            started = time.perf_counter()
            stream = sdk.chat.completions.create(
                model="reasonray/bounded_context",
                messages=[{"role": "user", "content": f"[[sim think=4000 answer={i}]] run {i}"}],
                stream=True,
                extra_body={
                    "reasoning": {
                        "strategy_config": {
                            "chunk_size": 1024,
                            "carryover_size": 512,
                            "max_iterations": 10,
                            "on_max_iterations": "final_answer",
                        }
                    }
                },
            )
            first = progress = None
            for chunk in stream:
                now = (time.perf_counter() - started) * 1000
                first = first if first is not None else now
                text = (chunk.choices[0].delta.model_extra or {}).get("reasoning_content", "") if chunk.choices else ""
                if progress is None and text.startswith("[llm]"):  # "[llm] N tokens in X ms": the first model reply
                    progress, llm_ms = now, float(text.split(" in ")[1].split(" ms")[0])
            total_ms.append((time.perf_counter() - started) * 1000)
            first_chunk_ms.append(first)
            after_model_ms.append(progress - first - llm_ms)

    r50, o50 = pct(rpc_ms, 0.5), pct(openai_ms, 0.5)
    print(f"plain runs: {args.requests} per path, chain_of_thought, simulated model, cache off")
    print(f"reasoning.execute (JSON-RPC)          p50 {r50:7.2f} ms   p95 {pct(rpc_ms, 0.95):7.2f} ms")
    print(f"POST /v1/chat/completions (httpx)     p50 {o50:7.2f} ms   p95 {pct(openai_ms, 0.95):7.2f} ms")
    print(f"added by the OpenAI endpoint          p50 {o50 - r50:7.2f} ms   ratio p50 {o50 / r50:.3f}x")
    print(f"  through the openai SDK (its own parsing included)  p50 {pct(sdk_ms, 0.5):7.2f} ms")
    print(f"streams: {args.streams} bounded_context runs (1024-token chunks, up to 10 iterations)")
    print(f"first chunk after the request         p50 {pct(first_chunk_ms, 0.5):7.2f} ms   p95 {pct(first_chunk_ms, 0.95):7.2f} ms")
    a50, a95 = pct(after_model_ms, 0.5), pct(after_model_ms, 0.95)
    print(f"first progress chunk after the model's first reply  p50 {a50:7.2f} ms   p95 {a95:7.2f} ms")
    print(f"whole stream                          p50 {pct(total_ms, 0.5):7.2f} ms")
    print(
        f"target first progress chunk < 100 ms after the first model reply: {'PASS' if a95 < 100 else 'FAIL'} (p95);  target added < 2 ms p50: {'PASS' if o50 - r50 < 2 else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
