"""ChromaDB storage of memory items and reasoning traces, one pair of collections per workspace.

Workspaces are isolated by construction (docs/memory.md, "Workspaces"): `<prefix>-m-<workspace>` holds a
workspace's items and `<prefix>-t-<workspace>` its traces, so no query reaches another workspace's items.
Collections use cosine distance (`hnsw.space = cosine`), so similarity is `1 - distance` exactly, not a
transformation of L2; each records the embedding model that filled it, and another model is refused.

Each item is stored whole (its JSON) plus the scalar fields queries filter on: workspace, task id,
parent id, error flag and type, domain, source type, evolution stage and creation time.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from reasonray.kernel.errors import MemoryUnavailableError
from reasonray.memory.items import MemoryEntry, MemoryItem

MEMORIES, TRACES = "m", "t"


class StoreError(MemoryUnavailableError):
    """The store cannot serve the request (a model mismatch, an unreachable server); the message says why."""


def open_client(chroma_url: str | None, data_dir: Path) -> Any:
    """An embedded PersistentClient under `data_dir/chroma`, or an HttpClient to `chroma_url`."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    chroma_settings = ChromaSettings(anonymized_telemetry=False)
    if not chroma_url:
        path = Path(data_dir) / "chroma"
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)  # chroma.sqlite3 holds every task and lesson: the service's user's alone
        return chromadb.PersistentClient(path=str(path), settings=chroma_settings)
    url = urlparse(chroma_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise StoreError(f"[memory] chroma_url {chroma_url!r} is not an http(s) URL such as http://127.0.0.1:8000")
    try:
        client = chromadb.HttpClient(
            host=url.hostname, port=url.port or (443 if url.scheme == "https" else 80), ssl=url.scheme == "https", settings=chroma_settings
        )
        client.heartbeat()
    except Exception as exc:
        raise StoreError(
            f"the Chroma server at {chroma_url} is not reachable ({type(exc).__name__}: {exc}); start it with `chroma run`"
        ) from exc
    return client


def _metadata(item: MemoryItem) -> dict[str, Any]:
    error = item.error_context
    return {
        "item": item.model_dump_json(),
        "workspace": item.workspace,
        "task_id": item.task_id or "",
        "parent_memory_id": str(item.parent_memory_id or ""),
        "has_error": error is not None,
        "error_type": error.error_type if error else "",
        "domain_category": item.domain_category or "",
        "source_type": item.source_type,
        "evolution_stage": item.evolution_stage,
        "created_ts": item.created_at.timestamp(),
    }


def _items(metadatas: Sequence[dict[str, Any] | None]) -> list[MemoryItem]:
    return [MemoryItem.model_validate_json(m["item"]) for m in metadatas if m]


@dataclass(eq=False)
class ChromaStore:
    client: Any
    embedder_name: str
    prefix: str = "rb"
    _collections: dict[str, Any] = field(default_factory=dict, init=False)

    def _name(self, kind: str, workspace: str) -> str:
        return f"{self.prefix}-{kind}-{workspace}"

    def _collection(self, kind: str, workspace: str, *, create: bool) -> Any | None:
        name = self._name(kind, workspace)
        if name in self._collections:
            return self._collections[name]
        if create:
            collection = self.client.get_or_create_collection(
                name,
                configuration={"hnsw": {"space": "cosine"}},
                metadata={"workspace": workspace, "embedder": self.embedder_name, "created_ts": time.time()},
                embedding_function=None,
            )
        else:
            try:
                collection = self.client.get_collection(name, embedding_function=None)
            except Exception:  # chromadb raises NotFoundError (or ValueError in older releases)
                return None
        found = (collection.metadata or {}).get("embedder")
        if found and found != self.embedder_name:
            raise StoreError(
                f"workspace {workspace!r} was filled with embedding model {found!r} but the bank now uses "
                f"{self.embedder_name!r}; vectors from different models cannot be compared. Use the original "
                "[memory] embedding settings, or a new workspace (or delete this one)"
            )
        self._collections[name] = collection
        return collection

    # -- writes -----------------------------------------------------------------------------------
    def add(self, items: Sequence[MemoryItem], keys: Sequence[str], embeddings: Sequence[Sequence[float]]) -> None:
        """Upsert items (idempotent by id: a retried write stores nothing twice), all of one workspace (the bank placed them)."""
        if not items:
            return
        collection = self._collection(MEMORIES, items[0].workspace, create=True)
        collection.upsert(
            ids=[str(i.id) for i in items],
            embeddings=[list(e) for e in embeddings],
            documents=list(keys),
            metadatas=[_metadata(i) for i in items],
        )

    def remove(self, workspace: str, ids: Sequence[str]) -> None:
        collection = self._collection(MEMORIES, workspace, create=False)
        if collection is not None and ids:
            collection.delete(ids=list(ids))

    def add_trace(self, entry: MemoryEntry, workspace: str, embedding: Sequence[float]) -> str:
        trace_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{workspace}/{entry.task_id}/{[str(i.id) for i in entry.items]}"))
        collection = self._collection(TRACES, workspace, create=True)
        collection.upsert(
            ids=[trace_id],
            embeddings=[list(embedding)],
            documents=[entry.trajectory],
            metadatas=[
                {
                    "task_id": entry.task_id,
                    "query": entry.query[:4000],
                    "outcome": entry.outcome,
                    "judged_by": entry.judged_by,
                    "item_ids": json.dumps([str(i.id) for i in entry.items]),
                    "created_ts": time.time(),
                }
            ],
        )
        return trace_id

    # -- reads ------------------------------------------------------------------------------------
    def nearest(
        self, workspace: str, embedding: Sequence[float], n: int, where: dict[str, Any] | None = None
    ) -> list[tuple[MemoryItem, float]]:
        """Up to `n` items nearest to `embedding`, with their cosine distance."""
        if (collection := self._collection(MEMORIES, workspace, create=False)) is None:
            return []
        found = collection.query(query_embeddings=[list(embedding)], n_results=n, where=where or None, include=["metadatas", "distances"])
        return list(zip(_items(found["metadatas"][0]), found["distances"][0], strict=False))

    def find(
        self, workspace: str, where: dict[str, Any] | None, limit: int | None = None, *, ids: list[str] | None = None
    ) -> list[MemoryItem]:
        if (collection := self._collection(MEMORIES, workspace, create=False)) is None:
            return []
        return _items(collection.get(ids=ids, where=where, limit=limit, include=["metadatas"])["metadatas"])

    def traces(self, workspace: str, task_id: str) -> list[dict[str, Any]]:
        if (collection := self._collection(TRACES, workspace, create=False)) is None:
            return []
        found = collection.get(where={"task_id": task_id}, include=["metadatas", "documents"])
        return [
            {**m, "item_ids": json.loads(m["item_ids"]), "trajectory": d}
            for m, d in zip(found["metadatas"], found["documents"], strict=False)
        ]

    def count(self, workspace: str) -> tuple[int, int]:
        memories, traces = (c.count() if (c := self._collection(kind, workspace, create=False)) else 0 for kind in (MEMORIES, TRACES))
        return memories, traces

    # -- workspaces -------------------------------------------------------------------------------
    def workspaces(self) -> list[str]:
        head = f"{self.prefix}-{MEMORIES}-"
        names = [c if isinstance(c, str) else c.name for c in self.client.list_collections()]
        return sorted(n.removeprefix(head) for n in names if n.startswith(head))

    def drop(self, workspace: str) -> tuple[int, int]:
        """Delete a workspace's items and traces; returns how many of each there were."""
        counts = self.count(workspace)
        for kind in (MEMORIES, TRACES):
            name = self._name(kind, workspace)
            self._collections.pop(name, None)
            with contextlib.suppress(Exception):  # not there: nothing to delete
                self.client.delete_collection(name)
        return counts
