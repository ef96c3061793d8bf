"""The ReasoningBank: stores judged memories, retrieves them by composite score, tracks genealogy,
workspaces and statistics. Synchronous and Ray-free; the memory bank actor runs it in worker
threads, and tests and notebooks call it directly.

Retrieval (docs/memory.md) re-ranks the workspace's nearest items by composite score (memory/scoring.py)
and returns the items of the best `top_k` past tasks, never those of the current task.

Every write is prepared completely (validated, parents checked, keys embedded) before anything is
stored, and a trace whose write fails takes its items with it: no half-written memory.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, TypedDict, Unpack

from pydantic import BaseModel, Field

from reasonray.kernel.config import MemorySettings
from reasonray.kernel.errors import InvalidParamsError, NotFoundError
from reasonray.memory.embeddings import Embedder
from reasonray.memory.items import MemoryEntry, MemoryItem, utc_now
from reasonray.memory.scoring import Scores, composite, similarity_from_cosine_distance
from reasonray.memory.store import ChromaStore

LATENCY_WINDOW = 2048
LLM_COUNTS = ("calls", "cache_hits", "retries", "prompt_tokens", "completion_tokens")


class RetrievalOptions(TypedDict, total=False):
    """What narrows a retrieval, passed through every memory client. Unset: the [memory] settings' top_k and
    min_similarity, no excluded task, no domain or error pattern, not errors only."""

    top_k: int | None
    exclude_task_ids: Sequence[str]
    domain: str | None
    error_patterns: Sequence[str]
    error_only: bool
    min_similarity: float | None


class Retrieved(BaseModel):
    memory: MemoryItem
    scores: Scores
    warning: bool = Field(description="True for lessons from failures: the prompt flags them.")
    genealogy: dict[str, Any] = Field(description="parent_memory_id and evolution_stage.")


class BankStats:
    """The bank's statistics: traces and outcomes, LLM calls and cache hits, retrieval and embedding time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.since = time.time()
            # success, failure (traces), items_stored, captured, skipped (passive), runs, errors, texts (embedded), LLM_COUNTS,
            # and for each timed kind (retrieval, embedding) <kind>_count and <kind>_ms, with its latest times in `samples`
            self.counts: Counter[str] = Counter()
            self.samples: dict[str, deque[float]] = {kind: deque(maxlen=LATENCY_WINDOW) for kind in ("retrieval", "embedding")}

    def add(self, ms: dict[str, float] | None = None, /, **counts: int) -> None:
        """Add `counts`, and the times `ms` gives (of a retrieval, an embedding)."""
        with self._lock:
            self.counts.update(counts)
            for kind, took in (ms or {}).items():
                self.samples[kind].append(took)
                self.counts.update({f"{kind}_count": 1, f"{kind}_ms": took})  # type: ignore[dict-item]  # Counter adds floats too

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            c = self.counts
            judged, calls, hits = c["success"] + c["failure"], c["calls"], c["cache_hits"]
            return {
                "since": datetime.fromtimestamp(self.since).astimezone().isoformat(),
                "traces": {
                    "total": judged,
                    "success": c["success"],
                    "failure": c["failure"],
                    "success_rate": _rate(c["success"], judged),
                    "failure_rate": _rate(c["failure"], judged),
                },
                "items_stored": c["items_stored"],
                "passive_learning": {"captured": c["captured"], "skipped": c["skipped"]},
                "runs": {"total": c["runs"], "errors": c["errors"]},
                "llm": {**{key: c[key] for key in LLM_COUNTS}, "api_calls": calls - hits, "cache_hit_rate": _rate(hits, calls)},
                "retrieval": self._latency("retrieval"),
                "embedding": {**self._latency("embedding"), "texts": c["texts"]},
            }

    def _latency(self, kind: str) -> dict[str, Any]:
        s, count, total = sorted(self.samples[kind]), self.counts[f"{kind}_count"], float(self.counts[f"{kind}_ms"])
        return {
            "count": count,
            "mean_ms": round(total / count, 3) if count else None,
            "p50_ms": round(statistics.median(s), 3) if s else None,
            "p95_ms": round(s[min(int(0.95 * len(s)), len(s) - 1)], 3) if s else None,
            "total_ms": round(total, 3),
        }


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


@dataclass(eq=False)
class ReasoningBank:
    store: ChromaStore
    embedder: Embedder
    settings: MemorySettings
    _: KW_ONLY
    clock: Callable[[], datetime] = utc_now
    stats: BankStats = field(default_factory=BankStats, init=False)

    def embed(self, texts: list[str]) -> list[list[float]]:
        started = time.perf_counter()
        vectors = self.embedder.embed(texts)
        self.stats.add({"embedding": (time.perf_counter() - started) * 1000}, texts=len(texts))
        return vectors

    # -- writes -----------------------------------------------------------------------------------
    def _prepare(self, items: Sequence[MemoryItem], workspace: str) -> list[MemoryItem]:
        """Items placed in `workspace`, parents checked and evolution stages set."""
        pending = {str(i.id): i for i in items}
        if len(pending) != len(items):
            raise InvalidParamsError("two memory items share an id; give each its own (or omit ids)")
        parent_ids = {str(i.parent_memory_id) for i in items if i.parent_memory_id} - set(pending)
        parents = {str(p.id): p for p in self.store.find(workspace, None, ids=sorted(parent_ids))} if parent_ids else {}
        if missing := parent_ids - set(parents):
            raise InvalidParamsError(
                f"parent_memory_id {', '.join(sorted(missing))} is not a memory of workspace {workspace!r}; "
                "a memory can only evolve from one in its own workspace",
                {"workspace": workspace, "missing_parents": sorted(missing)},
            )
        prepared: dict[str, MemoryItem] = {}

        def place(item: MemoryItem) -> MemoryItem:  # a parent in the same write is placed first
            key, parent_id = str(item.id), str(item.parent_memory_id or "")
            if key not in prepared:
                parent = parents.get(parent_id) or place(pending[parent_id]) if parent_id else None
                stage = 0 if parent is None else parent.evolution_stage + 1
                prepared[key] = item.model_copy(update={"workspace": workspace, "evolution_stage": stage})
            return prepared[key]

        return [place(i) for i in items]

    def store_items(self, items: Sequence[MemoryItem], *, workspace: str, keys: Sequence[str] | None = None) -> list[MemoryItem]:
        """Store items found by `keys` (default: their own text). Idempotent by item id."""
        prepared = self._prepare(items, workspace)
        # a memory with no task query is found by its own words
        texts = list(keys) if keys is not None else [f"{i.title}. {i.description} {i.content}" for i in prepared]
        self.store.add(prepared, texts, self.embed(texts))
        self.stats.add(items_stored=len(prepared))
        return prepared

    def store_entry(self, entry: MemoryEntry, *, workspace: str) -> tuple[list[MemoryItem], str]:
        """Store a judged task: its items keyed by the task's query, and its trace. All or nothing."""
        prepared = [i.model_copy(update={"task_id": entry.task_id}) for i in self._prepare(entry.items, workspace)]
        [vector] = self.embed([entry.query])
        self.store.add(prepared, [entry.query] * len(prepared), [vector] * len(prepared))
        try:
            trace_id = self.store.add_trace(entry.model_copy(update={"items": prepared}), workspace, vector)
        except Exception:
            self.store.remove(workspace, [str(i.id) for i in prepared])
            raise
        self.stats.add(items_stored=len(prepared), **{entry.outcome: 1})
        return prepared, trace_id

    # -- retrieval --------------------------------------------------------------------------------
    def retrieve(self, query: str, *, workspace: str, **options: Unpack[RetrievalOptions]) -> list[Retrieved]:
        """Embed the task and rank the workspace's memories for it (`ranked` lists the options)."""
        started = time.perf_counter()
        [vector] = self.embed([query])
        found = self.ranked(vector, workspace=workspace, **options)
        self.stats.add({"retrieval": (time.perf_counter() - started) * 1000})
        return found

    def ranked(self, vector: Sequence[float], *, workspace: str, **options: Unpack[RetrievalOptions]) -> list[Retrieved]:
        """Retrieval from an embedded query: nearest candidates, composite re-ranking, best `top_k` tasks."""
        s, o = self.settings, options
        top_k = o.get("top_k") or s.top_k
        floor = s.min_similarity if (given := o.get("min_similarity")) is None else given
        exclude, error_only = o.get("exclude_task_ids"), o.get("error_only")
        where = _where({"task_id": {"$nin": list(exclude)}} if exclude else None, {"has_error": True} if error_only else None)
        score = partial(
            composite,
            now=self.clock(),
            weights=s.weights,
            half_life_days=s.recency_half_life_days,
            domain=o.get("domain"),
            error_patterns=o.get("error_patterns", ()),
        )
        nearest = self.store.nearest(workspace, vector, max(s.candidates, top_k * 3), where)
        scored = [(item, score(item, sim)) for item, distance in nearest if (sim := similarity_from_cosine_distance(distance)) >= floor]
        scored.sort(key=lambda pair: pair[1].composite, reverse=True)
        # the items of one past task come together: those of the best `top_k` tasks
        chosen = list(dict.fromkeys(item.task_id or str(item.id) for item, _ in scored))[:top_k]
        results = []
        for item, scores in scored:
            if (item.task_id or str(item.id)) not in chosen:
                continue
            parent = str(item.parent_memory_id) if item.parent_memory_id else None
            genealogy = {"parent_memory_id": parent, "evolution_stage": item.evolution_stage}
            results.append(Retrieved(memory=item, scores=scores, warning=item.is_warning, genealogy=genealogy))
        return results

    def errors(self, *, workspace: str, error_type: str | None = None, domain: str | None = None, limit: int = 100) -> list[MemoryItem]:
        """Memories carrying error context (what failures taught), optionally of one error type or domain."""
        where = _where(
            {"has_error": True}, {"error_type": error_type} if error_type else None, {"domain_category": domain} if domain else None
        )
        return self.store.find(workspace, where or {}, limit)

    # -- single items and genealogy ---------------------------------------------------------------
    def get(self, memory_id: str, *, workspace: str) -> MemoryItem:
        key = _uuid(memory_id)
        found = self.store.find(workspace, None, ids=[key])
        if not found:
            raise NotFoundError(f"no memory {key} in workspace {workspace!r}", {"memory_id": key, "workspace": workspace})
        return found[0]

    def children(self, memory_id: str, *, workspace: str) -> list[MemoryItem]:
        return sorted(self.store.find(workspace, {"parent_memory_id": _uuid(memory_id)}), key=lambda i: i.created_at)

    def descendants(self, memory_id: str, *, workspace: str) -> list[MemoryItem]:
        """Every memory derived from this one, at any depth, breadth first."""
        out: list[MemoryItem] = []
        frontier = [_uuid(memory_id)]
        seen = set(frontier)
        while frontier:  # one parent per memory: a child is found once per generation; `seen` ends a cycle
            found = [c for parent in frontier for c in self.children(parent, workspace=workspace) if str(c.id) not in seen]
            frontier = [str(c.id) for c in found]
            seen.update(frontier)
            out += found
        return out

    def genealogy(self, memory_id: str, *, workspace: str) -> dict[str, Any]:
        """The memory, its ancestors (root first) and the tree of everything derived from it."""
        memory = self.get(memory_id, workspace=workspace)
        ancestors: list[MemoryItem] = []
        seen = {str(memory.id)}
        parent = memory.parent_memory_id
        # a parent deleted with an older workspace state is not found: the chain ends there
        while parent is not None and str(parent) not in seen and (found := self.store.find(workspace, None, ids=[str(parent)])):
            seen.add(str(parent))
            ancestors.insert(0, found[0])
            parent = found[0].parent_memory_id

        shown: list[MemoryItem] = []

        def tree(item: MemoryItem, depth: int) -> dict[str, Any]:
            kids = self.children(str(item.id), workspace=workspace) if depth < 64 else []
            shown.extend(kids)
            return {"memory": item.model_dump(mode="json"), "children": [tree(k, depth + 1) for k in kids]}

        return {
            "memory": memory.model_dump(mode="json"),
            "evolution_stage": memory.evolution_stage,
            "ancestors": [a.model_dump(mode="json") for a in ancestors],
            "descendants": tree(memory, 0)["children"],
            "descendant_count": len(shown),  # as the tree above found them
        }

    # -- workspaces -------------------------------------------------------------------------------
    def list_workspaces(self) -> list[dict[str, Any]]:
        counts = {name: self.store.count(name) for name in self.store.workspaces()}
        return [{"workspace": name, "memories": memories, "traces": traces} for name, (memories, traces) in counts.items()]

    def delete_workspace(self, workspace: str) -> dict[str, Any]:
        if workspace not in self.store.workspaces():
            raise NotFoundError(f"no workspace {workspace!r}", {"workspace": workspace, "workspaces": self.store.workspaces()})
        memories, traces = self.store.drop(workspace)
        return {"workspace": workspace, "deleted_memories": memories, "deleted_traces": traces}


def _where(*clauses: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chroma's filter for all of `clauses` (None: no filter)."""
    given = [c for c in clauses if c is not None]
    return given[0] if len(given) == 1 else ({"$and": given} if given else None)


def _uuid(memory_id: str) -> str:
    try:
        return str(uuid.UUID(str(memory_id)))
    except ValueError:
        raise InvalidParamsError(f"memory id {memory_id!r} is not a UUID", {"memory_id": str(memory_id)}) from None
