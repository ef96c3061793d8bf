"""LLM response cache: the key, the LRU + TTL policy, and the wrapper that consults a store.

The key hashes everything that changes the output (model, messages, tools, max_tokens, stop,
temperature, seed, n), what answers it (the endpoint and the fingerprint of the model it serves), and whose calls
they are when authentication is on (`CACHE_SCOPE`). Sampled calls (temperature > 0 without a seed) are never served from the
cache, so parallel branches stay diverse. The store is pluggable: one process's (`LRUTTLCache`), or the
one every process of an application on a machine shares (`SharedCacheStore`, a SQLite file).
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Protocol

import msgspec

from reasonray.gateway.capabilities import Layer, endpoint_client
from reasonray.gateway.protocol import LLM, Completion, LLMRequest
from reasonray.kernel.storage import LocalDatabase

CACHE_SCOPE: ContextVar[str | None] = ContextVar("reasonray_cache_scope", default=None)
"""Whose cache entries the current calls see: the authenticated caller (set where the request is
authenticated, and carried to fan-out branches), so that a cache hit never tells one principal what
another one asked. None (authentication off): one shared cache."""


def cache_scope() -> str | None:
    return CACHE_SCOPE.get()


def scope_cache(scope: str | None) -> None:
    """Make `scope` the current task's cache scope (a function, unlike the ContextVar, travels with code
    that Ray pickles by value, such as an actor class's methods)."""
    CACHE_SCOPE.set(scope)


def cache_key(model: str, request: LLMRequest, backend: str = "", scope: str | None = None) -> str:
    """The key of a request's answer. `backend` names what answers (endpoint, model name, the server's fingerprint
    of the model behind it), so another model behind the same name and URL is never served this one's answers;
    `scope` is whose calls they are, so one principal's hit never tells what another asked."""
    fields: dict[str, object] = {"model": model, "request": request}
    if backend:
        fields["backend"] = backend
    if scope is not None:
        fields["scope"] = scope
    payload = msgspec.json.encode(fields, order="sorted")
    return hashlib.sha256(payload).hexdigest()


class CacheStats(msgspec.Struct):
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expirations: int = 0
    entries: int = 0

    @property
    def hit_rate(self) -> float:
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else 0.0


class LRUTTLCache:
    """One process's cache store: at most `max_entries` values, each for at most `ttl_s` seconds; least recently used goes first."""

    def __init__(self, max_entries: int = 10_000, ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._stats = CacheStats()

    async def get(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is not None and self._clock() - item[0] > self.ttl_s:
            del self._data[key]
            self._stats.expirations += 1
            item = None
        if item is None:
            self._stats.misses += 1
            return None
        self._data.move_to_end(key)
        self._stats.hits += 1
        return item[1]

    async def put(self, key: str, value: bytes) -> None:
        self._data[key] = (self._clock(), value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)
            self._stats.evictions += 1

    def stats(self) -> CacheStats:
        return msgspec.structs.replace(self._stats, entries=len(self._data))


class CacheStore(Protocol):
    """Where cached completions live: in this process, or in a file the processes of one machine share."""

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes) -> None: ...


class SharedCacheStore:
    """The cache every process of an application on one machine shares (its replicas, fan-out runners and session
    hosts): one SQLite file under the data directory, so a call answered in one process is a hit in the others and
    after a restart, within `ttl_s`.

    A lookup is one read on the caller's thread (WAL: it never waits for a writer); everything that writes (a new
    entry, the hit and miss counters, the last use that orders eviction, pruning) goes to one writer thread and
    is never waited on, as a cache's bookkeeping should not be. `max_entries` is kept by pruning the least recently
    used entries every `prune_every` writes, so the file may briefly hold that many more. The entries are
    expendable: the file is written without waiting for the disk (`synchronous=OFF`), and a store that fails
    answers a miss rather than failing the call."""

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, value BLOB NOT NULL, stored_at REAL NOT NULL, used_at REAL NOT NULL)",
        "CREATE INDEX IF NOT EXISTS entries_by_use ON entries (used_at)",
        "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    )
    COUNTS = "SELECT name, value FROM counters UNION ALL SELECT 'entries', count(*) FROM entries"

    def __init__(
        self, path: Path, max_entries: int = 10_000, ttl_s: float = 3600.0, clock: Callable[[], float] = time.time, prune_every: int = 64
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.path, self.max_entries, self.ttl_s, self.prune_every = Path(path), max_entries, ttl_s, prune_every
        self._clock = clock
        # two connections: the reader's lock is never held by a write waiting for another process
        self._reader = LocalDatabase(self.path, self.SCHEMA, synchronous="OFF")
        self._writer = LocalDatabase(self.path, self.SCHEMA, synchronous="OFF")
        self._writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-cache")
        self._since_prune = 0

    async def get(self, key: str) -> bytes | None:
        try:
            row = self._reader.run(lambda db: db.execute("SELECT value, stored_at FROM entries WHERE key = ?", (key,)).fetchone())
        except (sqlite3.Error, OSError):
            return None
        now = self._clock()
        if row is None:
            self._later(self._count, {"misses": 1})
            return None
        value, stored_at = row
        if now - stored_at > self.ttl_s:
            self._later(self._expire, key)
            return None
        self._later(self._touch, key, now)
        return bytes(value)

    async def put(self, key: str, value: bytes) -> None:
        self._later(self._insert, key, value, self._clock())

    async def stats(self) -> dict[str, Any]:
        """Hits, misses, evictions and expirations since the file was made, entries now, and the hit rate."""
        await asyncio.to_thread(self.flush)  # this process's own bookkeeping, counted
        counts = self._reader.run(lambda db: db.execute(self.COUNTS).fetchall())
        stats = msgspec.convert(dict(counts), CacheStats)  # a counter never written yet is 0
        return {**msgspec.structs.asdict(stats), "hit_rate": stats.hit_rate}

    def flush(self) -> None:
        """Wait for the writes handed over so far (tests, and a process that stops)."""
        self._writes.submit(lambda: None).result()

    def _later(self, write: Callable[..., None], *args: Any) -> None:
        # a write that fails stays in its future, which nothing waits on: a lost write of a cache costs at most a later miss
        self._writes.submit(self._writer.run, lambda db: write(db, *args))

    @staticmethod
    def _count(db: sqlite3.Connection, counts: dict[str, int]) -> None:
        db.executemany(
            "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
            list(counts.items()),
        )

    @staticmethod
    def _transaction(db: sqlite3.Connection) -> sqlite3.Connection:
        """`db` in a write transaction, for a `with` block (which commits it, or rolls it back on an error)."""
        db.execute("BEGIN IMMEDIATE")
        return db

    def _touch(self, db: sqlite3.Connection, key: str, now: float) -> None:
        with self._transaction(db):
            db.execute("UPDATE entries SET used_at = ? WHERE key = ?", (now, key))
            self._count(db, {"hits": 1})

    def _expire(self, db: sqlite3.Connection, key: str) -> None:
        with self._transaction(db):
            gone = db.execute("DELETE FROM entries WHERE key = ? AND stored_at < ?", (key, self._clock() - self.ttl_s)).rowcount
            self._count(db, {"misses": 1, "expirations": gone})

    def _insert(self, db: sqlite3.Connection, key: str, value: bytes, now: float) -> None:
        db.execute("INSERT OR REPLACE INTO entries (key, value, stored_at, used_at) VALUES (?, ?, ?, ?)", (key, value, now, now))
        self._since_prune += 1
        if self._since_prune >= min(self.prune_every, self.max_entries):
            self._since_prune = 0
            with self._transaction(db):
                expired = db.execute("DELETE FROM entries WHERE stored_at < ?", (self._clock() - self.ttl_s,)).rowcount
                evicted = db.execute(
                    "DELETE FROM entries WHERE key IN (SELECT key FROM entries ORDER BY used_at DESC LIMIT -1 OFFSET ?)",
                    (self.max_entries,),
                ).rowcount
                self._count(db, {"expirations": expired, "evictions": evicted})


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Completion)


class CachingLLM(Layer):
    """Serves repeatable calls from a store; sampled calls always reach the model."""

    def __init__(self, inner: LLM, store: CacheStore) -> None:
        self.inner = inner
        self.store = store

    async def complete(self, request: LLMRequest) -> Completion:
        if request.sampled:
            return await self.inner.complete(request)
        started = time.perf_counter()
        client = endpoint_client(self.inner)
        if client is not None:
            await client.discover()  # the fingerprint of what answers now is part of the key
        key = cache_key(self.model, request, client.backend if client is not None else "", CACHE_SCOPE.get())
        hit = await self.store.get(key)
        if hit is not None:
            cached = _decoder.decode(hit)
            return msgspec.structs.replace(cached, cached=True, attempts=0, latency_ms=(time.perf_counter() - started) * 1000)
        completion = await self.inner.complete(request)
        if completion.finish_reason != "error":
            await self.store.put(key, _encoder.encode(completion))
        return completion
