"""`python -m reasonray.evals.run` / `reasonray eval`: evaluate strategies on a dataset, locally or as a Ray job.

    python -m reasonray.evals.run --dataset ../shared/datasets/gsm8k_test.jsonl --strategies chain_of_thought,self_consistency \\
        --limit 50 --out runs/gsm8k
    ray job submit --working-dir . -- python -m reasonray.evals.run --dataset /abs/gsm8k.jsonl --strategies ... --out /abs/runs/x

Writes DIR/results.jsonl (as examples finish), DIR/report.md, DIR/report.json and DIR/*.png; see
docs/evaluation.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import httpx

from reasonray.evals.datasets import Dataset, DatasetError, load_dataset
from reasonray.evals.grid import Cell, GridError, build_grid, parse_configs
from reasonray.evals.provenance import provenance
from reasonray.evals.report import Prices, build_report, write_report
from reasonray.evals.runner import InProcessEngine, Record, ResultLog, over_http, run_grid
from reasonray.gateway.errors import LLMConfigError
from reasonray.kernel.config import (
    ConfigError,
    LoggingSettings,
    Settings,
    load_settings,
)
from reasonray.kernel.errors import ReasonRayError, error_type_of
from reasonray.kernel.logs import configure_logging
from reasonray.strategies.registry import StrategyRegistry, build_catalogue


class EvalError(ReasonRayError):
    """The evaluation cannot start; the message says what to change."""


@dataclass
class EvalOptions:
    dataset: Path
    strategies: list[str]
    out: Path
    configs: list[str] = field(default_factory=list)  # [STRATEGY:]NAME=JSON
    seeds: list[int] = field(default_factory=lambda: [0])
    limit: int | None = None
    offset: int = 0
    concurrency: int = 8
    memory: bool = False
    use_ray: bool = True
    address: str | None = None  # None: the job's cluster inside `ray job submit`, else a new local one
    config_path: str | None = None
    sim_skill: float = 0.7
    prices: Prices = field(default_factory=Prices)
    cache: bool | None = None  # None: [llm.cache] enabled
    progress: bool = True
    url: str | None = None  # a running service: examples go over HTTP (reasoning.execute), not through a stack of our own
    timeout_s: float = 900.0  # over HTTP: the longest wait for one example
    client: Any = None  # a reasonray.AsyncClient to run the examples through (a service's, or in_process_client's)
    budgets: list[int] = field(default_factory=list)  # per-call token budgets: a curve per strategy (grid.BUDGET_FIELDS)
    orders: int = 1  # with memory: stream orders; the study runs memory on and off on each
    memory_study: bool = False  # with memory: both arms (on and off) on the same streams, not memory on alone
    call_caps: dict[str, int] = field(default_factory=dict)  # strategy -> every call's max_tokens cap (config unchanged)
    placebo: bool = False  # memory study: a third arm whose memories are placebos of a learned item's length


def prepare(options: EvalOptions) -> tuple[Settings, Dataset, list[Cell]]:
    """Everything checked before anything runs: output directory, settings, dataset, grid."""
    out = options.out
    if not out.is_absolute() and "runtime_resources" in Path.cwd().parts:
        raise EvalError(
            f"--out {out} is relative, and this is a Ray job whose working directory is a temporary copy "
            "that is deleted when the job ends: give an absolute path on the head node"
        )
    generated = str(options.dataset).startswith("gen:")
    if not generated and not options.dataset.is_absolute() and not options.dataset.exists() and "runtime_resources" in Path.cwd().parts:
        raise EvalError(f"--dataset {options.dataset} is relative to the job's copy of the working directory; give an absolute path")
    settings = load_settings(options.config_path)
    reasoning = settings.reasoning.model_copy(
        update={"enabled_strategies": list(dict.fromkeys([*settings.reasoning.enabled_strategies, *options.strategies]))}
    )
    llm = settings.llm
    if options.cache is not None:
        llm = llm.model_copy(update={"cache": llm.cache.model_copy(update={"enabled": options.cache})})
    settings = settings.model_copy(update={"reasoning": reasoning, "llm": llm, "data_dir": (out / "data").resolve()})
    dataset = load_dataset(options.dataset, limit=options.limit, offset=options.offset)
    catalogue = build_catalogue(StrategyRegistry().discover(), settings.reasoning)
    if options.memory_study and not options.memory:
        raise EvalError("--memory-study compares memory on with memory off: add --memory")
    if options.placebo and not options.memory_study:
        raise EvalError("--placebo adds an arm to a memory study: add --memory --memory-study")
    if options.placebo and options.url is None and options.client is None:
        raise EvalError("--placebo stores its placebo memories through a service: give --url")
    cells = build_grid(
        catalogue,
        options.strategies,
        parse_configs(options.configs),
        options.seeds,
        budgets=options.budgets or None,
        arms=tuple(study["arms"]) if (study := _memory_study(options)) else (),
        orders=options.orders,
        call_caps=options.call_caps,
    )
    if not 0.0 <= options.sim_skill <= 1.0:
        raise EvalError(f"--sim-skill must be between 0 and 1, got {options.sim_skill}")
    if options.url is not None and not options.url.startswith(("http://", "https://")):
        raise EvalError(f"--url {options.url!r} is not an http(s) URL of a running service, e.g. http://127.0.0.1:8000")
    return settings, dataset, cells


def _memory_study(options: EvalOptions) -> dict[str, Any] | None:
    """A memory study's arms (memory on and off, and placebo when asked) and stream orders; None outside one."""
    if not options.memory_study:
        return None
    return {"arms": ["on", "off", "placebo"] if options.placebo else ["on", "off"], "orders": options.orders}


def _check_run_file(out: Path, dataset: Dataset, cells: list[Cell], options: EvalOptions, settings: Settings) -> dict[str, Any]:
    """run.json records what the results in `out` mean; a rerun must not mix in other configs."""
    path = out / "run.json"
    configs = {c.key: c.config for c in cells}
    previous = json.loads(path.read_text()) if path.exists() else {}
    changed = [k for k, v in previous.get("configs", {}).items() if k in configs and configs[k] != v]
    if changed:
        raise EvalError(
            f"{out} holds results of {', '.join(changed)} with another config; give the new config another name or write to another --out"
        )
    if previous and previous.get("memory") != options.memory:
        raise EvalError(f"{out} holds a run with memory={'on' if previous['memory'] else 'off'}; use another --out to change it")
    run = {
        "dataset": str(dataset.path) if str(dataset.path).startswith("gen:") else str(dataset.path.resolve()),  # a spec as written
        "kind": dataset.kind,
        "memory": options.memory,
        "memory_study": _memory_study(options),
        "budgets": options.budgets,
        "configs": {**previous.get("configs", {}), **configs},
        "updated_at": datetime.now(UTC).isoformat(),
        "provenance": provenance(settings, service_url=options.url, over_service=options.client is not None, dataset_sha256=dataset.sha256),
    }
    path.write_text(json.dumps(run, indent=2))
    return run


def start_simulator(settings: Settings, cluster: dict[str, Any]) -> Any:
    """The simulated model for a run that names no real endpoint, started here (a server with `url` and `stop()`),
    to be given the dataset's answer key (so the strategies have something to get right, with probability `skill`)."""
    from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings

    host = "127.0.0.1"
    if cluster.get("nodes", 1) > 1:  # tasks may run on other nodes: bound to this node's address
        import ray

        host = ray.util.get_node_ip_address()
    s = settings.llm.simulator  # its own fields, bound where this run's tasks can reach it
    fields = s.model_dump() | {"host": host, "fault_kinds": tuple(s.fault_kinds), "disobey_kinds": tuple(s.disobey_kinds)}
    return SimulatorServer(SimulatorSettings(**fields)).start()


def register_answer_key(base_url: str, dataset: Dataset, skill: float) -> int:
    answers = {e.key: e.reference for e in dataset.examples}
    response = httpx.post(f"{base_url.rstrip('/')}/sim/answers", json={"answers": answers, "skill": skill}, timeout=60)
    if response.status_code != 200:
        raise EvalError(f"the simulated model at {base_url} refused the answer key: HTTP {response.status_code} {response.text[:300]}")
    return int(response.json()["known"])


async def run_async(options: EvalOptions, echo: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the evaluation (what is not done yet) and write the report; returns the report with its paths."""
    settings, dataset, cells = prepare(options)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    run_file = _check_run_file(out, dataset, cells, options, settings)
    results = ResultLog(out / "results.jsonl")
    todo = sum(not results.done(e, c) for e in dataset.examples for c in cells)
    echo(
        f"{len(dataset.examples)} examples x {len(cells)} cells: {todo} to run, "
        f"{len(dataset.examples) * len(cells) - todo} already in {out / 'results.jsonl'}"
    )

    async with _engine(options, settings, dataset, echo) as (engine, cluster):
        from tqdm import tqdm

        started = time.perf_counter()
        with tqdm(total=todo, desc="evaluating", unit="example", file=sys.stderr, disable=not options.progress, mininterval=1.0) as bar:
            tick = functools.partial(_tick, bar)
            ran = await run_grid(
                engine, dataset.examples, cells, results, concurrency=options.concurrency, memory=options.memory, on_record=tick
            )
        grid_s = time.perf_counter() - started
        echo(f"ran {ran} examples in {grid_s:.1f} s")

    records = results.select(dataset.examples, cells)
    over_service = options.url is not None or options.client is not None
    if over_service:  # the service's model, as its results name it
        model = ", ".join(sorted({r.model for r in records if r.model})) or "unknown"
        simulated = any(r.simulated for r in records)
    else:
        simulated = settings.resolved_provider() == "simulated"
        model = "simulated" if simulated else settings.llm.model
    served = run_file["provenance"]["model"]  # run.json names the served model as the results do (over HTTP only they know it)
    served["served_name"] = served["served_name"] or model
    (out / "run.json").write_text(json.dumps(run_file, indent=2))
    meta = {
        "dataset": {
            "path": run_file["dataset"],
            "name": str(dataset.path) if str(dataset.path).startswith("gen:") else dataset.path.name,
            "sha256": dataset.sha256,
            "kind": dataset.kind,
            "examples": len(dataset.examples),
            "digest": dataset.digest,
            "offset": options.offset,
        },
        "model": model,
        "simulator_skill": options.sim_skill if simulated and not over_service else None,
        "seeds": options.seeds,
        **{key: run_file[key] for key in ("memory", "memory_study", "budgets", "provenance")},
        "cluster": cluster,
        "ran": ran,
        "grid_seconds": round(grid_s, 3),
        "finished_at": datetime.now(UTC).isoformat(),
    }
    report = build_report(records, cells, meta, options.prices, dataset.examples)
    report["failed"] = [
        {"example_id": r.example_id, "error_type": r.error_type, "trace_id": r.trace_id} for r in records if r.status == "error"
    ]
    report["paths"] = {k: str(v) for k, v in write_report(report, out).items()}
    return report


@contextlib.asynccontextmanager
async def _engine(options: EvalOptions, settings: Settings, dataset: Dataset, echo: Callable[[str], None]) -> AsyncIterator[Any]:
    """The engine the examples run through, and the cluster the report names: the service at `options.url` (or
    `options.client`: its model, its settings, its whole stack), else this run's own stack as Ray tasks or in this
    process, with the simulated model when the settings name no real endpoint. What it started stops at the end."""
    app_name = "eval-" + hashlib.sha256(str(options.out.resolve()).encode()).hexdigest()[:10]
    cluster: dict[str, Any] = {"ray": False}
    async with contextlib.AsyncExitStack() as stack:  # what started here stops in reverse order: the app, the simulator, Ray's
        if options.url is not None or options.client is not None:  # a client of our own is closed, a given one stays open
            from reasonray.client import AsyncClient

            client = options.client or await stack.enter_async_context(AsyncClient(options.url or "", timeout=options.timeout_s))
            url = options.url or str(client.http.base_url)
            echo(f"evaluating through the service at {url}")
            yield functools.partial(over_http, client), {"ray": False, "url": url}
            return
        if options.use_ray:
            cluster = _connect(options.address, settings, app_name, stack)
        if settings.resolved_provider() == "simulated":
            if not settings.llm.base_url:
                simulator = start_simulator(settings, cluster)
                stack.callback(simulator.stop)
                settings = settings.model_copy(
                    update={"llm": settings.llm.model_copy(update={"provider": "simulated", "base_url": simulator.url})}
                )
            known = register_answer_key(settings.llm.base_url, dataset, options.sim_skill)
            echo(f"SIMULATED model at {settings.llm.base_url} (answer key of {known} questions, skill {options.sim_skill})")
        if options.use_ray:
            from reasonray.actors.fanout import LLMSpec
            from reasonray.evals.distributed import on_ray

            yield functools.partial(on_ray, LLMSpec(settings.model_dump_json(), app_name)), cluster
        else:
            from reasonray.api.app import build_application

            app = build_application(settings, data_dir=None, memory=options.memory)
            stack.push_async_callback(app.client.close)
            yield InProcessEngine(app.service), cluster


def _connect(address: str | None, settings: Settings, app_name: str, stack: contextlib.AsyncExitStack) -> dict[str, Any]:
    """Join (or start) the Ray cluster; on the way out the run's shared actor is released, and a cluster started here shut down."""
    import ray

    from reasonray.actors.environment import ray_environment
    from reasonray.evals.distributed import cluster_summary, release

    if ray.is_initialized():
        stack.callback(release, app_name)
        return {"ray": True, **cluster_summary()}
    if address is None:
        address = "auto" if os.environ.get("RAY_ADDRESS") else "local"
    options: dict[str, Any] = {}
    if address == "local":
        for name, value in ray_environment(settings).items():
            os.environ.setdefault(name, value)
        options = {"include_dashboard": False}
    try:
        ray.init(address=address, namespace="reasonray", log_to_driver=False, **options)
    except ConnectionError as exc:  # no actor to release: joining the cluster failed, its error is the one to see
        raise EvalError(
            f"cannot join the Ray cluster at {address}: {exc}; start one (`ray start --head`), "
            "or leave out --address to start a local one for the run"
        ) from None
    stack.callback(ray.shutdown)
    stack.callback(release, app_name)
    return {"ray": True, "address": address, **cluster_summary()}


def _tick(progress: Any, record: Record) -> None:
    progress.update(1)
    if record.status == "error":
        progress.write(f"failed: {record.example_id} {record.cell}: {record.error}")


def _int_list(value: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give whole numbers separated by commas, e.g. 0,1,2") from None


@click.command("eval")
@click.option(
    "--dataset",
    required=True,
    type=click.Path(path_type=Path),
    help="GSM8K or HumanEval JSONL(.gz) file, or a generated family, e.g. 'gen:running_sums?steps=4-16&n=100&seed=0'.",
)
@click.option("--strategies", required=True, help="Comma-separated strategies, e.g. chain_of_thought,self_consistency.")
@click.option(
    "--config",
    "configs",
    multiple=True,
    metavar="[STRATEGY:]NAME=JSON",
    help="A named strategy config (repeatable); with STRATEGY: for that strategy only. Default: 'default' = {}.",
)
@click.option("--seeds", default="0", show_default=True, help="Comma-separated seeds.")
@click.option("--limit", type=int, default=None, help="Evaluate the first N examples (after --offset).")
@click.option("--offset", type=int, default=0, show_default=True, help="Skip this many examples first.")
@click.option(
    "--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Output directory (absolute inside a Ray job)."
)
@click.option("--concurrency", type=int, default=8, show_default=True, help="Examples in flight at once.")
@click.option(
    "--memory/--no-memory",
    default=False,
    show_default=True,
    help="Memory-aware: each cell streams the examples in order, retrieving and learning as it goes.",
)
@click.option(
    "--memory-study",
    is_flag=True,
    help="With --memory: run memory on and memory off on the same streams (both arms), for a learning curve.",
)
@click.option(
    "--placebo",
    is_flag=True,
    help="With --memory-study and --url: a third arm that retrieves placebo memories (a learned item's length, no content).",
)
@click.option("--orders", type=int, default=1, show_default=True, help="With --memory: seeded stream orders (0 is the dataset's order).")
@click.option(
    "--budgets",
    default="",
    help="Per-call token budgets, e.g. 16,32,64,128: every config runs at each (a curve of accuracy against tokens).",
)
@click.option("--ray/--no-ray", "use_ray", default=True, show_default=True, help="Examples as Ray tasks, or in this process.")
@click.option(
    "--url",
    help="Evaluate through the running service at this URL (reasoning.execute over HTTP, its model and settings) instead of "
    "a stack of the run's own; --ray, --config-file and --sim-skill then do not apply.",
)
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True, help="With --url: seconds to wait for one example.")
@click.option("--address", default=None, help="Ray cluster to join (default: the job's, else a new local one).")
@click.option("--config-file", "config_path", default=None, help="config.toml to use (default: the repository's).")
@click.option(
    "--sim-skill", type=float, default=0.7, show_default=True, help="Simulated model only: the probability it gets a question right."
)
@click.option("--price-input", type=float, default=0.15, show_default=True, help="USD per million input tokens, for the cost estimate.")
@click.option("--price-output", type=float, default=0.60, show_default=True, help="USD per million output tokens.")
@click.option("--cache/--no-cache", default=None, help="Use the LLM response cache (default: [llm.cache] enabled).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
    help="Level of the run's own log lines (every LLM call is an info line).",
)
def main(strategies, configs, seeds, budgets, use_ray, url, price_input, price_output, log_level, **fields) -> None:
    """Evaluate reasoning strategies on a dataset; write results.jsonl, report.md, report.json and plots."""
    configure_logging(LoggingSettings(level=log_level, format="console"))
    options = EvalOptions(
        strategies=[s.strip() for s in strategies.split(",") if s.strip()],
        configs=list(configs),
        seeds=_int_list(seeds),
        budgets=_int_list(budgets),
        use_ray=use_ray and url is None,
        url=url,
        prices=Prices(price_input, price_output),
        **fields,  # the other options are EvalOptions' fields of the same names
    )
    if options.concurrency < 1:
        raise click.BadParameter("must be at least 1", param_hint="--concurrency")
    try:
        report = asyncio.run(run_async(options, echo=click.echo))
    except (EvalError, DatasetError, GridError, ConfigError, LLMConfigError) as exc:
        click.echo(f"error: {exc}", err=True)
        click.echo(f"error_type: {error_type_of(exc)}", err=True)
        sys.exit(2)
    for row in report["rows"]:
        click.echo(
            f"{row['group']:<40} accuracy {row['accuracy']:.1%} ({row['ci_low']:.1%}-{row['ci_high']:.1%})"
            f"  tokens/example {row['tokens_per_example']:.0f}  p50 {row['latency_p50_ms']:.0f} ms  errors {row['errors']}"
        )
    if report["simulated"]:
        click.echo("(SIMULATED model: these accuracies say nothing about a real model)")
    click.echo(f"report: {report['paths']['markdown']}")
    if report["failed"]:  # the evaluation ran, but not every example did: say which, and fail the command
        for failure in report["failed"][:10]:
            click.echo(f"failed: {failure['example_id']} error_type={failure['error_type']} trace_id={failure['trace_id']}", err=True)
        click.echo(f"error: {len(report['failed'])} example(s) failed (a rerun retries them)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
