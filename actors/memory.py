"""The memory bank actor: the one owner of the application's Chroma client and embedding model.

Every replica, task and session reaches the ReasoningBank through it (`RayMemory`). Its calls run
the bank's blocking work (embedding, Chroma reads and writes) in worker threads, so a slow write
never stalls the actor's event loop and reads go on meanwhile. It restarts when it fails
(`max_restarts=-1`), reopening the store from disk or the Chroma server; calls in flight are
retried on the new instance, which is safe because every write is an upsert by item id.

With embedded Chroma (no `[memory] chroma_url`) the data lives on one node's disk, so the actor is
pinned to the node that created it; a cluster that should survive losing that node uses a Chroma
server instead (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import ray
import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors import NAMESPACE, unwrap
from actors.metrics import ray_metrics
from memory.service import BankService, invoke, open_bank
from reasonray.config import Settings

log = structlog.get_logger(__name__)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class MemoryBankActor:
    def __init__(self, settings_json: str) -> None:
        settings = Settings.model_validate_json(settings_json)
        self._service = BankService(open_bank(settings), ray_metrics(settings.reasoning.performance.enable_metrics))
        load = getattr(self._service.bank.embedder, "load", None)
        if load is not None:  # load the model now, off the event loop, so the first retrieval does not wait for it
            threading.Thread(target=self._warm, args=(load,), daemon=True).start()

    @staticmethod
    def _warm(load: Any) -> None:
        try:
            load()
        except Exception:  # reported, with its fix, by the first call that needs the model
            pass

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Any public BankService method by name, run in a worker thread."""
        return await asyncio.to_thread(invoke, self._service, method, *args, **kwargs)


class RayMemory:
    """`memory.service.MemoryClient` over the application's memory bank actor, created on first use
    (an application that never touches memory never starts it)."""

    def __init__(self, app_name: str, settings: Settings) -> None:
        self.app_name = app_name
        self.settings = settings
        self._handle: Any = None

    @property
    def handle(self) -> Any:
        if self._handle is None:
            self._handle = memory_actor(self.app_name, self.settings)
        return self._handle

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await unwrap(self.handle.call.remote(method, *args, **kwargs))
        except (ActorDiedError, ActorUnavailableError):
            # killed for good (an operator, a lost node): start a new one, which reopens the store, and retry once
            log.info("memory.actor_replaced", app=self.app_name, method=method)
            self._handle = None
            await asyncio.sleep(0.2)  # let Ray release the dead actor's name
            return await unwrap(self.handle.call.remote(method, *args, **kwargs))


def memory_actor(app_name: str, settings: Settings):
    """The application's memory bank actor, created on first use."""
    options: dict[str, Any] = {"name": f"{app_name}-memory", "namespace": NAMESPACE, "get_if_exists": True, "lifetime": "detached"}
    if not settings.memory.chroma_url:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return MemoryBankActor.options(**options).remote(settings.model_dump_json())
