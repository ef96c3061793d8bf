"""ReasonRay under concurrent load, as a user runs it: `reasonray serve` on a local Ray cluster (its
own process), the simulated model in another process (500 ms to first token, 200 tokens/s), and
JSON-RPC over HTTP from here. Every ratio is against a baseline measured in the same run.

    python bench/concurrency.py            # the full run (about 6 minutes on a quiet 2-core machine)
    python bench/concurrency.py --quick    # fewer requests per workload (about 2 minutes)
    python bench/concurrency.py --only sc16 --server-root ../main   # one workload, another checkout's service

Workloads: the model's ceiling (direct calls at 64 and 320 in flight); chain_of_thought at
64 concurrent (both at 64 warmed by 64 calls, then measured in two rounds alternating with each
other); self_consistency (5 samples) at 1, 16 and 64; tree_of_thought and MaTTS k=5 at 16; the
first MaTTS after deploy against warm ones; 1,000 CoT requests at 32 concurrent with 10% injected
429/500 faults; then bench/sessions.py (1,000 sessions, memory per session, a host killed mid-load).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _env
import httpx
import openai

from reasonray.api.access.auth import mint_token
from reasonray.gateway.simulator.server import free_port
from tests.serving import stop_group

REPO = _env.REPO
SIM = {"ttft_ms": 500, "tokens_per_second": 200}
# The service runs as a deployment does, with authentication on (and so the HAProxy ingress, which
# ReasonRay uses only behind a token); Service.start fills in the bearer token every client sends.
AUTH: dict[str, str] = {}


@dataclass
class Figures:
    name: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    ok: int = 0
    right: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.latencies)

    @property
    def rate(self) -> float:
        return self.n / self.wall_s if self.wall_s else 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) if self.latencies else float("nan")

    @property
    def p95(self) -> float:
        return self.pct(0.95)

    def merge(self, other: Figures) -> Figures:
        """This round and another of the same workload as one: their requests over their summed wall time."""
        errors = dict(self.errors)
        for kind, n in other.errors.items():
            errors[kind] = errors.get(kind, 0) + n
        return Figures(
            self.name,
            self.concurrency,
            self.latencies + other.latencies,
            self.wall_s + other.wall_s,
            self.ok + other.ok,
            self.right + other.right,
            errors,
        )

    def row(self) -> str:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(self.errors.items())) or "none"
        return (
            f"| {self.name} | {self.concurrency} | {self.n} | {self.rate:.1f} | {self.p50:.2f} | {self.p95:.2f} | "
            f"{self.right}/{self.n} | {errors} |"
        )


async def load(name: str, concurrency: int, total: int, call) -> Figures:
    """`total` calls of `call(i)` (returns (ok, right, error)) with `concurrency` in flight."""
    figures = Figures(name, concurrency)
    queue = iter(range(total))

    async def worker() -> None:
        for i in queue:
            started = time.perf_counter()
            ok, right, error = await call(i)
            figures.latencies.append(time.perf_counter() - started)
            figures.ok += ok
            figures.right += right
            if error:
                figures.errors[error] = figures.errors.get(error, 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    figures.wall_s = time.perf_counter() - started
    return figures


def question(i: int, tag: str) -> tuple[str, str]:
    a, b = 11 + i % 89, 3 + (i * 7) % 41
    return f"What is {a} * {b}? ({tag} {i})", str(a * b)


def execute_call(client: httpx.AsyncClient, tag: str, strategy: str, config: dict[str, Any] | None = None):
    async def call(i: int) -> tuple[bool, bool, str | None]:
        query, expected = question(i, tag)
        params: dict[str, Any] = {"query": query, "strategy": strategy}
        if config:
            params["strategy_config"] = config
        try:
            response = await client.post("/rpc", json={"jsonrpc": "2.0", "method": "reasoning.execute", "params": params, "id": i})
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            return False, False, type(exc).__name__
        if "error" in body:
            return False, False, f"{body['error']['code']} {(body['error'].get('data') or {}).get('error_type', '')}".strip()
        return True, body["result"]["answer"].strip() == expected, None

    return call


def direct_call(client: openai.AsyncOpenAI):
    async def call(i: int) -> tuple[bool, bool, str | None]:
        query, expected = question(i, "direct")
        try:
            reply = await client.chat.completions.create(
                model="simulated",
                messages=[
                    {"role": "system", "content": "Think step by step, then answer inside <answer></answer>."},
                    {"role": "user", "content": query},
                ],
            )
        except openai.OpenAIError as exc:
            return False, False, type(exc).__name__
        return True, f"<answer>{expected}</answer>" in (reply.choices[0].message.content or ""), None

    return call


def sessions_workload(quick: bool) -> list[str]:
    """1,000 sessions with one turn each at 64 concurrent, memory growth per live session and a session host
    killed mid-load: bench/sessions.py, run after this script's service has stopped (it deploys its own,
    since it measures the hosts' processes and kills one), with its chain-of-thought baseline in its run."""
    command = [sys.executable, str(Path(__file__).with_name("sessions.py")), *(["--quick"] if quick else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    lines = ["", "sessions (bench/sessions.py):", *done.stdout.strip().splitlines()]
    if done.returncode:
        lines.append(f"bench/sessions.py failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    return lines


class Service:
    """The simulated model and `reasonray serve`, each in a process of its own, stopped on exit."""

    def __init__(self, server_root: Path) -> None:
        self.root = server_root
        self.procs: list[subprocess.Popen] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="reasonray-bench-"))

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(self.root), "RAY_AUTH_MODE": "token"}
        out = open(self.tmp / log, "a")  # noqa: SIM115  (closed with the process)
        proc = subprocess.Popen(
            [sys.executable, "-c", "from reasonray.cli import main; main()", *args],
            cwd=self.root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start(self) -> tuple[str, str]:
        sim_port, api_port = free_port(), free_port()
        self._spawn(
            ["sim", "--port", str(sim_port), "--ttft-ms", str(SIM["ttft_ms"]), "--tokens-per-second", str(SIM["tokens_per_second"])],
            "sim.log",
        )
        sim_url = f"http://127.0.0.1:{sim_port}/v1"
        wait_for(f"{sim_url}/sim/stats", 60)
        path = self.root / "config.toml"  # the user's file; the bench's changes go in by environment
        secret = secrets.token_hex(32)
        os.environ.update(
            {
                "REASONRAY_DATA_DIR": str(self.tmp / "data"),
                "REASONRAY_LLM__PROVIDER": "simulated",
                "REASONRAY_LLM__BASE_URL": sim_url,
                "REASONRAY_LLM__CACHE__ENABLED": "false",  # every request distinct anyway; measure the model, not the cache
                "REASONRAY_MEMORY__EMBEDDING": "openai",  # the simulator's /v1/embeddings: no torch in the memory actor
                "REASONRAY_LOGGING__LEVEL": "warning",
                "REASONRAY_AUTH__JWT_SECRET": secret,
                # the bench's caller measures throughput, not the shipped roles' limits (docs/security.md#default-limits)
                "REASONRAY_AUTH__PRINCIPALS__BENCH__REQUESTS_PER_MINUTE": "1000000",
                "REASONRAY_AUTH__PRINCIPALS__BENCH__CONCURRENT_RUNS": "4096",
                "REASONRAY_AUTH__PRINCIPALS__BENCH__TOKENS_PER_MINUTE": "1000000000000",
                "REASONRAY_AUTH__PRINCIPALS__BENCH__TOKENS_PER_DAY": "1000000000000",
            }
        )
        AUTH["Authorization"] = f"Bearer {mint_token(secret, 'bench', ['operator'], 24 * 3600)}"

        api_url = f"http://127.0.0.1:{api_port}"
        for attempt in (1, 2, 3):  # on a busy machine Ray's GCS can miss its start-up deadline: start again
            serve = self._spawn(["serve", "--config", str(path), "--port", str(api_port), "--num-cpus", "2", "--no-dashboard"], "serve.log")
            if wait_for(f"{api_url}/healthz", 300, serve):  # the public probe: no token needed
                return sim_url, api_url
            print(f"reasonray serve exited during start-up (attempt {attempt}); see {self.tmp / 'serve.log'}", flush=True)
        raise SystemExit("reasonray serve did not start")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_group(proc, signal.SIGINT, 60)  # `reasonray serve` shuts its own Ray cluster down on SIGINT


def wait_for(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    """True once `url` answers 200; False if `proc` exits first; SystemExit after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s")


async def run(args: argparse.Namespace, sim_url: str, api_url: str) -> list[str]:
    q = args.quick
    size = lambda full, quick: quick if q else full
    rows: list[Figures] = []
    notes: list[str] = []
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    async with httpx.AsyncClient(base_url=api_url, timeout=600, limits=limits, headers=AUTH) as api:
        want = set(args.only.split(",")) if args.only else None

        def wanted(key: str) -> bool:
            return want is None or key in want

        figures: dict[str, Figures] = {}

        async def measure(key: str, name: str, concurrency: int, total: int, call) -> None:
            if wanted(key):
                figures[key] = await load(name, concurrency, total, call)
                rows.append(figures[key])
                print(figures[key].row(), flush=True)

        if wanted("matts_first"):  # before anything else touched the service: the first MaTTS after deploy
            first = await load("matts k=5, first after deploy", 1, 1, execute_call(api, "first", "matts", {"k": 5}))
            warm = await load("matts k=5, warm", 1, size(5, 3), execute_call(api, "warm", "matts", {"k": 5}))
            rows += [first, warm]
            print(first.row(), warm.row(), sep="\n", flush=True)
            notes.append(
                f"first MaTTS k=5 after deploy / warm p50: {first.p50:.2f} s / {warm.p50:.2f} s = {first.p50 / warm.p50:.2f}x (target <= 1.3x)"
            )
        direct = openai.AsyncOpenAI(
            base_url=sim_url, api_key="simulated", max_retries=0, timeout=600, http_client=openai.DefaultAsyncHttpxClient(limits=limits)
        )
        if wanted("direct64") or wanted("cot64"):
            # the ceiling and ReasonRay's share of it: both sides warmed by 64 calls (a deployment's first runs pay
            # one-time costs, measured by matts_first), then rounds alternating between them, so a machine whose
            # speed drifts during the run moves both sides alike
            sides = [
                ("direct64", "direct calls", direct_call(direct)),
                ("cot64", "chain_of_thought", execute_call(api, "cot", "chain_of_thought")),
            ]
            sides = [side for side in sides if wanted(side[0])]
            for _key, name, call in sides:
                await load(name, 64, 64, lambda i, call=call: call(100_000 + i))
            for _ in range(2):
                for key, name, call in sides:
                    part = await load(name, 64, size(320, 96), call)
                    figures[key] = figures[key].merge(part) if key in figures else part
            for key, _, _ in sides:
                rows.append(figures[key])
                print(figures[key].row(), flush=True)
        await measure("direct320", "direct calls", 320, size(1280, 640), direct_call(direct))
        sc = {"samples": 5}
        await measure("sc1", "self_consistency 5", 1, size(20, 6), execute_call(api, "sc1", "self_consistency", sc))
        await measure("sc16", "self_consistency 5", 16, size(160, 48), execute_call(api, "sc16", "self_consistency", sc))
        await measure("sc64", "self_consistency 5", 64, size(320, 128), execute_call(api, "sc64", "self_consistency", sc))
        await measure("tot16", "tree_of_thought", 16, size(48, 16), execute_call(api, "tot", "tree_of_thought"))
        await measure("matts16", "matts k=5", 16, size(48, 16), execute_call(api, "matts", "matts", {"k": 5}))
        if wanted("faults"):
            async with httpx.AsyncClient(timeout=10) as sim:
                await sim.post(f"{sim_url}/sim/faults", json={"rate": 0.1, "kinds": ["429", "500"]})
                await measure("faults", "CoT, 10% injected 429/500", 32, size(1000, 300), execute_call(api, "faults", "chain_of_thought"))
                stats = (await sim.get(f"{sim_url}/sim/stats")).json()
                await sim.post(f"{sim_url}/sim/faults", json={"rate": 0.0})
            breaker = (await api.get("/admin/health")).json()["llm"]["breaker"]  # the operators' view (auth is off here)
            f = figures["faults"]
            notes.append(
                f"faults: {f.right}/{f.n} right ({f.right / f.n:.2%}, target >= 99.9%); faults injected: "
                f"{stats.get('faults', stats)}; breaker after the run: {breaker}"
            )
        fanout = (await api.get("/admin/health")).json().get("fanout")
        if fanout:
            notes.append(f"branch pool after the run: {fanout['runners']} runner(s), {fanout['in_flight']} branches in flight")

    def ratio(a: str, b: str, fn) -> None:
        if a in figures and b in figures:
            notes.append(fn(figures[a], figures[b]))

    ratio("cot64", "direct64", lambda c, d: f"chain_of_thought @64 / direct @64: {c.rate / d.rate:.0%} (target >= 90%)")
    ratio(
        "sc64",
        "direct320",
        lambda s, d: (
            f"self_consistency @64 / (direct @320 / 5): {s.rate / (d.rate / 5):.0%} (target >= 80%); "
            f"p95 {s.p95:.2f} s / direct p95 {d.p95:.2f} s = {s.p95 / d.p95:.2f}x (target <= 1.5x)"
        ),
    )
    for key in ("sc1", "sc16"):
        if key in figures:
            s = figures[key]
            notes.append(
                f"self_consistency @{s.concurrency}: p95 / p50 = {s.p95:.2f} / {s.p50:.2f} = {s.p95 / s.p50:.2f}x (target <= 1.5x)"
            )
    header = ["| workload | concurrent | requests | req/s | p50 s | p95 s | right | errors |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    return header + [r.row() for r in rows] + [""] + [f"- {n}" for n in notes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per workload")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated workloads: matts_first,direct64,direct320,cot64,sc1,sc16,sc64,tot16,matts16,faults,sessions",
    )
    parser.add_argument("--server-root", type=Path, default=REPO, help="checkout whose service is measured (default: this one)")
    args = parser.parse_args()
    service = Service(args.server_root.resolve())
    try:
        sim_url, api_url = service.start()
        print(
            f"simulated model: {SIM['ttft_ms']} ms to first token, {SIM['tokens_per_second']} tokens/s; service: reasonray serve "
            f"({args.server_root.resolve().name}), 2-CPU local Ray cluster; {os.cpu_count()} cores; {'quick' if args.quick else 'full'} run",
            flush=True,
        )
        lines = asyncio.run(run(args, sim_url, api_url))
    finally:
        service.stop()
    print("\n".join(lines), flush=True)
    if not args.only or "sessions" in args.only.split(","):
        print("\n".join(sessions_workload(args.quick)))


if __name__ == "__main__":
    main()
