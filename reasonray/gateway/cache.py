"""LLM response cache: the key, the LRU + TTL policy, and the wrapper that consults a store.

The key hashes everything that changes the output (model, messages, tools, max_tokens, stop,
temperature, seed, n), what answers it (the endpoint and the fingerprint of the model it serves), and whose calls
they are when authentication is on (`CACHE_SCOPE`). Sampled calls (temperature > 0 without a seed) are never served from the
cache, so parallel branches stay diverse. The store is pluggable: an in-process one here, the
shared Ray actor in `actors/llm_cache.py`.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from typing import Protocol

import msgspec

from reasonray.gateway.capabilities import Capabilities, capabilities_of, endpoint_client
from reasonray.gateway.protocol import LLM, Completion, LLMRequest
from reasonray.gateway.tokens import TokenCounter, counter_of

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
    """At most `max_entries` values, each for at most `ttl_s` seconds; least recently used goes first."""

    def __init__(self, max_entries: int = 10_000, ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._stats = CacheStats()

    def get(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            self._stats.misses += 1
            return None
        stored_at, value = item
        if self._clock() - stored_at > self.ttl_s:
            del self._data[key]
            self._stats.expirations += 1
            self._stats.misses += 1
            return None
        self._data.move_to_end(key)
        self._stats.hits += 1
        return value

    def put(self, key: str, value: bytes) -> None:
        self._data[key] = (self._clock(), value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)
            self._stats.evictions += 1

    def stats(self) -> CacheStats:
        return msgspec.structs.replace(self._stats, entries=len(self._data))


class CacheStore(Protocol):
    """Where cached completions live: in this process, or in a shared actor."""

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes) -> None: ...


class LocalCacheStore:
    def __init__(self, cache: LRUTTLCache) -> None:
        self.cache = cache

    async def get(self, key: str) -> bytes | None:
        return self.cache.get(key)

    async def put(self, key: str, value: bytes) -> None:
        self.cache.put(key, value)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Completion)


class CachingLLM:
    """Serves repeatable calls from a store; sampled calls always reach the model."""

    def __init__(self, inner: LLM, store: CacheStore) -> None:
        self.inner = inner
        self.store = store

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def capabilities(self) -> Capabilities:
        """The endpoint's capabilities, from the layer below."""
        return capabilities_of(self.inner)

    @property
    def tokens(self) -> TokenCounter:
        """The endpoint's token counter (the model's own tokens where known), from the layer below."""
        return counter_of(self.inner)

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
