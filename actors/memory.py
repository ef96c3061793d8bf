"""The memory bank actor: the one owner of the application's Chroma client and embedding model.

Every replica, task and session reaches the ReasoningBank through it (`RayMemory`). The actor is
`LocalMemory` run by Ray, so a slow write never stalls its event loop and reads go on meanwhile. It
restarts when it fails (`max_restarts=-1`), reopening the store from disk or the Chroma server; calls
in flight are retried on the new instance, which is safe because every write is an upsert by item id.

It is built from the application's settings and replaced when the application is deployed with
other ones (`RayMemory.bank.deploy` at deploy time, `actors.lifecycle`): memories go to the data
directory or Chroma server configured now, never through a bank left over from an earlier deploy.

With embedded Chroma (no `[memory] chroma_url`) the data lives on one node's disk, so the actor is
pinned to the node that created it; a cluster that should survive losing that node uses a Chroma
server instead (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import ray
import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from reasonray.actors.lifecycle import Fingerprinted, NamedActor, fingerprint, private_files
from reasonray.actors.metrics import ray_metrics
from reasonray.kernel.config import Settings
from reasonray.kernel.logs import configure_logging
from reasonray.memory.service import BankService, LocalMemory, MemoryClient, open_bank

log = structlog.get_logger(__name__)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class MemoryBankActor(LocalMemory, Fingerprinted):
    def __init__(self, fp: str, settings_json: str) -> None:
        private_files()
        self._fingerprint = fp
        settings = Settings.model_validate_json(settings_json)
        configure_logging(settings.logging)  # the level and format the operator set, as in the ingress
        super().__init__(BankService(open_bank(settings), ray_metrics(settings.reasoning.performance.enable_metrics)))
        load = getattr(self.service.bank.embedder, "load", None)
        if load is not None:  # load the model now, off the event loop, so the first retrieval does not wait for it
            threading.Thread(target=self._warm, args=(load,), daemon=True).start()

    @staticmethod
    def _warm(load: Any) -> None:
        with contextlib.suppress(Exception):  # reported, with its fix, by the first call that needs the model
            load()


def memory_fingerprint(settings: Settings) -> str:
    return fingerprint(settings.model_dump(mode="json"))


RUN_STATS_FLUSH_S = 0.5
RUN_STATS_WAIT_S = 5.0  # how often counted runs look for a memory bank that is not running yet


@dataclass
class _RunBatch:
    """Runs counted since the last send to the memory bank actor."""

    tally: Counter[str] = field(default_factory=Counter)
    runs: int = 0
    errors: int = 0

    def add(self, tally: dict[str, Any], ok: bool) -> None:
        self.runs += 1
        self.errors += not ok
        self.tally.update({key: int(value) for key, value in tally.items()})


class RayMemory(MemoryClient):
    """The `MemoryClient` over the application's memory bank actor, created on first use (an
    application that never touches memory never starts it)."""

    def __init__(self, app_name: str, settings: Settings) -> None:
        self.app_name = app_name
        options: dict[str, Any] = {}
        if not settings.memory.chroma_url:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.bank = NamedActor(MemoryBankActor, f"{app_name}-memory", memory_fingerprint(settings), (settings.model_dump_json(),), options)
        # runs counted here and sent as one actor call at most every RUN_STATS_FLUSH_S: an actor call per
        # request cost the ingress ~5% of its CPU under load; stats() and reset_stats() send them first
        self._runs = _RunBatch()
        self._flush: asyncio.Task[None] | None = None

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self.bank.call(method, *args, **kwargs)
        except (ActorDiedError, ActorUnavailableError):
            # killed for good (an operator, a lost node, a redeploy): start a new one, which reopens the store, and retry once
            log.info("memory.actor_replaced", app=self.app_name)
            self.bank.forget()
            await asyncio.sleep(0.2)  # let Ray release the dead actor's name
            return await self.bank.call(method, *args, **kwargs)

    async def stats(self) -> dict[str, Any]:
        await self._send_runs()
        return await self._call("stats")

    async def reset_stats(self) -> dict[str, Any]:
        await self._send_runs()
        return await self._call("reset_stats")

    async def record_run(self, tally: dict[str, Any], ok: bool) -> None:
        self._runs.add(tally, ok)
        if self._flush is None:
            self._flush = asyncio.ensure_future(self._send_runs_later())

    async def _send_runs_later(self) -> None:
        try:
            await asyncio.sleep(RUN_STATS_FLUSH_S)
            # counting runs is no reason to start a bank (its process, Chroma, the embedder): the counts wait here
            # until something that needs the bank started it; stats() and reset_stats() start it and send them
            while not await self.bank.running():
                await asyncio.sleep(RUN_STATS_WAIT_S)
        finally:
            self._flush = None
        try:
            await self._send_runs()
        except Exception as exc:  # statistics only: never a request's failure
            log.warning("memory.run_stats_not_sent", error=f"{type(exc).__name__}: {exc}"[:300])

    async def _send_runs(self) -> None:
        batch, self._runs = self._runs, _RunBatch()
        if batch.runs:
            await self._call("record_runs", batch.tally, batch.runs, batch.errors)
