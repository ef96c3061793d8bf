"""The cluster-wide halves of tenancy: one ownership table and one rate limiter per application, shared by
every replica, each in a named actor, with the typed clients the guard uses (`reasonray.api.tenancy`).

Both actors are sync: Ray runs their calls one at a time, so counts and claims never race. The
limiter's client batches: for a principal with a requests-per-minute limit it takes a lease of a few
request permits at a time and spends them locally, so most calls cost no actor round trip; runs
(which also hold a concurrency slot and check token budgets) always ask the actor.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray

from reasonray.actors import NAMESPACE, unwrap
from reasonray.api.limits import KeyedLimits, RateLimiter
from reasonray.api.tenancy import OwnershipTable

LEASE_S = 1.0  # unused permits of a lease expire this soon: a replica never sits on others' headroom for long
LEASE_SHARE = 20  # a lease is at most 1/20 of a per-minute limit, so leftover permits waste little of it
MAX_LEASE = 16


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class OwnersActor:
    def __init__(self, path: str | None) -> None:
        self.table = OwnershipTable(Path(path) if path else None)

    def call(self, method: str, *args: Any) -> Any:
        if method.startswith("_") or not callable(getattr(self.table, method, None)):
            raise AttributeError(f"the ownership table has no method {method!r}")
        return getattr(self.table, method)(*args)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class LimiterActor:
    def __init__(self) -> None:
        self.limiter = RateLimiter()

    def admit(self, keyed: KeyedLimits, requests: int, run: bool) -> dict[str, Any]:
        return self.limiter.admit(keyed, requests=requests, run=run)

    def finish(self, keys: list[str], run_id: str | None, tokens: int) -> None:
        self.limiter.finish(keys, run_id, tokens)

    def usage(self, key: str) -> dict[str, int]:
        return self.limiter.usage(key)


class RayOwners:
    """`reasonray.api.tenancy.Owners` over the application's ownership actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def call(self, method: str, *args: Any) -> Any:
        return await unwrap(self.handle.call.remote(method, *args))


class RayLimits:
    """`reasonray.api.limits.Limits` over the application's limiter actor, with leased request permits."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._leases: dict[tuple, tuple[int, float, dict[str, Any]]] = {}

    async def admit(self, keyed: KeyedLimits, *, run: bool) -> dict[str, Any]:
        if run:
            return await unwrap(self.handle.admit.remote(keyed, 1, True))
        lease_key = tuple((k, tuple(sorted(lim.items()))) for k, lim in keyed)
        left, expires, decision = self._leases.get(lease_key, (0, 0.0, {}))
        now = time.monotonic()
        if left > 0 and now < expires:
            self._leases[lease_key] = (left - 1, expires, decision)
            return {**decision, "remaining": max(decision["remaining"] + left - 1, 0) if decision.get("remaining") is not None else None}
        size = _lease_size(keyed)
        decision = await unwrap(self.handle.admit.remote(keyed, size, False))
        if not decision["ok"] and size > 1:  # not room for a whole lease: maybe for this one call
            size = 1
            decision = await unwrap(self.handle.admit.remote(keyed, 1, False))
        if decision["ok"]:
            self._leases[lease_key] = (size - 1, now + LEASE_S, decision)
            if decision.get("remaining") is not None:  # the actor counted the whole lease as spent
                return {**decision, "remaining": decision["remaining"] + size - 1}
        return decision

    async def finish(self, keys: list[str], run_id: str | None, tokens: int) -> None:
        await unwrap(self.handle.finish.remote(keys, run_id, tokens))


def _lease_size(keyed: KeyedLimits) -> int:
    limits = [lim["requests_per_minute"] for _, lim in keyed if lim.get("requests_per_minute")]
    return max(1, min(MAX_LEASE, min(limits) // LEASE_SHARE)) if limits else MAX_LEASE


def owners_actor(app_name: str, data_dir: Path | None):
    path = str(data_dir / "tenancy" / "owners.json") if data_dir else None
    return OwnersActor.options(name=f"{app_name}-owners", namespace=NAMESPACE, get_if_exists=True, lifetime="detached").remote(path)


def limiter_actor(app_name: str):
    return LimiterActor.options(name=f"{app_name}-limiter", namespace=NAMESPACE, get_if_exists=True, lifetime="detached").remote()
