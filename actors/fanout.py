"""Fan-out on a pool of async branch-runner actors: many branches share a process and an event loop.

Each branch (a self-consistency vote, a tree-of-thought step, a MaTTS round, a refine step) is one call to a
`BranchRunner`, an async actor whose branches wait on the LLM as coroutines, so one process multiplexes hundreds.
Every API replica owns a `BranchPool` of runners warmed at deploy time, grown by one when every runner's process is
busy (CPU, not branch count: a process more only helps when the event loops are the bottleneck) and gone with the
replica; a replica runs at most `[fanout] max_in_flight` branches and refuses more with OverloadedError (-32011)
rather than queue without bound. A runner builds one LLM stack per settings it is sent (the API key read from its
own environment, never shipped); a branch returns its value with its events, token tally and where it ran (a BRANCH
event). docs/architecture.md ("Fan-out") has the measurements, and why not one Ray task per branch or a Serve
deployment behind a DeploymentHandle.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import ray
import structlog

from reasonray.actors import NAMESPACE, unwrap
from reasonray.actors.endpoint import share_endpoints, warm
from reasonray.actors.lifecycle import private_files
from reasonray.actors.metrics import ray_metrics
from reasonray.actors.ray_compat import actor_id_of
from reasonray.gateway.cache import cache_scope, scope_cache
from reasonray.gateway.factory import build_llm, client_for, shared_cache
from reasonray.gateway.observed import ObservedLLM
from reasonray.gateway.protocol import LLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel import tracing
from reasonray.kernel.config import FanoutSettings, Settings
from reasonray.kernel.errors import OverloadedError
from reasonray.kernel.events import BranchRun, Event, Tally
from reasonray.kernel.logs import configure_logging
from reasonray.strategies.base import Arrived, Branch, StrategyContext
from reasonray.strategies.registry import StrategyRegistry

log = structlog.get_logger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class LLMSpec:
    """How a worker builds the application's LLM stack: its settings (as JSON) and app name."""

    settings_json: str
    app_name: str

    def build(self) -> LLM:
        settings = Settings.model_validate_json(self.settings_json)
        configure_logging(settings.logging)  # runners and session hosts log as the ingress does (level, JSON)
        share_endpoints(self.app_name)  # a small endpoint's slots and the refusals learnt are the cluster's, not this process's
        tracing.set_content(settings.events.record == "full")
        store = shared_cache(settings, self.app_name)
        llm, _ = build_llm(settings, client_for(settings), store, ray_metrics(settings.reasoning.performance.enable_metrics))
        return llm


class WorkerLoop:
    """Per worker process: one LLM stack per spec (a branch runner's, an evaluation task's) and, for a synchronous
    Ray task (evaluation examples, reasonray/evals/distributed.py), one background event loop."""

    lock = threading.Lock()
    loop: asyncio.AbstractEventLoop | None = None
    llms: ClassVar[dict[LLMSpec, LLM]] = {}

    @classmethod
    def run(cls, coroutine: Any) -> Any:
        with cls.lock:
            if cls.loop is None:
                cls.loop = asyncio.new_event_loop()
                threading.Thread(target=cls.loop.run_forever, name="reasonray-tasks", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, cls.loop).result()

    @classmethod
    def llm(cls, spec: LLMSpec) -> LLM:
        with cls.lock:
            if spec not in cls.llms:
                cls.llms[spec] = spec.build()
            return cls.llms[spec]


class CpuMeter:
    """This process's share of a core over the last `window_s` or so (what the pool grows on)."""

    def __init__(self, window_s: float = 1.0) -> None:
        self.window_s = window_s
        self._wall, self._cpu = time.monotonic(), time.process_time()
        self.share = 0.0

    def read(self) -> float:
        wall, cpu = time.monotonic(), time.process_time()
        if wall - self._wall >= self.window_s:
            self.share = (cpu - self._cpu) / (wall - self._wall)
            self._wall, self._cpu = wall, cpu
        return self.share


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)  # a branch calls the LLM: never re-run it behind the caller's back
class BranchRunner:
    """Runs branches as coroutines on one event loop; asks for no CPU (the work waits on the LLM)."""

    def __init__(self) -> None:
        private_files()
        self._cpu = CpuMeter()

    async def warm(self, spec: LLMSpec) -> dict[str, Any]:
        """Build the LLM stack, import what branches need, discover the endpoint and open a connection on this
        runner's loop, so the first real branch pays nothing."""
        StrategyRegistry().discover()  # imports every strategy module (branches unpickle into them)
        llm = WorkerLoop.llm(spec)
        counter_for_model(llm.model).count("warm")  # loads the tokenizer
        await warm(llm)
        runtime = ray.get_runtime_context()
        return {"actor_id": runtime.get_actor_id(), "name": runtime.get_actor_name(), "node_id": runtime.get_node_id(), "pid": os.getpid()}

    async def run(
        self,
        spec: LLMSpec,
        branch: Branch[T],
        trace_id: str,
        strategy: str,
        options: dict[str, Any],
        carrier: dict[str, str] | None = None,
        name: str = "",
        cache_scope: str | None = None,
    ) -> tuple[T, list[Event], Tally, dict[str, Any]]:
        scope_cache(cache_scope)  # the caller's cache entries only (this call runs in its own task)
        started = time.perf_counter()
        events: list[Event] = []
        llm = ObservedLLM(WorkerLoop.llm(spec), events.append, trace_id=trace_id, strategy=strategy, **options)
        context = StrategyContext(llm=llm, tokens=counter_for_model(llm.model), emit=events.append, trace_id=trace_id)
        # the branch's span continues the fanning-out run's trace (the carrier travelled with the call)
        with tracing.span(
            f"branch {name or strategy}", {"reasonray.strategy": strategy, "reasonray.trace_id": trace_id}, parent=carrier or {}
        ):
            value = await branch(context)
        runtime = ray.get_runtime_context()
        where = {
            "task_id": runtime.get_task_id() or "",
            "actor_id": runtime.get_actor_id() or "",
            "node_id": runtime.get_node_id(),
            "pid": os.getpid(),
            "elapsed_ms": round((time.perf_counter() - started) * 1000, 3),
            "cpu": round(self._cpu.read(), 3),
        }
        return value, events, llm.tally, where


GROW_EVERY_S = 5.0


class BranchPool:
    """One replica's branch runners and its bound on branches in flight (single event loop: no locks)."""

    def __init__(self, app_name: str, spec: LLMSpec, settings: FanoutSettings) -> None:
        self.spec = spec
        self.settings = settings
        self.prefix = f"{app_name}-branches-{uuid.uuid4().hex[:8]}"  # named: easy to find in the dashboard
        self.runners: list[Any] = []
        self.load: list[int] = []  # branches this replica has in flight on each runner
        self.cpu: list[float] = []  # each runner's share of a core, as it last reported
        self.grown_at = 0.0  # a new runner takes a second or two to warm: one growth at a time
        self.in_flight = 0
        self.started: list[dict[str, Any]] = []  # where the runners created at deploy time run

    def start(self, timeout_s: float = 120.0) -> list[dict[str, Any]]:
        """Create the initial runners and wait until they are warm (called at deploy time; blocking)."""
        warming = [self._add() for _ in range(self.settings.pool_size)]
        self.started = ray.get(warming, timeout=timeout_s)
        log.info("fanout.pool_ready", runners=len(self.started), prefix=self.prefix)
        return self.started

    def _add(self) -> Any:
        runner = BranchRunner.options(name=f"{self.prefix}-{len(self.runners)}", namespace=NAMESPACE, scheduling_strategy="SPREAD").remote()
        self.runners.append(runner)
        self.load.append(0)
        self.cpu.append(0.0)
        return runner.warm.remote(self.spec)  # calls sent before it finishes queue behind it

    def admit(self, branches: int) -> None:
        """Take `branches` slots, or refuse with OverloadedError; a fan-out wider than the bound runs alone."""
        bound = self.settings.max_in_flight
        if self.in_flight and self.in_flight + branches > bound:
            raise OverloadedError(
                f"overloaded: {self.in_flight} branches in flight on this replica and [fanout] max_in_flight is {bound}; "
                f"retry in {self.settings.retry_after_s:g}s (or raise max_in_flight / add replicas)",
                {"in_flight": self.in_flight, "max_in_flight": bound, "retry_after_s": self.settings.retry_after_s},
            )
        self.in_flight += branches

    def release(self, branches: int) -> None:
        self.in_flight -= branches

    def pick(self) -> int:
        """The least-loaded runner, after adding one when every runner is busy or full (or none was started)."""
        index = min(range(len(self.runners)), key=self.load.__getitem__, default=-1)
        if index < 0 or self._should_grow(index):
            self._add()
            self.grown_at = time.monotonic()
            index = len(self.runners) - 1
            log.info("fanout.pool_grew", runners=len(self.runners), in_flight=self.in_flight, cpu=self.cpu[:-1])
        self.load[index] += 1
        return index

    def _should_grow(self, least_loaded: int) -> bool:
        s = self.settings
        if len(self.runners) >= s.max_pool_size:
            return False
        if self.load[least_loaded] >= s.branches_per_runner:
            return True
        busy = min(self.cpu) >= s.grow_at_cpu
        return busy and self.load[least_loaded] > 0 and time.monotonic() - self.grown_at >= GROW_EVERY_S

    def reported(self, index: int, cpu: float) -> None:
        """A runner's share of a core, as it reported with a branch it returned."""
        self.cpu[index] = cpu

    def describe(self) -> dict[str, Any]:
        return {
            "runners": len(self.runners),
            "actor_ids": [actor_id_of(r) for r in self.runners],
            "started": self.started,
            "in_flight": self.in_flight,
            "max_in_flight": self.settings.max_in_flight,
            "cpu": self.cpu,
        }


class RayFanout:
    """The `Fanout` behind Serve: one actor call per branch on the replica's pool, results merged into the run."""

    def __init__(self, pool: BranchPool) -> None:
        self.pool = pool

    async def __call__(
        self, context: StrategyContext, branches: Sequence[Branch[T]], *, label: str, arrived: Arrived[T] | None = None
    ) -> list[T]:
        pool = self.pool
        strategy = context.llm.strategy
        options = context.llm.branch_options(len(branches))  # the run's memories and token budget apply there too
        carrier = tracing.inject()  # the trace context, so branch spans join the run's trace ({} when off)
        pool.admit(len(branches))
        placed = [pool.pick() for _ in branches]

        async def merge(index: int, ref: Any) -> T:
            # each branch joins the run as it finishes: a run interrupted while others still run (a deadline,
            # a cancellation) has counted its calls and tokens, and `arrived` has seen its value
            value, events, tally, where = await unwrap(ref)
            pool.reported(placed[index], where.pop("cpu", 0.0))
            for event in events:
                context.emit(event)
            context.llm.tally.add(tally)
            context.emit(BranchRun(trace_id=context.trace_id, strategy=strategy, label=label, index=index, llm_calls=tally.calls, **where))
            if arrived is not None:
                arrived(index, value)
            return value

        try:
            refs = [
                pool.runners[r]
                .run.options(name=f"{label}[{i}]")
                .remote(pool.spec, branch, context.trace_id, strategy, options, carrier, f"{label}[{i}]", cache_scope())
                for i, (r, branch) in enumerate(zip(placed, branches, strict=True))
            ]
            try:
                return list(await asyncio.gather(*(merge(i, ref) for i, ref in enumerate(refs))))
            except BaseException:
                for ref in refs:
                    ray.cancel(ref)  # best effort: the run has failed (or was cancelled), stop the other branches
                raise  # the branch's own error (a provider failure, a bad model reply)
        finally:
            for r in placed:
                pool.load[r] -= 1
            pool.release(len(branches))
