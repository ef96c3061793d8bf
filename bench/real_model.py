"""ReasonRay against direct calls to the same real model server: chain of thought (one call) and
self-consistency (5 sampled chains), at 1, 4 and 16 requests in flight.

The model is SmolLM2-135M-Instruct on llama.cpp's server (`make setup-real`), which runs one request at
a time. The direct side sends the very requests ReasonRay's strategies send (the same system prompt,
question, max_tokens, temperature and seeds; self-consistency's five chains at once), so both sides ask
the server for the same generations; the script prints the completion tokens of each side to show it.
ReasonRay is `reasonray serve` pointed at the server through the environment, with the response cache
off (every call reaches the model) and a request timeout long enough for a one-slot queue
(--request-timeout). Each cell runs `--rounds` rounds with the sides in ABBA order (direct, ReasonRay, ReasonRay, direct),
each side sending `level` requests at once per round; a level below `--min-requests` runs that many more rounds
(at one in flight the sides alternate request by request, so the server's drift over seconds favours neither).

Every request of a round asks the same question (`--questions same`, the default; each round another one), so every
request puts the same work on the server. The server runs one call at a time: with several in flight, a request's
latency is its place in the server's queue times the work ahead of it. With questions of different answer lengths
(`--questions vary`) the order the server happened to take them in moved the p50 and mean by 5-18% either way from
run to run, on both sides alike; with equal work a place in the queue costs the same on both sides, and what is left
of the difference is ReasonRay's.

    .venv/bin/python bench/real_model.py [--levels 1,4,16] [--max-tokens 48] [--model-url URL]
    .venv/bin/python bench/real_model.py --pool run1.json run2.json   # earlier runs' --json cells added up

Prints first the server's own cost of streaming (the same request plain and streamed, straight to it:
ReasonRay streams to a real server so that a call it gives up on stops generating), then per workload and
level: wall time, throughput (requests/s), latency p50/p95 of each side, ReasonRay's added latency (p50
difference and ratio) and its throughput ratio (ReasonRay / direct). The direct side sends its calls as ReasonRay
does, streamed when ReasonRay streams (`--direct plain` sends them plain whatever ReasonRay does: the server's
own streaming cost is then part of the difference). `--stream off` measures ReasonRay with `[llm] stream = false`;
`--max-concurrency N` sets `[llm] max_concurrency`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _env import REPO

from reasonray.client import AsyncClient, ReasonRayError
from reasonray.gateway.local_model import LocalModelServer
from reasonray.gateway.simulator.server import free_port
from tests.serving import serve_into, stop_group

SYSTEM = (
    "Solve the user's problem. Think step by step inside <thinking>...</thinking>, "
    "then give only the final answer inside <answer>...</answer>."
)
SAMPLES = 5


@dataclass
class Side:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    completion_tokens: int = 0
    wall_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies)

    def p(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        if len(self.latencies) == 1:
            return self.latencies[0]
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[round(q) - 1]

    @property
    def mean(self) -> float:
        """Mean latency: at a server that runs one call at a time, the p50 of a few requests swings with the order the
        calls were queued in; the mean follows the work the server did."""
        return statistics.fmean(self.latencies) if self.latencies else float("nan")

    @property
    def throughput(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> Side:
        """A side as a run's `--json` kept it: its requests at their mean latency (enough for throughput and mean)."""
        return cls([summary["mean_s"]] * summary["ok"], dict(summary["errors"]), summary["completion_tokens"], summary["wall_s"])

    def absorb(self, other: Side) -> None:
        """Add another run of the same cell (its requests, time and tokens)."""
        self.latencies += other.latencies
        for kind, n in other.errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + n
        self.completion_tokens += other.completion_tokens
        self.wall_s += other.wall_s


def question(i: int) -> str:
    return f"What is {7 + i % 23} + {3 + (i * 7) % 19}?"


async def direct_request(http: httpx.AsyncClient, model: str, workload: str, i: int, max_tokens: int, stream: bool = False) -> int:
    """The calls ReasonRay's strategy makes for request i, sent straight to the server, plain or streamed as ReasonRay
    sends them (`stream`); completion tokens (streamed: the server's usage chunk, else one token per content chunk,
    as llama.cpp streams)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(i)}]

    async def call(temperature: float, seed: int | None) -> int:
        body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        if seed is not None:
            body["seed"] = seed
        if not stream:
            response = await http.post("/chat/completions", json=body)
            response.raise_for_status()
            return int(response.json()["usage"]["completion_tokens"])
        body.update(stream=True, stream_options={"include_usage": True})
        chunks, reported = 0, None
        async with http.stream("POST", "/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    reported = int(chunk["usage"]["completion_tokens"])
                chunks += any(c.get("delta", {}).get("content") for c in chunk.get("choices", []))
        return reported if reported is not None else chunks

    if workload == "cot":
        return await call(0.0, None)
    return sum(await asyncio.gather(*(call(0.7, seed) for seed in range(SAMPLES))))


async def reasonray_request(rr: AsyncClient, workload: str, i: int, max_tokens: int) -> int:
    if workload == "cot":
        config: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "system_prompt": SYSTEM}
        result = await rr.execute(question(i), strategy="chain_of_thought", strategy_config=config)
    else:
        config = {"samples": SAMPLES, "max_tokens": max_tokens, "temperature": 0.7, "seed": 0, "system_prompt": SYSTEM}
        result = await rr.execute(question(i), strategy="self_consistency", strategy_config=config)
    return int(result["metrics"]["completion_tokens"])


async def run_side(level: int, requests: int, one: Callable[[int], Awaitable[int]]) -> Side:
    side = Side()
    slots = asyncio.Semaphore(level)

    async def timed(i: int) -> None:
        async with slots:
            started = time.perf_counter()
            try:
                tokens = await one(i)
            except ReasonRayError as exc:
                kind = str(exc.data.get("error_type") or exc.code)
                side.errors[kind] = side.errors.get(kind, 0) + 1
                if exc.code != -32010:  # model_behavior: the calls were made and answered, only no answer parsed
                    return
            except httpx.HTTPError as exc:
                side.errors[type(exc).__name__] = side.errors.get(type(exc).__name__, 0) + 1
                return
            else:
                side.completion_tokens += tokens
            side.latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(timed(i) for i in range(requests)))
    side.wall_s = time.perf_counter() - started
    return side


def start_service(
    model_url: str, timeout_s: float, data_dir: str, max_concurrency: int | None = None, stream: bool | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REASONRAY_", "OPENAI_", "RAY_ADDRESS"))}
    env.update(
        PYTHONPATH=str(REPO),
        REASONRAY_LLM__PROVIDER="openai",
        REASONRAY_LLM__BASE_URL=model_url,
        REASONRAY_LLM__MODEL="smollm2",
        REASONRAY_LLM__API_KEY_REQUIRED="false",
        REASONRAY_LLM__CACHE__ENABLED="false",
        REASONRAY_LLM__REQUEST_TIMEOUT_S=str(timeout_s),
        REASONRAY_LOGGING__LEVEL="warning",
        REASONRAY_DATA_DIR=data_dir,
    )
    if max_concurrency is not None:
        env["REASONRAY_LLM__MAX_CONCURRENCY"] = str(max_concurrency)
    if stream is not None:
        env["REASONRAY_LLM__STREAM"] = "true" if stream else "false"
    process = serve_into(Path(data_dir) / "serve.log", "--port", str(port), env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"reasonray serve exited: {(Path(data_dir) / 'serve.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit("reasonray serve did not come up in 300 s")


def stop_service(process: subprocess.Popen[bytes]) -> None:
    stop_group(process, signal.SIGINT, 120)  # `reasonray serve` shuts its own Ray cluster down on SIGINT


async def streaming_cost(http: httpx.AsyncClient, max_tokens: int, rounds: int = 8) -> dict[str, float]:
    """The server's own price for streaming: the same CoT request sent straight to it, plain and streamed, alternating
    (ReasonRay streams to a real server: closing the stream is how a call it gives up on stops generating)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for n in range(rounds * 2):
        streamed = n % 2 == 1
        started = time.perf_counter()
        await direct_request(http, "smollm2", "cot", 20_000, max_tokens, streamed)
        times[streamed].append(time.perf_counter() - started)
    plain, streamed_p50 = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"the server alone, the same CoT request x{rounds}: plain p50 {plain:.3f}s, streamed p50 {streamed_p50:.3f}s ({streamed_p50 / plain:.3f}x)",
        flush=True,
    )
    return {"plain_p50_s": round(plain, 3), "streamed_p50_s": round(streamed_p50, 3), "ratio": round(streamed_p50 / plain, 3)}


async def breakdown(model_url: str, service_url: str, data_dir: str, requests: int, max_tokens: int) -> list[dict[str, Any]]:
    """Sequential CoT requests, each sent straight to the server and then through ReasonRay, with ReasonRay's own
    time split by its event log: the model call (`LLM_INVOCATION` latency_ms) and everything around it."""
    rows = []
    config = {"max_tokens": max_tokens, "temperature": 0.0, "system_prompt": SYSTEM}
    async with httpx.AsyncClient(base_url=model_url, timeout=600) as http, AsyncClient(service_url, timeout=600) as rr:
        await reasonray_request(rr, "cot", 30_000, 8)
        for i in range(requests):
            started = time.perf_counter()
            await direct_request(http, "smollm2", "cot", 30_001 + i, max_tokens)
            direct_s = time.perf_counter() - started
            started = time.perf_counter()
            result = await rr.execute(question(30_001 + i), strategy="chain_of_thought", strategy_config=config)
            wall_s = time.perf_counter() - started
            call_ms = sum(
                event.get("latency_ms", 0.0)
                for log in Path(data_dir, "events").glob(f"*/{result['trace_id']}.jsonl")
                for event in map(json.loads, log.read_text().splitlines())
                if event.get("type") == "LLM_INVOCATION"
            )
            row = {"direct_s": round(direct_s, 3), "reasonray_s": round(wall_s, 3), "model_call_s": round(call_ms / 1000, 3)}
            row["around_the_call_ms"] = round(wall_s * 1000 - call_ms, 1)
            rows.append(row)
            print(
                f"cot #{i}: direct {direct_s:.3f}s | reasonray {wall_s:.3f}s = model call {call_ms / 1000:.3f}s "
                f"+ {row['around_the_call_ms']:.1f} ms around it",
                flush=True,
            )
    around = statistics.median(r["around_the_call_ms"] for r in rows)
    print(f"ReasonRay around the model call, p50 over {requests}: {around:.1f} ms", flush=True)
    return rows


async def bench(
    model_url: str,
    service_url: str,
    levels: list[int],
    max_tokens: int,
    minimum: int,
    rounds: int = 2,
    direct_stream: bool = False,
    workloads: tuple[str, ...] = ("cot", "sc5"),
    same_question: bool = True,
) -> list[dict[str, Any]]:
    rows = []
    async with (
        httpx.AsyncClient(base_url=model_url, timeout=httpx.Timeout(1800.0)) as http,
        AsyncClient(service_url, timeout=1800) as rr,
    ):
        # warm both paths, each workload once: the first call through Serve starts its handles, the first
        # self-consistency run its branch runners' model clients; the server fills its caches
        for n, workload in enumerate(("cot", "sc5")):
            await direct_request(http, "smollm2", workload, 10_000 + n, 8)
            await reasonray_request(rr, workload, 10_000 + n, 8)
        rows.append({"workload": "server_streaming_cost", **await streaming_cost(http, max_tokens)})
        for workload in workloads:
            for level in levels:
                # each side sends `level` requests at once per round; a level below `minimum` runs that many more,
                # shorter rounds, so at one in flight the sides alternate request by request. In ABBA order (direct,
                # ReasonRay, ReasonRay, direct, ...): the server's speed drifts (the same call took 1.07-1.74 s within
                # minutes here) and would otherwise favour whichever side ran first
                blocks = rounds * -(-max(level, minimum) // level)
                direct, ours = Side(), Side()
                for r in range(blocks):
                    base = 1000 * r + r  # each round asks other questions, both sides the same ones

                    def ask(i: int, b: int = base) -> int:
                        return b if same_question else b + i

                    plan = (("direct", "ours"), ("ours", "direct"))[r % 2]
                    for side in plan:
                        if side == "direct":
                            one = lambda i, w=workload: direct_request(http, "smollm2", w, ask(i), max_tokens, direct_stream)
                            direct.absorb(await run_side(level, level, one))
                        else:
                            one = lambda i, w=workload: reasonray_request(rr, w, ask(i), max_tokens)
                            ours.absorb(await run_side(level, level, one))
                row = {
                    "workload": workload,
                    "concurrency": level,
                    "requests": level * blocks,
                    "direct": summary(direct),
                    "reasonray": summary(ours),
                    "added_latency_p50_s": round(ours.p(50) - direct.p(50), 3),
                    "latency_ratio_mean": round(ours.mean / direct.mean, 3) if direct.latencies else None,
                    "latency_ratio_p50": round(ours.p(50) / direct.p(50), 3) if direct.latencies else None,
                    "throughput_ratio": round(ours.throughput / direct.throughput, 3) if direct.throughput else None,
                }
                rows.append(row)
                print_row(row)
    return rows


def summary(side: Side) -> dict[str, Any]:
    return {
        "ok": side.requests,
        "errors": side.errors,
        "wall_s": round(side.wall_s, 2),
        "throughput_rps": round(side.throughput, 3),
        "p50_s": round(side.p(50), 3),
        "mean_s": round(side.mean, 3),
        "p95_s": round(side.p(95), 3),
        "completion_tokens": side.completion_tokens,
    }


def print_row(row: dict[str, Any]) -> None:
    d, r = row["direct"], row["reasonray"]
    print(
        f"{row['workload']:<4} c={row['concurrency']:<3} n={row['requests']:<3} | direct {d['throughput_rps']:.3f} req/s "
        f"p50 {d['p50_s']:.2f}s p95 {d['p95_s']:.2f}s tok {d['completion_tokens']} | reasonray {r['throughput_rps']:.3f} req/s "
        f"p50 {r['p50_s']:.2f}s p95 {r['p95_s']:.2f}s tok {r['completion_tokens']} errors {r['errors'] or 0} | "
        f"added p50 {row['added_latency_p50_s']:+.3f}s (x{row['latency_ratio_p50']}) mean x{row['latency_ratio_mean']} "
        f"throughput x{row['throughput_ratio']}",
        flush=True,
    )


def pooled(paths: list[Path]) -> list[dict[str, Any]]:
    """Several runs' `--json` rows added up per workload and level: each side's requests over its wall time, and its
    mean latency weighted by requests (a run's p50s do not add up). One run gives 16 requests a cell; the server's
    drift moves one cell's ratio by a few percent, several runs show where it settles."""
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    for path in paths:
        for row in json.loads(path.read_text()):
            if "concurrency" not in row:
                continue
            cell = cells.setdefault((row["workload"], row["concurrency"]), {"runs": 0, "direct": Side(), "reasonray": Side()})
            cell["runs"] += 1
            for name in ("direct", "reasonray"):
                cell[name].absorb(Side.from_summary(row[name]))
    rows = []
    for (workload, level), cell in cells.items():
        direct, ours = cell["direct"], cell["reasonray"]
        row = {
            "workload": workload,
            "concurrency": level,
            "runs": cell["runs"],
            "requests": ours.requests,
            "throughput_ratio": round(ours.throughput / direct.throughput, 3),
            "latency_ratio_mean": round(ours.mean / direct.mean, 3),
            "errors": {"direct": direct.errors, "reasonray": ours.errors},
        }
        rows.append(row)
        print(
            f"{workload:<4} c={level:<3} runs {row['runs']} n={row['requests']:<4} | direct {direct.throughput:.3f} req/s mean "
            f"{direct.mean:.2f}s | reasonray {ours.throughput:.3f} req/s mean {ours.mean:.2f}s | throughput x{row['throughput_ratio']} "
            f"mean latency x{row['latency_ratio_mean']} | errors {direct.errors or 0} / {ours.errors or 0}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,4,16", help="Requests in flight, comma-separated.")
    parser.add_argument("--workloads", default="cot,sc5", help="Which of cot and sc5, comma-separated.")
    parser.add_argument("--max-tokens", type=int, default=48, help="max_tokens of every call.")
    parser.add_argument(
        "--min-requests",
        type=int,
        default=4,
        help="Requests per side and round at least: a lower level runs as many more rounds of `level` requests "
        "(at 1 in flight the sides then alternate request by request).",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="Rounds per cell, the sides in ABBA order (2: direct, ReasonRay, ReasonRay, direct)."
    )
    parser.add_argument("--request-timeout", type=float, default=1800.0, help="ReasonRay's [llm] request_timeout_s.")
    parser.add_argument("--model-url", default=None, help="A running llama.cpp server (.../v1); default: start one.")
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="ReasonRay's [llm] max_concurrency (default: discovered, 1 for llama-cpp-python's server): 2 keeps the next "
        "call queued at a server that queues (the local server runs with --interrupt_requests False).",
    )
    parser.add_argument(
        "--stream",
        choices=["auto", "on", "off"],
        default="auto",
        help="ReasonRay's [llm] stream (auto: it streams to a real server, so a call it gives up on stops generating).",
    )
    parser.add_argument(
        "--direct",
        choices=["like", "plain", "stream"],
        default="like",
        help="How the direct side sends its calls: like ReasonRay does (streamed when ReasonRay streams, the default), or "
        "always plain, or always streamed.",
    )
    parser.add_argument(
        "--breakdown",
        type=int,
        default=0,
        metavar="N",
        help="Instead: N sequential CoT requests, each direct then through ReasonRay, ReasonRay's time split into the model "
        "call and the rest (from its event log).",
    )
    parser.add_argument(
        "--questions",
        choices=["same", "vary"],
        default="same",
        help="same: every request of a round asks one question (equal work, so queue order moves neither side); "
        "vary: each request its own.",
    )
    parser.add_argument("--json", type=Path, default=None, help="Also write the rows here.")
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="Instead: add up the cells of earlier runs' --json files (throughput and mean latency ratios); no server.",
    )
    args = parser.parse_args()
    if args.pool:
        rows = pooled(args.pool)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    levels = [int(v) for v in args.levels.split(",")]

    server = None if args.model_url else LocalModelServer().start()
    model_url = args.model_url or server.url  # type: ignore[union-attr]
    data_dir = tempfile.mkdtemp(prefix="reasonray-bench-real-")
    stream = {"auto": None, "on": True, "off": False}[args.stream]
    # ReasonRay streams to a real server unless told not to ([llm] stream unset: streamed)
    direct_stream = {"like": stream is not False, "plain": False, "stream": True}[args.direct]
    process, service_url = start_service(model_url, args.request_timeout, data_dir, args.max_concurrency, stream)
    try:
        print(
            f"model server {model_url}; ReasonRay {service_url}; max_tokens {args.max_tokens}; levels {levels}; "
            f"max_concurrency {args.max_concurrency or 'discovered'}; stream {args.stream}; direct calls "
            f"{'streamed' if direct_stream else 'plain'}; questions {args.questions}",
            flush=True,
        )
        if args.breakdown:
            rows = asyncio.run(breakdown(model_url, service_url, data_dir, args.breakdown, args.max_tokens))
        else:
            workloads = tuple(args.workloads.split(","))
            rows = asyncio.run(
                bench(
                    model_url,
                    service_url,
                    levels,
                    args.max_tokens,
                    args.min_requests,
                    args.rounds,
                    direct_stream,
                    workloads,
                    same_question=args.questions == "same",
                )
            )
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
    finally:
        stop_service(process)
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
