"""Running a grid: one example of one cell at a time through `ReasoningService.execute`, scored,
appended to `results.jsonl` as it finishes.

Ray-free: an `Engine` runs one (example, cell) and returns its `Record`; `InProcessEngine` runs it
here, `evals.distributed.on_ray` as a Ray task, `over_http` through a running service over HTTP. `run_grid` schedules with bounded concurrency:
examples of plain cells in any order, those of memory-aware cells one after the other in the
cell's stream order (a stream: each example retrieves what the earlier ones taught, then learns,
never seeing its own memories; stream order `order` is the examples shuffled with that seed, order
0 the dataset's own order). Every record keeps its position in its cell's stream. A failed example is a record with its error, and the run goes on. A rerun
skips what `results.jsonl` already holds (examples that failed are tried again).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from reasonray.api.jsonrpc import error_for
from reasonray.api.service import BudgetParams, ExecuteParams, ReasoningService
from reasonray.evals.datasets import Example
from reasonray.evals.grid import Cell, cell_key
from reasonray.evals.scoring import lenient_correct, score
from reasonray.memory.loop import MemoryParams

log = structlog.get_logger(__name__)

ANSWER_CHARS = 2000  # answers are kept this long in results.jsonl
# a failed record's counts, from the partial result of what the run spent: record field -> partial result key
SPENT = {"prompt_tokens": "prompt_tokens", "completion_tokens": "completion_tokens", "llm_calls": "calls"}
MEMORY_KEYS = ("retrieved", "stored", "outcome", "learn_error")  # a record's memory: how many retrieved and stored, how learning went


@dataclass
class Record:
    """One example of one cell: what ran, what it cost, whether it was right."""

    example_id: str
    strategy: str
    config_name: str
    seed: int
    status: str  # "ok" (scored) or "error" (the run failed; see error)
    correct: bool = False
    answer: str = ""
    extracted: str | None = None
    reference: str = ""
    detail: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    latency_ms: float = 0.0
    model: str = ""
    simulated: bool = False
    error: str | None = None
    error_code: int | None = None  # the JSON-RPC code the service would answer with
    error_type: str | None = None  # e.g. provider_unavailable, budget_exceeded
    memory: dict[str, Any] | None = None
    trace_id: str = ""
    found_by: str | None = None  # how the strategy read its answer (tag, json, phrase, final_number, text...)
    correct_lenient: bool = False  # any number in the answer or its reasoning equals the reference
    arm: str = ""  # memory study: on, off or placebo ("" outside one)
    order: int = 0  # memory study: the stream order's seed
    position: int | None = None  # memory study: the example's place in its cell's stream (0 first)
    budget: int | None = None  # the per-call token cap the run had (budget axis or call cap), None: none
    attempts: list[dict[str, Any]] | None = None  # MaTTS: every attempt (answer, judge score, chosen, failed)
    finished_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def cell(self) -> str:
        return cell_key(self.strategy, self.config_name, self.seed, self.arm, self.order)


async def evaluate(service: ReasoningService, example: Example, cell: Cell, memory: bool = False) -> Record:
    """Run `example` with `cell`'s strategy and config through the service, score the answer."""
    trace_id = f"eval-{uuid.uuid4().hex[:16]}"
    params = ExecuteParams(
        query=example.query,
        strategy=cell.strategy,
        strategy_config=cell.config,
        budget=BudgetParams(max_output_tokens=cell.budget) if cell.budget is not None else None,
        memory=MemoryParams(workspace=cell.workspace, learn=True, task_id=example.id) if memory else None,
    )

    async def verify(answer: str) -> bool:  # memory learning labels runs with the scorer itself
        return (await score(answer, example)).correct

    started = time.perf_counter()
    try:
        result = await service.execute(params, trace_id, verifier=verify if memory else None)
    except Exception as exc:  # recorded, with what the run spent before it failed; the grid goes on
        rpc = error_for(exc)
        spent = getattr(exc, "partial_result", None) or {}
        counts = {field: int(spent.get(key, 0)) for field, key in SPENT.items()}
        fields = {"error_code": rpc.code, "error_type": rpc.data.get("error_type"), "trace_id": trace_id}
        return _failed(example, cell, f"{type(exc).__name__}: {exc}", latency_ms=_ms(started), **counts, **fields)
    return await _scored(example, cell, result.model_dump(mode="json"), _ms(started))


async def _scored(example: Example, cell: Cell, result: dict[str, Any], latency: float) -> Record:
    """The record of a finished run, from `reasoning.execute`'s result as JSON (in process or over HTTP)."""
    scored = await score(result["answer"], example)
    m = result["metrics"]
    report = result.get("memory")
    specific = m.get("strategy_specific") or {}
    found_by, attempts = specific.get("found_by"), specific.get("attempts")
    return Record(
        **_base(example, cell),
        found_by=found_by if isinstance(found_by, str) else None,
        correct_lenient=lenient_correct([result["answer"], result.get("reasoning") or ""], example),
        attempts=attempts if isinstance(attempts, list) else None,
        status="ok",
        correct=scored.correct,
        answer=result["answer"][:ANSWER_CHARS],
        extracted=(scored.extracted or "")[:ANSWER_CHARS] or None,
        detail=scored.detail,
        **{key: m[key] for key in ("prompt_tokens", "completion_tokens", "llm_calls", "cache_hits", "retries", "model", "simulated")},
        latency_ms=latency,
        trace_id=result["trace_id"],
        memory={key: len(report.get(key) or []) if key in ("retrieved", "stored") else report.get(key) for key in MEMORY_KEYS}
        if report
        else None,
    )


def _base(example: Example, cell: Cell) -> dict[str, Any]:
    """The fields every record of `example` in `cell` starts with."""
    run = {"example_id": example.id, "strategy": cell.strategy, "config_name": cell.config_name, "seed": cell.seed}
    reference = example.reference if example.kind == "gsm8k" else ""
    return run | {"reference": reference, "arm": cell.arm, "order": cell.order, "budget": cell.budget}


def _failed(example: Example, cell: Cell, error: str, **fields: Any) -> Record:
    """The record of a run that failed with `error`: the grid goes on."""
    return Record(**_base(example, cell), status="error", error=error[:1000], **fields)


# A placebo memory: as long as a typical learned item (title, description, content), retrieved like one, and
# holding no method, no answer and no advice, so that what it shows is the effect of memories' mere presence.
PLACEBO_SENTENCE = "This note records only that a task of this kind was seen; it holds no method, answer or advice. "
PLACEBO_ITEM = {
    "title": "A note about a task of this kind",
    "description": "A record that a task of this kind was seen before, with nothing learned from it.",
    "content": (PLACEBO_SENTENCE * 5).strip(),
    "source_type": "manual",
}


def memory_request(example: Example, cell: Cell) -> dict[str, Any]:
    """The `memory` params of a memory-aware run over HTTP: the cell's own workspace, and the reference as the
    expected answer, so the service's verifier (not its LLM judge) labels the run. It compares the whole answer,
    stricter than the scorer where an answer wraps its number in words ("always 1"). A placebo run retrieves but
    does not learn: the evaluation stores a placebo memory after it instead."""
    request: dict[str, Any] = {"workspace": cell.workspace, "learn": cell.arm != "placebo", "task_id": example.id}
    if example.kind == "gsm8k" and request["learn"]:
        request["expected_answer"] = example.reference
    return request


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


Engine = Callable[[Example, Cell, bool], Awaitable[Record]]  # runs one example of one cell, memory-aware or not


def InProcessEngine(service: ReasoningService) -> Engine:
    """Runs examples on this process's event loop against one ReasoningService."""
    return functools.partial(evaluate, service)


async def over_http(client: Any, example: Example, cell: Cell, memory: bool) -> Record:
    """The engine of a run through a running service (`functools.partial(over_http, client)`, `client` a
    `reasonray.AsyncClient`): `reasoning.execute` over HTTP, the whole stack the service's users reach, its model and
    its settings."""
    from reasonray.client import ReasonRayError

    started = time.perf_counter()
    try:
        result = await client.execute(
            example.query,
            strategy=cell.strategy,
            strategy_config=cell.config or None,
            budget={"max_output_tokens": cell.budget} if cell.budget is not None else None,
            memory=memory_request(example, cell) if memory else None,
        )
    except ReasonRayError as exc:
        fields = {"error_code": exc.code, "error_type": exc.data.get("error_type"), "trace_id": exc.trace_id or ""}
        return _failed(example, cell, f"{exc.code}: {exc.message}", latency_ms=_ms(started), **fields)
    latency = _ms(started)
    if memory and cell.arm == "placebo":  # found by the task's text, as a learned memory would be
        await client.store_memories([PLACEBO_ITEM], workspace=cell.workspace, key=example.query)
    return await _scored(example, cell, result, latency)


class ResultLog:
    """`results.jsonl`: one record per line, appended and flushed as each example finishes.

    The latest record of an (example, cell) wins, so a rerun that retries a failed example
    supersedes its error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[tuple[str, str], Record] = {}
        if path.exists():
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = Record(**json.loads(line))
                except (json.JSONDecodeError, TypeError) as exc:
                    # a line cut short by a killed run: the example simply runs again
                    log.warning("evals.results_line_skipped", path=str(path), line=number, error=str(exc)[:200])
                    continue
                self.records[(record.example_id, record.cell)] = record

    def done(self, example: Example, cell: Cell) -> bool:
        record = self.records.get((example.id, cell.key))
        return record is not None and record.status == "ok"

    def append(self, record: Record) -> None:
        self.records[(record.example_id, record.cell)] = record
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(asdict(record), ensure_ascii=False) + "\n")

    def select(self, examples: list[Example], cells: list[Cell]) -> list[Record]:
        """The records of this grid and this selection of examples."""
        return [r for c in cells for e in examples if (r := self.records.get((e.id, c.key))) is not None]


async def run_grid(
    engine: Engine,
    examples: list[Example],
    cells: list[Cell],
    results: ResultLog,
    *,
    concurrency: int = 8,
    memory: bool = False,
    on_record: Callable[[Record], None] = lambda record: None,
) -> int:
    """Run what is not done yet; returns how many examples ran. At most `concurrency` run at once."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    slots = asyncio.Semaphore(concurrency)
    ran = 0

    async def one(example: Example, cell: Cell, position: int | None = None) -> None:
        nonlocal ran
        async with slots:
            try:
                record = await engine(example, cell, learns(cell))
            except Exception as exc:  # the engine itself failed (a Ray worker died): still one record
                record = _failed(example, cell, f"{type(exc).__name__}: {exc}")
        record.position = position
        results.append(record)
        ran += 1
        on_record(record)

    def learns(cell: Cell) -> bool:
        return cell.arm in ("on", "placebo") or (memory and not cell.arm)

    async def stream(cell: Cell) -> None:
        for position, example in enumerate(stream_order(examples, cell.order)):
            if not results.done(example, cell):
                await one(example, cell, position)

    jobs = []
    for cell in cells:
        if learns(cell):
            jobs.append(stream(cell))
        else:  # nothing to learn, so no need to wait in line; an arm's (memory off) position still counts
            order = stream_order(examples, cell.order)
            jobs += [one(e, cell, i if cell.arm else None) for i, e in enumerate(order) if not results.done(e, cell)]
    await asyncio.gather(*jobs)
    return ran


def stream_order(examples: list[Example], order: int) -> list[Example]:
    """The examples in stream order `order`: 0 is the dataset's order, any other a shuffle seeded with it."""
    shuffled = list(examples)
    if order:
        random.Random(order).shuffle(shuffled)
    return shuffled
