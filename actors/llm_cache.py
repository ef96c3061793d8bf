"""The LLM response cache shared by every replica and task of an application (policy: reasonray/gateway/cache.py).

Built from `[llm.cache]` and replaced when the application is deployed with other cache settings
(`actors.lifecycle`); `RayCacheStore` is its typed client.
"""

from __future__ import annotations

from typing import Any

import msgspec
import ray

from reasonray.actors import unwrap
from reasonray.actors.lifecycle import Fingerprinted, actor_for, ensure_actor, fingerprint, private_files
from reasonray.gateway.cache import LRUTTLCache
from reasonray.kernel.config import CacheSettings


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class LLMCacheActor(Fingerprinted):
    def __init__(self, fp: str, max_entries: int, ttl_s: float) -> None:
        private_files()
        self._fingerprint = fp
        self._cache = LRUTTLCache(max_entries=max_entries, ttl_s=ttl_s)

    # async methods: the actor serves calls on its event loop, which costs callers about a third of
    # a threaded actor's round trip (measured on the 2-core build machine); the work itself never blocks.
    async def get(self, key: str) -> bytes | None:
        return self._cache.get(key)

    async def put(self, key: str, value: bytes) -> None:
        self._cache.put(key, value)

    async def stats(self) -> dict[str, Any]:
        stats = self._cache.stats()
        return {**msgspec.structs.asdict(stats), "hit_rate": stats.hit_rate}


class RayCacheStore:
    """The CacheStore protocol over the cache actor, and its statistics."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def get(self, key: str) -> bytes | None:
        return await self._handle.get.remote(key)

    async def put(self, key: str, value: bytes) -> None:
        self._handle.put.remote(key, value)  # not awaited: the caller need not wait for the write

    async def stats(self) -> dict[str, Any]:
        return await unwrap(self._handle.stats.remote())


def _args(settings: CacheSettings) -> tuple[str, int, float]:
    return fingerprint(settings.model_dump(mode="json")), settings.max_entries, settings.ttl_s


def cache_actor(app_name: str, settings: CacheSettings) -> Any:
    """The application's cache actor as it runs, or a new one (the call path: a worker building its LLM stack)."""
    return actor_for(LLMCacheActor, f"{app_name}-llm-cache", *_args(settings))


def ensure_cache_actor(app_name: str, settings: CacheSettings) -> Any:
    """Deploy time: the cache actor for these settings, replacing one built from others."""
    return ensure_actor(LLMCacheActor, f"{app_name}-llm-cache", *_args(settings))
