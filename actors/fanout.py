"""Fan-out as Ray tasks: each branch of a tree-of-thought step or a MaTTS round runs as its own task.

Branches are I/O-bound (they wait on the LLM), so the tasks ask for no CPU (`num_cpus=0`): five
branches finish in about the time of one on a 2-core machine, and on a cluster Ray spreads them
over the nodes. Each worker process keeps one event loop and one LLM stack (client, retries,
breaker, the application's shared response cache) per application, built on first use from the
settings the replica passes; the API key is read from the worker's environment, never shipped
with the task. A branch returns its value together with its events and token tally, which the
fanning-out run records as its own, plus a BRANCH event saying which task, node and process ran it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import ray

from actors import unwrap
from gateway.protocol import LLM
from gateway.tokens import counter_for_model
from reasonray.config import Settings
from reasonray.events import BranchRun, Event, ObservedLLM, Tally
from strategies.base import Branch, StrategyContext

T = TypeVar("T")


@dataclass(frozen=True)
class LLMSpec:
    """How a worker builds the application's LLM stack: its settings (as JSON) and app name."""

    settings_json: str
    app_name: str

    def build(self) -> LLM:
        from actors.llm_cache import RayCacheStore, cache_actor
        from actors.metrics import ray_metrics
        from reasonray.llm import build_llm, client_for

        settings = Settings.model_validate_json(self.settings_json)
        store = RayCacheStore(cache_actor(self.app_name, settings.llm.cache)) if settings.llm.cache.enabled else None
        llm, _ = build_llm(settings, client_for(settings), store, ray_metrics(settings.reasoning.performance.enable_metrics))
        return llm


class WorkerLoop:
    """Per worker process: one background event loop and one LLM stack per spec."""

    lock = threading.Lock()
    loop: asyncio.AbstractEventLoop | None = None
    llms: dict[LLMSpec, LLM] = {}

    @classmethod
    def run(cls, coroutine: Any) -> Any:
        with cls.lock:
            if cls.loop is None:
                cls.loop = asyncio.new_event_loop()
                threading.Thread(target=cls.loop.run_forever, name="reasonray-branches", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, cls.loop).result()

    @classmethod
    def llm(cls, spec: LLMSpec) -> LLM:
        with cls.lock:
            if spec not in cls.llms:
                cls.llms[spec] = spec.build()
            return cls.llms[spec]


async def _run(spec: LLMSpec, branch: Branch[T], trace_id: str, strategy: str, options: dict[str, Any]) -> tuple[T, list[Event], Tally]:
    events: list[Event] = []
    llm = ObservedLLM(WorkerLoop.llm(spec), events.append, trace_id=trace_id, strategy=strategy, **options)
    context = StrategyContext(llm=llm, tokens=counter_for_model(llm.model), emit=events.append, trace_id=trace_id)
    value = await branch(context)
    return value, events, llm.tally


@ray.remote(num_cpus=0, max_retries=0)
def run_branch(
    spec: LLMSpec, branch: Branch[T], trace_id: str, strategy: str, options: dict[str, Any]
) -> tuple[T, list[Event], Tally, dict[str, Any]]:
    started = time.perf_counter()
    value, events, tally = WorkerLoop.run(_run(spec, branch, trace_id, strategy, options))
    runtime = ray.get_runtime_context()
    where = {
        "task_id": runtime.get_task_id() or "",
        "node_id": runtime.get_node_id(),
        "pid": os.getpid(),
        "elapsed_ms": round((time.perf_counter() - started) * 1000, 3),
    }
    return value, events, tally, where


class RayFanout:
    """The `Fanout` behind Serve: one Ray task per branch, results merged into the calling run."""

    def __init__(self, spec: LLMSpec) -> None:
        self.spec = spec

    async def __call__(self, context: StrategyContext, branches: Sequence[Branch[T]], *, label: str) -> list[T]:
        strategy = context.llm.strategy
        options = context.llm.branch_options(len(branches))  # the run's memories and token budget apply there too
        refs = [
            run_branch.options(name=f"{label}[{i}]").remote(self.spec, branch, context.trace_id, strategy, options)
            for i, branch in enumerate(branches)
        ]
        try:
            outcomes = await asyncio.gather(*(unwrap(ref) for ref in refs))
        except Exception:
            for ref in refs:
                ray.cancel(ref)  # best effort: the run has failed, stop the other branches
            raise  # the branch's own error (a provider failure, a bad model reply)
        values = []
        for index, (value, events, tally, where) in enumerate(outcomes):
            for event in events:
                context.emit(event)
            context.llm.tally.add(tally)
            context.emit(BranchRun(trace_id=context.trace_id, strategy=strategy, label=label, index=index, llm_calls=tally.calls, **where))
            values.append(value)
        return values
