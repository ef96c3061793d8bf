"""ReasonRay side by side with its peers, optillm and DSPy, on the same simulated model.

The simulator runs at 500 ms to first token and 200 tokens/s, as in bench/concurrency.py; every figure
comes from one run on this machine.

    make bench-peers [ARGS="--quick"]    # installs the peers into .venv-peers first, then runs this
    .venv/bin/python bench/peers.py [--quick] [--concurrency 1,16,64] [--requests N]

Two workloads, each at 1, 16 and 64 concurrent requests:
- chain_of_thought (one LLM call a request): ReasonRay's `chain_of_thought` strategy (`reasoning.execute`
  over HTTP to `reasonray serve`, response cache off), optillm's proxy with the `none` approach
  (model `none-simulated`), DSPy's async `ChainOfThought` (`acall`); direct calls with the openai client
  are printed too, as the model's own ceiling.
- self_consistency with 5 samples: ReasonRay's `self_consistency` (samples=5), optillm's
  `self_consistency` approach (model `self_consistency-simulated`; optillm draws 5 samples by default,
  one after the other), DSPy's `ChainOfThought` five times in flight and a majority vote.

The peers never enter the project's .venv: they live in .venv-peers (bench/peers/requirements.txt). The
optillm proxy runs as a process of its own from there, pointed at the simulator; DSPy runs in
bench/peers/dspy_driver.py under .venv-peers/bin/python. The ReasonRay service is stopped before the
peers run, so no idle Ray cluster shares the cores with them.

LLM calls per request are the simulator's own count of chat completions (`GET /v1/sim/stats`) over each
run, divided by its requests: warm-up calls are outside the count, nothing else calls the simulator
meanwhile. Accuracy: the answer (ReasonRay's `answer`, the last `<answer>` of optillm's reply, DSPy's
`answer` field) equals the product asked for.

Target: ReasonRay's req/s at 64 concurrent at least the fastest peer's, on both workloads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _env
import httpx
import openai
from concurrency import AUTH, SIM, Figures, Service, direct_call, execute_call, load, question, wait_for

from reasonray.gateway.simulator.server import free_port
from reasonray.kernel.tags import extract_answer
from tests.serving import stop_group

REPO = _env.REPO
PEERS = REPO / ".venv-peers"
SYSTEM_PROMPT = "Think step by step, then answer inside <answer></answer>."
WORKLOADS = {"cot": "chain_of_thought (1 call)", "sc": "self_consistency (5 samples)"}
WARMUP = 4  # requests per system and workload before anything is measured
SETTLE_S = 10  # after the ReasonRay service stops: its Ray workers exit in the background


@dataclass
class Row:
    workload: str  # "cot" | "sc"
    system: str
    figures: Figures
    calls: int

    def line(self) -> str:
        f = self.figures
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(f.errors.items())) or "none"
        per = self.calls / f.n if f.n else float("nan")
        return (
            f"| {self.system} | {f.concurrency} | {f.n} | {f.rate:.1f} | {f.p50:.2f} | {f.p95:.2f} | "
            f"{f.right / f.n if f.n else 0:.0%} | {per:.1f} | {errors} |"
        )


def sizes(args: argparse.Namespace) -> dict[int, int]:
    """Requests per run at each concurrency."""
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.requests:
        return dict.fromkeys(levels, args.requests)
    return {c: max(8, c) if args.quick else max(20, 4 * c) for c in levels}


async def sim_requests(sim: httpx.AsyncClient) -> int:
    return int((await sim.get("/sim/stats")).json()["requests"])


async def measure(sim: httpx.AsyncClient, workload: str, system: str, concurrency: int, total: int, call) -> Row:
    before = await sim_requests(sim)
    figures = await load(system, concurrency, total, call)
    row = Row(workload, system, figures, await sim_requests(sim) - before)
    print(f"{WORKLOADS[workload]}: {row.line()}", flush=True)
    return row


def openai_call(client: openai.AsyncOpenAI, model: str, tag: str):
    """One chat completion through an OpenAI-compatible endpoint (the optillm proxy); right when its last
    `<answer>` is the product."""

    async def call(i: int) -> tuple[bool, bool, str | None]:
        query, expected = question(i, tag)
        try:
            reply = await client.chat.completions.create(
                model=model, messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": query}]
            )
        except openai.OpenAIError as exc:
            return False, False, type(exc).__name__
        return True, extract_answer(reply.choices[0].message.content or "") == expected, None

    return call


def openai_client(base_url: str) -> openai.AsyncOpenAI:
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    return openai.AsyncOpenAI(
        base_url=base_url, api_key="simulated", max_retries=0, timeout=600, http_client=openai.DefaultAsyncHttpxClient(limits=limits)
    )


async def run_reasonray(sim_url: str, api_url: str, levels: dict[int, int]) -> list[Row]:
    rows: list[Row] = []
    strategies = {"cot": ("chain_of_thought", None), "sc": ("self_consistency", {"samples": 5})}
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    async with (
        httpx.AsyncClient(base_url=api_url, timeout=600, limits=limits, headers=AUTH) as api,
        httpx.AsyncClient(base_url=sim_url, timeout=10) as sim,
    ):
        for workload, (strategy, config) in strategies.items():
            await load("warm-up", WARMUP, WARMUP, execute_call(api, f"rrwarm {workload}", strategy, config))
            for c, n in levels.items():
                rows.append(await measure(sim, workload, "ReasonRay", c, n, execute_call(api, f"rr {workload}{c}", strategy, config)))
    return rows


async def run_direct(sim_url: str, levels: dict[int, int]) -> list[Row]:
    """The model's own ceiling for one call: the openai client straight to the simulator."""
    rows: list[Row] = []
    async with httpx.AsyncClient(base_url=sim_url, timeout=10) as sim:
        client = openai_client(sim_url)
        await load("warm-up", WARMUP, WARMUP, direct_call(client))
        for c, n in levels.items():
            rows.append(await measure(sim, "cot", "direct calls (ceiling)", c, n, direct_call(client)))
        await client.close()
    return rows


class Optillm:
    """The optillm proxy from .venv-peers, in a process of its own, in front of the simulator."""

    def __init__(self, sim_url: str, log: Path) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTILLM_", "REASONRAY_", "CEREBRAS_", "AZURE_"))}
        # OPENAI_API_KEY makes optillm use the openai client on --base-url; offline: nothing to fetch from a hub
        env.update(
            {"OPENAI_API_KEY": "simulated", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        )
        args = ["--base-url", sim_url, "--port", str(self.port), "--model", "simulated", "--log", "warning"]
        self.out = open(log, "a")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            [str(PEERS / "bin" / "optillm"), *args],
            cwd=log.parent,
            env=env,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if not wait_for(f"http://127.0.0.1:{self.port}/health", 300, self.proc):
            raise SystemExit(f"the optillm proxy exited during start-up; see {log}")
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        stop_group(self.proc)
        self.out.close()


async def run_optillm(sim_url: str, proxy_url: str, levels: dict[int, int]) -> list[Row]:
    rows: list[Row] = []
    client = openai_client(proxy_url)
    async with httpx.AsyncClient(base_url=sim_url, timeout=10) as sim:
        for workload, approach in (("cot", "none"), ("sc", "self_consistency")):
            model = f"{approach}-simulated"
            await load("warm-up", WARMUP, WARMUP, openai_call(client, model, f"owarm {workload}"))
            for c, n in levels.items():
                rows.append(await measure(sim, workload, f"optillm {approach}", c, n, openai_call(client, model, f"optillm {workload}{c}")))
    await client.close()
    return rows


def run_dspy(sim_url: str, levels: dict[int, int]) -> tuple[list[Row], str]:
    names = {"cot": "DSPy ChainOfThought (async)", "sc": "DSPy 5 concurrent samples + vote"}
    specs = [(w, c, n) for w in ("cot", "sc") for c, n in levels.items()]
    plan = {
        "base_url": sim_url,
        "warmup": [question(i, "dwarm") for i in range(WARMUP)],
        "runs": [{"workload": w, "concurrency": c, "questions": [question(i, f"dspy {w}{c}") for i in range(n)]} for w, c, n in specs],
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [str(PEERS / "bin" / "python"), str(REPO / "bench" / "peers" / "dspy_driver.py")],
        input=json.dumps(plan),
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the DSPy driver failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout)
    rows = []
    for (w, c, _), run in zip(specs, result["runs"], strict=True):
        figures = Figures(names[w], c, latencies=run["latencies"], wall_s=run["wall_s"], right=run["right"], errors=run["errors"])
        figures.ok = figures.n - sum(run["errors"].values())
        rows.append(Row(w, names[w], figures, run["calls"]))
        print(f"{WORKLOADS[w]}: {rows[-1].line()}", flush=True)
    return rows, result["dspy"]


def stop_reasonray(service: Service) -> None:
    """Stop `reasonray serve` (its own shutdown of its Ray cluster, on SIGINT) and keep the simulator
    (Service.start spawned it first); then let the cluster's last workers exit before the peers run."""
    simulator, *serve = service.procs
    service.procs = serve
    service.stop()
    service.procs = [simulator]
    time.sleep(SETTLE_S)


def peer_version(package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([str(PEERS / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


def tables(rows: list[Row], levels: dict[int, int]) -> list[str]:
    lines: list[str] = []
    top = max(levels)
    for workload, title in WORKLOADS.items():
        mine = [r for r in rows if r.workload == workload]
        lines += [
            "",
            f"### {title}",
            "",
            "| system | concurrent | requests | req/s | p50 s | p95 s | accuracy | LLM calls/request | errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        lines += [r.line() for r in mine]
    lines.append("")
    for workload, title in WORKLOADS.items():
        at_top = [r for r in rows if r.workload == workload and r.figures.concurrency == top]
        ours = next((r for r in at_top if r.system == "ReasonRay"), None)
        peers = [r for r in at_top if r.system not in ("ReasonRay", "direct calls (ceiling)")]
        if ours is None or not peers:
            continue
        best = max(peers, key=lambda r: r.figures.rate)
        ratio = ours.figures.rate / best.figures.rate if best.figures.rate else float("inf")
        lines.append(
            f"- {title} @{top}: ReasonRay {ours.figures.rate:.1f} req/s / fastest peer ({best.system}) "
            f"{best.figures.rate:.1f} req/s = {ratio:.2f}x (target >= 1.00x: {'met' if ratio >= 1 else 'NOT met'})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per run (8, or the concurrency if more)")
    parser.add_argument("--concurrency", default="1,16,64", help="comma-separated concurrency levels (default 1,16,64)")
    parser.add_argument("--requests", type=int, default=0, help="requests per run (default: 4x the concurrency, at least 20)")
    args = parser.parse_args()
    if not (PEERS / "bin" / "optillm").exists():
        raise SystemExit(f"{PEERS} has no optillm: run `make bench-peers` (it installs bench/peers/requirements.txt there)")
    levels = sizes(args)
    service = Service(REPO)
    log_dir = Path(tempfile.mkdtemp(prefix="reasonray-peers-"))
    rows: list[Row] = []
    proxy: Optillm | None = None
    try:
        sim_url, api_url = service.start()
        print(
            f"simulated model: {SIM['ttft_ms']} ms to first token, {SIM['tokens_per_second']} tokens/s; {os.cpu_count()} cores; "
            f"requests per run: {levels}; logs in {service.tmp} and {log_dir}",
            flush=True,
        )
        rows += asyncio.run(run_reasonray(sim_url, api_url, levels))
        stop_reasonray(service)
        rows += asyncio.run(run_direct(sim_url, levels))
        proxy = Optillm(sim_url, log_dir / "optillm.log")
        rows += asyncio.run(run_optillm(sim_url, proxy.url, levels))
        proxy.stop()
        proxy = None
        dspy_rows, dspy_version = run_dspy(sim_url, levels)
        rows += dspy_rows
    finally:
        if proxy is not None:
            proxy.stop()
        service.stop()
    order = {"ReasonRay": 0, "direct calls (ceiling)": 1}
    rows.sort(key=lambda r: (order.get(r.system, 2), r.system, r.figures.concurrency))
    print(
        f"\nReasonRay (reasonray serve, 2-CPU local Ray cluster, response cache off) vs optillm {peer_version('optillm')} "
        f"(proxy, Flask) and DSPy {dspy_version}, same simulator ({SIM['ttft_ms']} ms to first token, "
        f"{SIM['tokens_per_second']} tokens/s), one run. LLM calls/request: the simulator's own count (GET /v1/sim/stats) "
        "over each run / its requests."
    )
    print("\n".join(tables(rows, levels)))


if __name__ == "__main__":
    main()
