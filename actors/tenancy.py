"""The cluster-wide halves of tenancy: one ownership table and one rate limiter per application, shared by
every replica, each in a named actor, with the typed clients the guard uses (`reasonray.api.access.tenancy`).

Neither lets calls interleave: the limiter is a sync actor, which Ray runs one call at a time, and the
ownership actor's methods never await, so counts and claims never race. Both keep
what must outlive them in the application's store: ownership records and token budgets go to
PostgreSQL with `[store] url`, else to files under the data directory; request windows and run
slots stay in the limiter's memory. Both follow the deployed settings (`actors.lifecycle`): a
redeploy with another data directory or store replaces them, so nothing is written to the old one.

The limiter's client batches: for a principal with a requests-per-minute limit it takes a lease of a few
request permits at a time and spends them locally, so most calls cost no actor round trip; runs
(which also hold a concurrency slot and check token budgets) always ask the actor before they start,
and report their end (slot freed, tokens charged) without waiting for the answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import structlog

from reasonray.actors import unwrap
from reasonray.actors.lifecycle import Fingerprinted, NamedActor, fingerprint, private_files
from reasonray.api.access.limits import Decision, KeyedLimits, RateLimiter, TokenBudgets
from reasonray.api.access.tenancy import LocalOwners
from reasonray.stores.counters import open_counters
from reasonray.stores.ownership import OwnerRecord, open_ownership

LEASE_S = 1.0  # unused permits of a lease expire this soon: a replica never sits on others' headroom for long
LEASE_SHARE = 20  # a lease is at most 1/20 of a per-minute limit, so leftover permits waste little of it
MAX_LEASE = 16
BUDGET_FLUSH_S = 1.0  # token charges are written to the store at most this often (a dying limiter loses at most this much)

log = structlog.get_logger(__name__)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class OwnersActor(LocalOwners, Fingerprinted):
    """The application's `OwnershipRepository` (PostgreSQL or `<data_dir>/tenancy/owners.json`) run by Ray, through
    `LocalOwners`: its methods never await, so each call runs whole before the next and claims never race."""

    def __init__(self, fp: str, store_url: str | None, data_dir: str) -> None:
        private_files()
        self._fingerprint = fp
        super().__init__(open_ownership(store_url, Path(data_dir)))


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class LimiterActor(RateLimiter, Fingerprinted):
    """The application's `RateLimiter`; its token budgets are counters in the store, so a restart keeps them."""

    def __init__(self, fp: str, store_url: str | None, data_dir: str) -> None:
        private_files()
        self._fingerprint = fp
        # token charges reach the store once a second, summed (TokenBudgets), not twice per run
        super().__init__(budgets=TokenBudgets(open_counters(store_url, Path(data_dir)), flush_s=BUDGET_FLUSH_S))
        threading.Thread(target=self._flush_forever, name="budget-flush", daemon=True).start()

    def flush_due(self) -> None:
        self.budgets.flush_due(time.time())

    @staticmethod
    def _flush_forever() -> None:
        # through the actor's own queue: Ray runs its calls one at a time, so a flush never interleaves with them
        actor = ray.get_runtime_context().current_actor
        while True:
            time.sleep(BUDGET_FLUSH_S)
            ray.get(actor.flush_due.remote())


class RayOwners:
    """`reasonray.api.access.tenancy.Owners` over the application's ownership actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def get(self, kind: str, ident: str) -> OwnerRecord | None:
        return await unwrap(self.handle.get.remote(kind, ident))

    async def claim(self, kind: str, ident: str, sub: str) -> bool:
        return await unwrap(self.handle.claim.remote(kind, ident, sub))

    async def share(self, kind: str, ident: str, readers: list[str]) -> None:
        await unwrap(self.handle.share.remote(kind, ident, readers))

    async def drop(self, kind: str, ident: str) -> None:
        await unwrap(self.handle.drop.remote(kind, ident))

    async def readable(self, kind: str, sub: str) -> list[str]:
        return await unwrap(self.handle.readable.remote(kind, sub))

    async def owned(self, kind: str) -> set[str]:
        return await unwrap(self.handle.owned.remote(kind))


RUN_LEASE_S = 1.0  # a lease's free run slots are used this long after it was granted; then they go back
RUN_SLOT_TTL_S = 10.0  # the actor frees a leased slot its replica stopped renewing (the replica died)
RUN_RENEW_S = 3.0  # how often a replica renews the slots it holds
RUN_LEASE_SHARE = 4  # a run lease is at most 1/4 of a concurrent_runs limit
MAX_RUN_LEASE = 4


@dataclass
class _RunLease:
    """Run slots this replica holds at the limiter for one set of limits: free ones and running ones."""

    keys: list[str]
    granted: float
    budget_left: int | None = None  # tokens the tightest budget had left at the grant, less what runs here spent since
    free: list[str] = field(default_factory=list)
    busy: set[str] = field(default_factory=set)
    renewed: float = 0.0

    def usable(self, now: float) -> bool:
        """A free slot in a lease still fresh, with tokens left in its budget."""
        return bool(self.free) and now - self.granted < RUN_LEASE_S and (self.budget_left is None or self.budget_left > 0)


class RayLimits:
    """`reasonray.api.access.limits.Limits` over the application's limiter actor, with leased request permits and
    leased run slots: most admissions cost no actor round trip.

    Run slots are taken from the actor a few at a time (at most a quarter of `concurrent_runs`) and held
    there, so concurrency limits stay exact across replicas; a slot freed here is used again for the next
    run while its lease is fresh (`RUN_LEASE_S`, which also bounds how stale the budget check of a leased
    admission is), then given back. Leased runs' tokens are charged in one call per key set every half
    lease. The replica renews the slots it holds every `RUN_RENEW_S`; the actor
    frees slots not renewed for `RUN_SLOT_TTL_S`, so a replica that dies holds nobody's headroom for long.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._leases: dict[tuple, tuple[int, float, Decision]] = {}
        self._runs: dict[tuple, _RunLease] = {}
        self._running: dict[str, _RunLease] = {}  # leased slots in use here -> their lease (finish finds it at once)
        self._charges: dict[tuple[str, ...], int] = {}  # tokens of leased runs not yet sent, per key set
        self._background: set[asyncio.Future[None]] = set()
        self._keeper: asyncio.Task[None] | None = None

    async def usage(self, key: str) -> dict[str, int]:
        return await unwrap(self.handle.usage.remote(key))  # type: ignore[no-any-return]

    async def admit(self, keyed: KeyedLimits, *, run: bool, requests: int = 1) -> Decision:
        permit: Decision = await self._permit(keyed) if requests else {"ok": True, "limit": None, "remaining": None, "reset_s": None}
        if not run or not permit["ok"]:
            return permit
        return await self._run_slot(keyed, permit)

    async def _permit(self, keyed: KeyedLimits) -> Decision:
        lease_key = _lease_key(keyed)
        left, expires, decision = self._leases.get(lease_key, (0, 0.0, {"ok": False, "limit": None, "remaining": None}))
        now = time.monotonic()
        if left <= 0 or now >= expires:  # a new lease (the actor counts it all as spent), or one permit when none fits
            size = _lease_size(keyed)
            decision = await unwrap(self.handle.admit.remote(keyed, requests=size))
            if not decision["ok"] and size > 1:
                size = 1
                decision = await unwrap(self.handle.admit.remote(keyed))
            if not decision["ok"]:
                return decision
            left, expires = size, now + LEASE_S
        self._leases[lease_key] = (left - 1, expires, decision)
        return {**decision, "remaining": max(decision["remaining"] + left - 1, 0) if decision["remaining"] is not None else None}

    async def _run_slot(self, keyed: KeyedLimits, permit: Decision) -> Decision:
        key = _lease_key(keyed)
        lease = self._runs.get(key)
        now = time.monotonic()
        if lease is None or not lease.usable(now):
            keys = [k for k, _ in keyed]
            if (tokens := self._charges.pop(tuple(keys), 0)) > 0:  # the limiter decides on every token this replica knows of
                await unwrap(self.handle.finish.remote(keys, None, tokens))
            size = _lease_size(keyed, "concurrent_runs", RUN_LEASE_SHARE, MAX_RUN_LEASE)
            leased = None
            if size > 1:
                leased = await unwrap(self.handle.admit.remote(keyed, requests=0, run=True, runs=size, lease_s=RUN_SLOT_TTL_S))
            if leased is None or (not leased["ok"] and leased.get("limit_name") == "concurrent_runs"):
                # a small concurrent_runs limit, or no room for a whole lease: one slot, freed when the run ends
                decision = await unwrap(self.handle.admit.remote(keyed, requests=0, run=True))
                return {**permit, "run_id": decision["run_id"]} if decision["ok"] else decision
            if not leased["ok"]:
                return leased
            lease = self._runs.setdefault(key, _RunLease(keys=keys, granted=now, renewed=now))
            lease.granted = lease.renewed = now
            lease.budget_left = leased.get("budget_left")
            lease.free.extend(reversed(leased["run_ids"]))  # the first is this run's (free.pop() takes the last)
            if self._keeper is None or self._keeper.done():
                self._keeper = asyncio.ensure_future(self._keep())
        run_id = lease.free.pop()
        lease.busy.add(run_id)
        self._running[run_id] = lease
        return {**permit, "run_id": run_id}

    async def finish(self, keys: list[str], run_id: str | None, tokens: int) -> None:
        """Free the run's slot and charge its tokens without holding the caller's response: the call is
        submitted now, so this replica's next admission reaches the (sequential) actor after it, and its
        answer is awaited in the background (a failure is logged; the actor retries across restarts).
        A leased slot stays with this replica for the next run while its lease is fresh."""
        lease = self._running.pop(run_id, None) if run_id else None
        if lease is not None and run_id is not None:  # the slot stays leased; its tokens go with the next batch of charges
            lease.busy.discard(run_id)
            lease.free.append(run_id)
            if tokens > 0:
                self._charges[tuple(keys)] = self._charges.get(tuple(keys), 0) + tokens
                if lease.budget_left is not None:
                    lease.budget_left -= tokens
            return
        if run_id is not None or tokens > 0:
            self._send(self.handle.finish.remote(keys, run_id, tokens), keys)

    async def take(self, keyed: KeyedLimits, ttl_s: float) -> Decision:
        """`reasonray.api.access.egress.SharedSlots`: a remote-agent call in flight, counted for the whole cluster; its
        slot is freed when the call ends or, if its replica dies holding it, after its TTL."""
        return await unwrap(self.handle.admit.remote(keyed, requests=0, run=True, lease_s=ttl_s))  # type: ignore[no-any-return]

    async def give_back(self, keys: list[str], slot: str) -> None:
        await unwrap(self.handle.release.remote(keys, [slot]))

    def _send(self, ref: Any, keys: list[str]) -> None:
        settled = asyncio.ensure_future(_settle(ref, keys))
        self._background.add(settled)  # held until it ends: a task nothing refers to may be collected
        settled.add_done_callback(self._background.discard)

    async def _keep(self) -> None:
        """Send the leased runs' token charges, give back free slots of stale leases and renew the rest, until
        this replica holds no slot and owes no charge."""
        while self._runs or self._charges:
            await asyncio.sleep(RUN_LEASE_S / 2)
            charges, self._charges = self._charges, {}
            for keys, tokens in charges.items():
                self._send(self.handle.finish.remote(list(keys), None, tokens), list(keys))
            now = time.monotonic()
            for key, lease in list(self._runs.items()):
                if lease.free and now - lease.granted >= RUN_LEASE_S:
                    self._send(self.handle.release.remote(lease.keys, lease.free), lease.keys)
                    lease.free = []
                if not lease.busy and not lease.free:
                    del self._runs[key]
                elif now - lease.renewed >= RUN_RENEW_S:
                    lease.renewed = now
                    self._send(self.handle.renew.remote(lease.keys, [*lease.busy, *lease.free], RUN_SLOT_TTL_S), lease.keys)


def _lease_key(keyed: KeyedLimits) -> tuple:
    return tuple((k, tuple(sorted(lim.items()))) for k, lim in keyed)


async def _settle(ref: Any, keys: list[str]) -> None:
    try:
        await unwrap(ref)
    except Exception as exc:
        log.warning("limits.finish_failed", keys=keys, error=f"{type(exc).__name__}: {exc}"[:200])


def _lease_size(keyed: KeyedLimits, limit: str = "requests_per_minute", share: int = LEASE_SHARE, most: int = MAX_LEASE) -> int:
    """Permits (or run slots) one lease takes: a `share`-th of the tightest `limit`, at most `most`. 1 is no lease: a
    run slot is then freed when its run ends, under a concurrent_runs of 7 or less."""
    limits = [lim[limit] for _, lim in keyed if lim.get(limit)]
    return max(1, min(most, min(limits) // share)) if limits else most


def owners_actor(app_name: str, store_url: str | None, data_dir: Path, actor_class: Any = OwnersActor, role: str = "owners") -> Any:
    """Deploy time: the ownership actor (or the `role` actor of `actor_class`) for this store and data directory,
    replacing one built for others."""
    args = (store_url, str(data_dir))
    return NamedActor(actor_class, f"{app_name}-{role}", fingerprint(*args), args).deploy().handle


def tenancy_clients(app_name: str, store_url: str | None, data_dir: Path) -> tuple[RayOwners, RayLimits]:
    """Deploy time: the ownership records and limits of an application with authentication, on the cluster's shared
    actors; both follow this deployment's store and data directory (its token budgets among them), and keep their records there."""
    limiter = owners_actor(app_name, store_url, data_dir, LimiterActor, "limiter")
    return RayOwners(owners_actor(app_name, store_url, data_dir)), RayLimits(limiter)
