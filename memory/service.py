"""The memory bank as a service: JSON in, JSON out, so the same object answers in-process callers
and, through the memory bank actor, every replica of an application. `open_bank` builds the bank
the configuration describes (embedding model and Chroma client); `LocalMemory` is the async
`MemoryClient` over a bank in this process.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

import httpx

from reasonray.kernel.config import Settings
from reasonray.kernel.errors import MemoryUnavailableError
from reasonray.kernel.telemetry import Metrics, NoMetrics
from reasonray.memory.bank import LLM_COUNTS, ReasoningBank, RetrievalOptions
from reasonray.memory.embeddings import (
    ChromaDefaultEmbedder,
    Embedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    bundled_model_path,
)
from reasonray.memory.items import MemoryEntry, MemoryItem
from reasonray.memory.store import ChromaStore, open_client

DEFAULT_OPENAI_EMBEDDING_MODEL = "text-embedding-3-small"
T = TypeVar("T")
P = ParamSpec("P")


def build_embedder(settings: Settings, environ: dict[str, str] | None = None) -> Embedder:
    env = os.environ if environ is None else environ
    m = settings.memory
    if m.embedding == "sentence_transformers":
        return SentenceTransformerEmbedder(m.embedding_model)
    if m.embedding == "openai":
        simulated = settings.resolved_provider(env) == "simulated"
        return OpenAIEmbedder(
            m.embedding_model or ("simulated" if simulated else DEFAULT_OPENAI_EMBEDDING_MODEL),
            base_url=m.embedding_base_url or settings.llm.base_url,
            api_key="simulated" if simulated else env.get(settings.llm.api_key_env),
            timeout_s=settings.llm.request_timeout_s,
        )
    return ChromaDefaultEmbedder()


def open_bank(settings: Settings) -> ReasoningBank:
    """The configured bank: Chroma embedded under data_dir/chroma, or the server at [memory] chroma_url."""
    embedder = build_embedder(settings)
    client = open_client(settings.memory.chroma_url, Path(settings.data_dir))
    return ReasoningBank(ChromaStore(client, embedder.name, settings.memory.collection_prefix), embedder, settings.memory)


class BankService:
    """ReasoningBank operations with JSON-ready arguments and answers."""

    def __init__(self, bank: ReasoningBank, metrics: Metrics | None = None) -> None:
        self.bank = bank
        self.metrics = metrics or NoMetrics()

    def retrieve(self, query: str, workspace: str, **options: Unpack[RetrievalOptions]) -> list[dict[str, Any]]:
        started = time.perf_counter()
        found = self.bank.retrieve(query, workspace=workspace, **options)
        self.metrics.record("reasonray_memory_retrieval_latency_seconds", time.perf_counter() - started)
        return [r.model_dump(mode="json") for r in found]

    def store_items(self, items: list[dict[str, Any]], workspace: str, keys: list[str] | None = None) -> list[dict[str, Any]]:
        parsed = [MemoryItem.model_validate(i) for i in items]
        stored = self.bank.store_items(parsed, workspace=workspace, keys=keys)
        self._size(workspace)
        return [i.model_dump(mode="json") for i in stored]

    def store_entry(self, entry: dict[str, Any], workspace: str) -> dict[str, Any]:
        items, trace_id = self.bank.store_entry(MemoryEntry.model_validate(entry), workspace=workspace)
        self._size(workspace)
        return {"items": [i.model_dump(mode="json") for i in items], "trace_id": trace_id}

    def _size(self, workspace: str) -> None:
        self.metrics.record("reasonray_memory_items", self.bank.store.count(workspace)[0], workspace=workspace)

    def get(self, memory_id: str, workspace: str) -> dict[str, Any]:
        return self.bank.get(memory_id, workspace=workspace).model_dump(mode="json")

    def genealogy(self, memory_id: str, workspace: str) -> dict[str, Any]:
        return self.bank.genealogy(memory_id, workspace=workspace)

    def descendants(self, memory_id: str, workspace: str) -> list[dict[str, Any]]:
        return [i.model_dump(mode="json") for i in self.bank.descendants(memory_id, workspace=workspace)]

    def errors(self, workspace: str, error_type: str | None = None, domain: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        found = self.bank.errors(workspace=workspace, error_type=error_type, domain=domain, limit=limit)
        return [i.model_dump(mode="json") for i in found]

    def traces(self, task_id: str, workspace: str) -> list[dict[str, Any]]:
        return self.bank.store.traces(workspace, task_id)

    def list_workspaces(self) -> list[dict[str, Any]]:
        return self.bank.list_workspaces()

    def delete_workspace(self, workspace: str) -> dict[str, Any]:
        deleted = self.bank.delete_workspace(workspace)
        self.metrics.record("reasonray_memory_items", 0, workspace=workspace)
        return deleted

    def stats(self) -> dict[str, Any]:
        return {**self.bank.stats.snapshot(), "embedder": self.bank.embedder.name}

    def reset_stats(self) -> dict[str, Any]:
        self.bank.stats.reset()
        return self.stats()

    def record_runs(self, tally: dict[str, Any], runs: int, errors: int) -> None:
        """`runs` runs counted at once, `errors` of them failed, whose LLM tallies add up to `tally` (what `RayMemory`
        sends: one actor call for a batch of runs)."""
        self.bank.stats.add(runs=runs, errors=errors, **{key: int(tally.get(key, 0)) for key in LLM_COUNTS})

    def record_passive(self, captured: bool) -> None:
        self.bank.stats.add(**{"captured" if captured else "skipped": 1})


def _guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a BankService method; a store that stops answering is MemoryUnavailableError."""
    try:
        return fn(*args, **kwargs)
    except (httpx.TransportError, ConnectionError) as exc:  # a Chroma server that went away mid-run
        raise MemoryUnavailableError(
            f"the memory store did not answer ({type(exc).__name__}: {exc}); check that the Chroma server of "
            "[memory] chroma_url is running and reachable"
        ) from exc


def _remote(method: Callable[Concatenate[BankService, P], T]) -> Callable[Concatenate[MemoryClient, P], Coroutine[Any, Any, T]]:
    """A BankService method as a MemoryClient's: the same arguments, one `_call` by its name, awaited."""

    async def call(self: MemoryClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        result: T = await self._call(method.__name__, *args, **kwargs)
        return result

    functools.update_wrapper(call, method)  # its name, its docstring and its signature, which Ray checks calls against
    return call


class MemoryClient:
    """BankService's methods, awaited: each is one `_call` of the method by name, run in a worker thread in this
    process (`LocalMemory`) or on the memory bank actor (`actors.memory.RayMemory`)."""

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    retrieve = _remote(BankService.retrieve)
    store_items = _remote(BankService.store_items)
    store_entry = _remote(BankService.store_entry)
    get = _remote(BankService.get)
    genealogy = _remote(BankService.genealogy)
    descendants = _remote(BankService.descendants)
    errors = _remote(BankService.errors)
    traces = _remote(BankService.traces)
    list_workspaces = _remote(BankService.list_workspaces)
    delete_workspace = _remote(BankService.delete_workspace)
    stats = _remote(BankService.stats)
    reset_stats = _remote(BankService.reset_stats)
    record_runs = _remote(BankService.record_runs)
    record_passive = _remote(BankService.record_passive)

    async def record_run(self, tally: dict[str, Any], ok: bool) -> None:
        await self.record_runs(tally, 1, int(not ok))


class LocalMemory(MemoryClient):
    """The MemoryClient over a bank in this process; blocking Chroma and embedding work runs in threads.
    The memory bank actor is this class, run by Ray (actors/memory.py)."""

    def __init__(self, service: BankService) -> None:
        self.service = service

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(_guarded, getattr(self.service, method), *args, **kwargs)


def check_memory(settings: Settings) -> None:
    """Fail at start-up, naming the fix, when the configured bank cannot work (no model, no server)."""
    m = settings.memory
    if not m.enabled:
        return
    if m.embedding == "sentence_transformers" and not m.embedding_model:
        bundled_model_path()
    if m.chroma_url:
        open_client(m.chroma_url, Path(settings.data_dir))
