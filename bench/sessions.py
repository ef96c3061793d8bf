"""Sessions at scale through the HTTP API, as `reasonray serve` deploys it, against the simulated model at
500 ms to first token and 200 tokens/s; every figure from one run.

    .venv/bin/python bench/sessions.py [--sessions 1000] [--concurrency 64] [--hosts 2] [--quick]

1. baseline: chain_of_thought `reasoning.execute` calls at the same concurrency (turn p50 is compared to its p50);
2. N sessions created, one turn each at the concurrency: turn p50 and p95, and how much the session hosts'
   memory (RSS, psutil over their pids) and all the Ray cluster's processes' memory grew, per 1,000 live sessions;
3. N more sessions, one turn each, with one session host SIGKILLed when half the turns are done: every
   session must end with exactly one turn (none lost, none run twice), and every call must answer.

Targets: turn p50 <= 1.5x the chain_of_thought p50; <= 500 MiB per 1,000 live sessions; nothing lost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import psutil
from _env import pct, serve_bench_app, simulated_settings, simulator_process, start_ray

from reasonray.gateway.simulator.server import free_port

MIB = 1024 * 1024


def rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:  # a short-lived worker ended meanwhile
            pass
    return total


def cluster_pids(exclude: int) -> list[int]:
    """Every process of the Ray cluster this benchmark started (GCS, raylet, replicas, actors, workers): the
    descendants of this process, so other clusters on the machine are not counted; `exclude` is the simulator."""
    return [p.pid for p in psutil.Process().children(recursive=True) if p.pid != exclude]


async def rpc(client: httpx.AsyncClient, method: str, params: dict) -> dict:
    response = await client.post("/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return response.json()


async def at_concurrency(n: int, concurrency: int, work) -> list:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int):
        async with gate:
            return await work(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def timed_turns(client: httpx.AsyncClient, sids: list[str], concurrency: int, on_progress=None) -> tuple[list[float], list[dict]]:
    latencies: list[float] = []
    errors: list[dict] = []
    done = 0

    async def work(i: int) -> None:
        nonlocal done
        started = time.perf_counter()
        body = await rpc(client, "session.turn", {"session_id": sids[i], "message": f"What is {i} + 1?"})
        if "result" in body:
            latencies.append((time.perf_counter() - started) * 1000)
        else:
            errors.append(body["error"])
        done += 1
        if on_progress is not None:
            on_progress(done)

    await at_concurrency(len(sids), concurrency, work)
    return latencies, errors


async def create(client: httpx.AsyncClient, n: int, concurrency: int) -> list[str]:
    async def work(i: int) -> str:
        body = await rpc(client, "session.create", {})
        return body["result"]["session_id"]

    return await at_concurrency(n, concurrency, work)


async def run(base_url: str, args: argparse.Namespace, host_pids, sim_pid: int) -> dict:
    limits = httpx.Limits(max_connections=args.concurrency * 2, max_keepalive_connections=args.concurrency * 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:
        # warm-up: the first calls open connections and import lazily loaded code in the replica and hosts
        await timed_turns(client, await create(client, args.concurrency, args.concurrency), args.concurrency)

        cot: list[float] = []

        async def cot_call(i: int) -> None:
            started = time.perf_counter()
            body = await rpc(client, "reasoning.execute", {"query": f"What is {i} + 2?", "strategy": "chain_of_thought"})
            assert "result" in body, body
            cot.append((time.perf_counter() - started) * 1000)

        await at_concurrency(args.cot_requests, args.concurrency, cot_call)

        pids = host_pids()
        hosts_before, workers_before = rss(pids), rss(cluster_pids(sim_pid))
        started = time.perf_counter()
        sids = await create(client, args.sessions, args.concurrency)
        created_s = time.perf_counter() - started
        started = time.perf_counter()
        turns, errors = await timed_turns(client, sids, args.concurrency)
        turns_s = time.perf_counter() - started
        assert not errors, errors[:3]
        assert host_pids() == pids, "a session host restarted during the memory measurement"
        hosts_after, workers_after = rss(pids), rss(cluster_pids(sim_pid))

        # kill a host mid-load
        victim = pids[0]
        killed_at: list[int] = []

        def kill_at_half(done: int) -> None:
            if not killed_at and done >= args.sessions // 2:
                os.kill(victim, signal.SIGKILL)
                killed_at.append(done)

        more = await create(client, args.sessions, args.concurrency)
        kill_turns, kill_errors = await timed_turns(client, more, args.concurrency, kill_at_half)

        async def turns_of(i: int) -> tuple[int, int]:
            state = (await rpc(client, "session.get", {"session_id": more[i]}))["result"]
            return state["turn"], state["messages"]

        states = await at_concurrency(len(more), args.concurrency, turns_of)
    return {
        "cot": cot,
        "turns": turns,
        "created_s": created_s,
        "turns_s": turns_s,
        "hosts_growth": hosts_after - hosts_before,
        "workers_growth": workers_after - workers_before,
        "hosts_after": hosts_after,
        "kill_turns": kill_turns,
        "kill_errors": kill_errors,
        "killed_at": killed_at,
        "states": states,
        "restarted": host_pids()[0] != victim,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--hosts", type=int, default=2, help="[sessions] hosts")
    parser.add_argument("--cot-requests", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="200 sessions, 128 chain_of_thought calls")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.cot_requests = 200, 128

    import ray

    from reasonray.actors import NAMESPACE
    from reasonray.actors.session import host_name

    api_port = free_port()
    data_dir = Path(os.environ.get("BENCH_DATA_DIR") or f"/tmp/reasonray-bench-sessions-{os.getpid()}")
    with simulator_process("--ttft-ms", "500", "--tokens-per-second", "200") as (sim_url, sim_pid):
        settings = simulated_settings(
            sim_url,
            data_dir=str(data_dir),
            logging={"level": "warning"},
            memory={"embedding": "openai"},  # the memory bank is not used here; never load torch for it
            sessions={"hosts": args.hosts, "max_live_per_host": max(1024, 2 * args.sessions)},
        )
        start_ray(settings)  # with the ingress `reasonray serve` uses
        serve_bench_app(settings, api_port)

        def host_pids() -> list[int]:
            hosts = [ray.get_actor(host_name("bench", i), namespace=NAMESPACE) for i in range(args.hosts)]
            return [ray.get(h.stats.remote(), timeout=60)["pid"] for h in hosts]

        figures = asyncio.run(run(f"http://127.0.0.1:{api_port}", args, host_pids, sim_pid))

    n = args.sessions
    c50, c95 = pct(figures["cot"], 0.5), pct(figures["cot"], 0.95)
    t50, t95 = pct(figures["turns"], 0.5), pct(figures["turns"], 0.95)
    per_1000_hosts = figures["hosts_growth"] / MIB * 1000 / n
    per_1000_workers = figures["workers_growth"] / MIB * 1000 / n
    exact = sum(1 for turn, messages in figures["states"] if (turn, messages) == (1, 2))
    print(f"simulated model 500 ms to first token, 200 tokens/s; {args.hosts} session hosts; concurrency {args.concurrency}")
    print(f"chain_of_thought x{args.cot_requests}           p50 {c50:8.1f} ms   p95 {c95:8.1f} ms")
    print(
        f"{n} sessions created in {figures['created_s']:.1f} s; one turn each in {figures['turns_s']:.1f} s "
        f"({n / figures['turns_s']:.1f} turns/s)"
    )
    print(f"session.turn x{n}                p50 {t50:8.1f} ms   p95 {t95:8.1f} ms   ratio p50 to CoT {t50 / c50:.2f}x (target <= 1.5x)")
    print(
        f"RSS growth per 1,000 live sessions: session hosts {per_1000_hosts:7.1f} MiB (target <= 500), "
        f"all processes of the Ray cluster {per_1000_workers:7.1f} MiB; hosts now {figures['hosts_after'] / MIB:.0f} MiB in all"
    )
    print(
        f"host SIGKILLed after {figures['killed_at'][0] if figures['killed_at'] else '-'} of {n} turns (restarted: {figures['restarted']}): "
        f"{len(figures['kill_turns'])} turns answered, {len(figures['kill_errors'])} failed; "
        f"{exact}/{n} sessions have exactly their one turn; "
        f"turn p50 {pct(figures['kill_turns'], 0.5):.1f} ms p95 {pct(figures['kill_turns'], 0.95):.1f} ms"
    )
    if figures["kill_errors"]:
        print("  first errors:", figures["kill_errors"][:3])
    ok = t50 <= 1.5 * c50 and per_1000_hosts <= 500 and exact == n and not figures["kill_errors"]
    print(f"targets: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
