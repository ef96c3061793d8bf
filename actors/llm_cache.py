"""The LLM response cache shared by every replica and task of an application (policy: gateway/cache.py)."""

from __future__ import annotations

from typing import Any

import msgspec
import ray

from actors import NAMESPACE
from gateway.cache import LRUTTLCache
from reasonray.config import CacheSettings


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class LLMCacheActor:
    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self._cache = LRUTTLCache(max_entries=max_entries, ttl_s=ttl_s)

    # async methods: the actor serves calls on its event loop, which costs callers about a third of
    # a threaded actor's round trip (PLATFORM.md); the work itself never blocks.
    async def get(self, key: str) -> bytes | None:
        return self._cache.get(key)

    async def put(self, key: str, value: bytes) -> None:
        self._cache.put(key, value)

    async def stats(self) -> dict[str, Any]:
        stats = self._cache.stats()
        return {**msgspec.structs.asdict(stats), "hit_rate": stats.hit_rate}


class RayCacheStore:
    """The CacheStore protocol over the cache actor."""

    def __init__(self, handle) -> None:
        self._handle = handle

    async def get(self, key: str) -> bytes | None:
        return await self._handle.get.remote(key)

    async def put(self, key: str, value: bytes) -> None:
        self._handle.put.remote(key, value)  # not awaited: the caller need not wait for the write


def cache_actor(app_name: str, settings: CacheSettings):
    return LLMCacheActor.options(
        name=f"{app_name}-llm-cache", namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote(settings.max_entries, settings.ttl_s)
