"""Running a grid: one example of one cell at a time through `ReasoningService.execute`, scored,
appended to `results.jsonl` as it finishes.

Ray-free: an `Engine` runs one (example, cell) and returns its `Record`; `InProcessEngine` runs it
here, `evals.distributed.RayEngine` as a Ray task, `HttpEngine` through a running service over HTTP. `run_grid` schedules with bounded concurrency:
examples of plain cells in any order, those of memory-aware cells in dataset order, one after the
other (a stream: each example retrieves what the earlier ones taught, then learns, never seeing
its own memories). A failed example is a record with its error, and the run goes on. A rerun
skips what `results.jsonl` already holds (examples that failed are tried again).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import structlog

from reasonray.api.jsonrpc import error_for
from reasonray.api.service import ExecuteParams, ReasoningService
from reasonray.evals.datasets import Example
from reasonray.evals.grid import Cell, cell_key
from reasonray.evals.scoring import score
from reasonray.memory.loop import MemoryParams

log = structlog.get_logger(__name__)

ANSWER_CHARS = 2000  # answers are kept this long in results.jsonl


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
    finished_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def cell(self) -> str:
        return cell_key(self.strategy, self.config_name, self.seed)

    @property
    def key(self) -> tuple[str, str]:
        return self.example_id, self.cell

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


async def evaluate(service: ReasoningService, example: Example, cell: Cell, *, memory: bool = False) -> Record:
    """Run `example` with `cell`'s strategy and config through the service, score the answer."""
    trace_id = f"eval-{uuid.uuid4().hex[:16]}"
    base = {
        "example_id": example.id,
        "strategy": cell.strategy,
        "config_name": cell.config_name,
        "seed": cell.seed,
        "reference": example.reference if example.kind == "gsm8k" else "",
        "trace_id": trace_id,
    }
    params = ExecuteParams(
        query=example.query,
        strategy=cell.strategy,
        strategy_config=cell.config,
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
        return Record(
            **base,
            status="error",
            prompt_tokens=int(spent.get("prompt_tokens", 0)),
            completion_tokens=int(spent.get("completion_tokens", 0)),
            llm_calls=int(spent.get("calls", 0)),
            latency_ms=_ms(started),
            error=f"{type(exc).__name__}: {exc}"[:1000],
            error_code=rpc.code,
            error_type=rpc.data.get("error_type"),
        )
    latency = _ms(started)
    scored = await score(result.answer, example)
    m = result.metrics
    report = result.memory
    return Record(
        **base,
        status="ok",
        correct=scored.correct,
        answer=result.answer[:ANSWER_CHARS],
        extracted=(scored.extracted or "")[:ANSWER_CHARS] or None,
        detail=scored.detail,
        prompt_tokens=m.prompt_tokens,
        completion_tokens=m.completion_tokens,
        llm_calls=m.llm_calls,
        cache_hits=m.cache_hits,
        retries=m.retries,
        latency_ms=latency,
        model=m.model,
        simulated=m.simulated,
        memory=None
        if report is None
        else {
            "retrieved": len(report.retrieved),
            "stored": len(report.stored),
            "outcome": report.outcome,
            "learn_error": report.learn_error,
        },
    )


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


class Engine(Protocol):
    async def __call__(self, example: Example, cell: Cell, memory: bool) -> Record: ...


class InProcessEngine:
    """Runs examples on this process's event loop against one ReasoningService."""

    def __init__(self, service: ReasoningService) -> None:
        self.service = service

    async def __call__(self, example: Example, cell: Cell, memory: bool) -> Record:
        return await evaluate(self.service, example, cell, memory=memory)


class HttpEngine:
    """Runs examples through a running service over HTTP (`reasoning.execute`, JSON-RPC), with
    `reasonray.AsyncClient`: the whole stack the service's users reach, its model and its settings."""

    def __init__(self, client: Any) -> None:
        self.client = client  # a reasonray.AsyncClient

    async def __call__(self, example: Example, cell: Cell, memory: bool) -> Record:
        from reasonray.client import ReasonRayError

        if memory:
            raise ValueError("a memory-aware evaluation runs in this process or as Ray tasks, not over HTTP")
        base = {
            "example_id": example.id,
            "strategy": cell.strategy,
            "config_name": cell.config_name,
            "seed": cell.seed,
            "reference": example.reference if example.kind == "gsm8k" else "",
        }
        started = time.perf_counter()
        try:
            result = await self.client.execute(example.query, strategy=cell.strategy, strategy_config=cell.config or None)
        except ReasonRayError as exc:
            return Record(
                **base,
                status="error",
                latency_ms=_ms(started),
                error=f"{exc.code}: {exc.message}"[:1000],
                error_code=exc.code,
                error_type=exc.data.get("error_type"),
                trace_id=exc.trace_id or "",
            )
        latency = _ms(started)
        scored = await score(result["answer"], example)
        m = result["metrics"]
        return Record(
            **base,
            status="ok",
            correct=scored.correct,
            answer=result["answer"][:ANSWER_CHARS],
            extracted=(scored.extracted or "")[:ANSWER_CHARS] or None,
            detail=scored.detail,
            prompt_tokens=m["prompt_tokens"],
            completion_tokens=m["completion_tokens"],
            llm_calls=m["llm_calls"],
            cache_hits=m["cache_hits"],
            retries=m["retries"],
            latency_ms=latency,
            model=m["model"],
            simulated=m["simulated"],
            trace_id=result["trace_id"],
        )


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
                self.records[record.key] = record

    def done(self, example: Example, cell: Cell) -> bool:
        record = self.records.get((example.id, cell.key))
        return record is not None and record.status == "ok"

    def append(self, record: Record) -> None:
        self.records[record.key] = record
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

    async def one(example: Example, cell: Cell) -> None:
        nonlocal ran
        async with slots:
            try:
                record = await engine(example, cell, memory)
            except Exception as exc:  # the engine itself failed (a Ray worker died): still one record
                record = Record(
                    example.id, cell.strategy, cell.config_name, cell.seed, status="error", error=f"{type(exc).__name__}: {exc}"[:1000]
                )
        results.append(record)
        ran += 1
        on_record(record)

    async def stream(cell: Cell) -> None:
        for example in examples:
            if not results.done(example, cell):
                await one(example, cell)

    jobs = [stream(cell) for cell in cells] if memory else [one(e, c) for e in examples for c in cells if not results.done(e, c)]
    await asyncio.gather(*jobs)
    return ran


def pending(examples: list[Example], cells: list[Cell], results: ResultLog) -> int:
    return sum(not results.done(e, c) for e in examples for c in cells)
