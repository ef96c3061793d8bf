"""Examples as Ray tasks: each (example, cell) runs on whichever node Ray picks, through the same
LLM stack as the service (the run's shared response cache actor, retries, breaker); memory-aware
runs reach the run's memory bank actor. The example is the unit spread over the cluster: within
it, a strategy's branches run concurrently on the task's event loop (they wait on the LLM), rather
than as nested tasks, each of which would need a worker process of its own. Tasks ask for no CPU;
`run_grid` bounds how many are in flight, hence how many worker processes the run holds."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import ray

from reasonray.actors import NAMESPACE, unwrap
from reasonray.actors.fanout import LLMSpec, WorkerLoop
from reasonray.actors.memory import RayMemory
from reasonray.api.app import Backends, build_application
from reasonray.api.service import ReasoningService
from reasonray.evals.datasets import Example
from reasonray.evals.grid import Cell
from reasonray.evals.runner import Record, evaluate
from reasonray.kernel.config import Settings


@functools.cache  # a worker process runs one (synchronous) task at a time: no two build at once
def ray_service(spec: LLMSpec, memory: bool) -> ReasoningService:
    """This worker's service for the run (built once per worker process)."""
    settings = Settings.model_validate_json(spec.settings_json)
    backends = Backends(cache=None, memory=RayMemory(spec.app_name, settings) if memory else None)
    return build_application(settings, llm=WorkerLoop.llm(spec), backends=backends, data_dir=None).service


@ray.remote(num_cpus=0, max_retries=0)
def evaluate_task(spec: LLMSpec, example: Example, cell: Cell, memory: bool) -> Record:
    return WorkerLoop.run(evaluate(ray_service(spec, memory), example, cell, memory=memory))


async def on_ray(spec: LLMSpec, example: Example, cell: Cell, memory: bool) -> Record:
    """The engine of a run on Ray (`functools.partial(on_ray, spec)`): the example as a Ray task."""
    return await unwrap(evaluate_task.options(name=f"eval[{cell.key}][{example.id}]").remote(spec, example, cell, memory))


def release(app_name: str) -> None:
    """Stop the run's shared actor (the memory bank), if it started; its data on disk stays."""
    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(f"{app_name}-memory", namespace=NAMESPACE), no_restart=True)


def cluster_summary() -> dict[str, Any]:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {"nodes": len(nodes), "cpus": sum(n["Resources"].get("CPU", 0) for n in nodes)}
