"""What every process of an application shares about its model endpoints: the slots of a small-capacity endpoint
and the parameters its model refuses.

One named detached actor per application (`<app>-endpoints`) holds, per endpoint, a fair FIFO semaphore whose
slots are leases: each lease belongs to an owner (one process) that heartbeats every `HEARTBEAT_S`; an owner
not heard from for `LEASE_TTL_S` (a replica, runner or host that died) loses its leases and its place in the
queue, so a dead process never keeps a one-slot server locked. The actor also keeps the refusals learnt by any
process (`reasonray.gateway.refusals`), which the others take in with their next heartbeat.

`share_endpoints(app_name)` installs both in the calling process (the replica, each branch runner, session host
and evaluation worker); `warm(llm)` discovers the endpoint and opens a connection before the process takes work.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray
import structlog

from reasonray.actors import NAMESPACE
from reasonray.gateway.capabilities import endpoint_client
from reasonray.gateway.concurrency import Lease, use_shared_slots
from reasonray.gateway.refusals import RefusalBook, use_refusal_book

log = structlog.get_logger(__name__)

HEARTBEAT_S = 2.0
ORPHAN_GRACE_S = 10.0
"""A lease its living owner no longer lists (its release was lost: a call Ray cancelled with the request that
sent it) is freed once it is this old, so a grant still on its way to the owner is never taken back."""
LEASE_TTL_S = 15.0
"""An owner silent this long is gone: its leases are freed (a long generation is covered by its heartbeats)."""


@dataclass
class _Endpoint:
    limit: int = 1
    serial: bool = False
    held: dict[str, tuple[str, float]] = field(default_factory=dict)  # lease id -> owner, when granted
    waiting: deque[tuple[str, str, asyncio.Future[None]]] = field(default_factory=deque)
    peak: int = 0  # the most slots held at once
    gone: set[str] = field(default_factory=set)  # released before their acquire arrived


class SlotBoard:
    """The endpoints' FIFO slots with owner expiry, and the refusals learnt; the endpoint actor's state."""

    def __init__(self, ttl_s: float = LEASE_TTL_S, clock: Any = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self.endpoints: dict[str, _Endpoint] = {}
        self.seen: dict[str, float] = {}
        self.refusals: list[tuple[str, str, str]] = []

    def _endpoint(self, name: str) -> _Endpoint:
        return self.endpoints.setdefault(name, _Endpoint())

    async def acquire(self, endpoint: str, limit: int, lease_id: str, owner: str) -> bool:
        """Wait for a slot in arrival order; True when the endpoint is known to be serial."""
        self.seen[owner] = self._clock()
        e = self._endpoint(endpoint)
        e.limit = max(1, limit)
        if lease_id in e.gone:  # released before it arrived
            e.gone.discard(lease_id)
        elif len(e.held) < self._limit(e) and not e.waiting:
            self._hold(e, lease_id, owner)
        else:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            e.waiting.append((lease_id, owner, future))
            await future  # cancelled with the caller: `release` then finds it waiting or holding
        return e.serial

    def _limit(self, e: _Endpoint) -> int:
        return 1 if e.serial else e.limit

    def _hold(self, e: _Endpoint, lease_id: str, owner: str) -> None:
        e.held[lease_id] = (owner, self._clock())
        e.peak = max(e.peak, len(e.held))

    def release(self, endpoint: str, lease_id: str) -> None:
        e = self._endpoint(endpoint)
        if e.held.pop(lease_id, None) is None:
            if (waiter := next((w for w in e.waiting if w[0] == lease_id), None)) is not None:
                e.waiting.remove(waiter)
                waiter[2].cancel()
            else:
                e.gone.add(lease_id)
                if len(e.gone) > 1024:
                    e.gone.pop()
        self._grant(e)

    def _grant(self, e: _Endpoint) -> None:
        while e.waiting and len(e.held) < self._limit(e):
            lease_id, owner, future = e.waiting.popleft()
            if future.done():
                continue
            self._hold(e, lease_id, owner)
            future.set_result(None)

    def serialise(self, endpoint: str) -> None:
        e = self._endpoint(endpoint)
        if not e.serial:
            e.serial = True
            log.warning("llm.concurrency.serial_cluster", endpoint=endpoint)

    def heartbeat(self, owner: str, refusals_seen: int, holding: list[str] | None = None) -> tuple[list[tuple[str, str, str]], int]:
        """The owner is alive (and holds the leases `holding`: its others older than the grace are freed); the
        refusals recorded since it last looked, and how many there are now."""
        now = self.seen[owner] = self._clock()
        if holding is not None:
            kept = set(holding)
            for name, e in self.endpoints.items():
                lost = [i for i, (o, at) in e.held.items() if o == owner and i not in kept and now - at > ORPHAN_GRACE_S]
                for lease_id in lost:
                    self.release(name, lease_id)
                if lost:
                    log.warning("llm.concurrency.leases_orphaned", endpoint=name, owner=owner, leases=len(lost))
        return self.refusals[refusals_seen:], len(self.refusals)

    def expire(self) -> list[str]:
        """Free the slots and queue places of owners not heard from within the TTL; returns those owners."""
        now = self._clock()
        dead = [o for o, at in self.seen.items() if now - at > self.ttl_s]
        for owner in dead:
            del self.seen[owner]
        if not dead:
            return []
        for e in self.endpoints.values():
            e.held = {i: held for i, held in e.held.items() if held[0] not in dead}
            for waiter in [w for w in e.waiting if w[1] in dead]:
                e.waiting.remove(waiter)
                waiter[2].cancel()
            self._grant(e)
        log.warning("llm.concurrency.leases_expired", owners=dead)
        return dead

    def record_refusal(self, base_url: str, model: str, param: str) -> bool:
        entry = (base_url, model, param)
        if entry in self.refusals:
            return False
        self.refusals.append(entry)
        return True

    def stats(self, endpoint: str) -> dict[str, Any]:
        e = self._endpoint(endpoint)
        return {
            "limit": self._limit(e),
            "serial": e.serial,
            "in_flight": len(e.held),
            "waiting": len(e.waiting),
            "peak": e.peak,
        }


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class EndpointBoard(SlotBoard):
    """The application's endpoint actor: the board, with a sweeper freeing the leases of silent owners. An async
    actor (every waiting call is a coroutine, the queue is in order); Ray runs its plain methods on the same loop."""

    _sweeper: asyncio.Task[None] | None = None

    def _sweep_started(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.ttl_s / 3))
            self.expire()

    async def acquire(self, endpoint: str, limit: int, lease_id: str, owner: str) -> bool:
        self._sweep_started()
        return await super().acquire(endpoint, limit, lease_id, owner)

    def heartbeat(self, owner: str, refusals_seen: int, holding: list[str] | None = None) -> tuple[list[tuple[str, str, str]], int]:
        self._sweep_started()
        return super().heartbeat(owner, refusals_seen, holding)


def board_name(app_name: str) -> str:
    return f"{app_name}-endpoints"


class RayEndpointSlots:
    """`SharedSlots` and a refusal sink over the endpoint actor, for one process (its owner id, its heartbeat)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.book = RefusalBook(self.record_refusal)  # what this process learns goes to the actor, whose news it loads
        self._refusals_seen = 0
        self.holding: set[str] = set()
        self.beat()  # registers the owner, takes in what the cluster learnt so far
        threading.Thread(target=self._beating, name="reasonray-endpoint-heartbeat", daemon=True).start()

    async def acquire(self, endpoint: str, limit: int) -> Lease:
        lease = Lease(endpoint, uuid.uuid4().hex)
        try:
            lease.serial = await self.handle.acquire.remote(endpoint, limit, lease.id, self.owner)
        except asyncio.CancelledError:
            self.release(lease)  # waiting or granted meanwhile: either way the slot is not kept
            raise
        self.holding.add(lease.id)
        return lease

    def release(self, lease: Lease) -> None:
        self.holding.discard(lease.id)  # a release Ray drops is made good by the next heartbeat's list
        self.handle.release.remote(lease.endpoint, lease.id)

    def serialise(self, endpoint: str) -> None:
        self.handle.serialise.remote(endpoint)

    def record_refusal(self, base_url: str, model: str, param: str) -> None:
        self.handle.record_refusal.remote(base_url, model, param)

    def beat(self) -> None:
        new, self._refusals_seen = ray.get(self.handle.heartbeat.remote(self.owner, self._refusals_seen, list(self.holding)), timeout=30)
        if new:
            self.book.load(new)

    def _beating(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                self.beat()
            except Exception as exc:  # the actor restarting: the next beat registers again
                log.warning("llm.endpoint_board.heartbeat_failed", reason=str(exc)[:200])


_installed: dict[str, RayEndpointSlots] = {}
_install_lock = threading.Lock()


def share_endpoints(app_name: str) -> RayEndpointSlots | None:
    """Make this process take small endpoints' slots from the application's endpoint actor and learn refusals
    with the whole cluster (idempotent per process); None outside Ray (nothing to share with, and no cluster is
    started for it)."""
    if not ray.is_initialized():
        return None
    with _install_lock:
        slots = _installed.get(app_name)
        if slots is None:
            # the application's endpoint actor, created by whichever process asks first
            board = EndpointBoard.options(name=board_name(app_name), namespace=NAMESPACE, get_if_exists=True, lifetime="detached")
            slots = _installed[app_name] = RayEndpointSlots(board.remote())
            use_refusal_book(slots.book)
            use_shared_slots(slots)
        return slots


def warm_now(llm: Any) -> None:
    """The blocking part of `warm`, for a constructor: discovery (a few probe requests) and the tokenizer."""
    client = endpoint_client(llm)
    try:
        if client is not None and hasattr(client, "discover_now"):
            client.discover_now()
        if (tokens := getattr(client, "tokens", None)) is not None:
            tokens.count("warm")
    except Exception as exc:  # a model server not up yet is found at the first call, as before
        log.warning("llm.warm_failed", reason=str(exc)[:200])


async def warm(llm: Any) -> dict[str, Any]:
    """Before a process takes work: discover the endpoint (its capacity, context, tokenizer) and open a connection
    from this event loop, so the first request pays for neither. Never raises: a model server that is not up yet is
    found at the first call, as before."""
    started = time.perf_counter()
    client = endpoint_client(llm)
    if client is None:
        return {"warmed": False}
    warmed = True
    try:
        await client.discover()
        if (tokens := getattr(client, "tokens", None)) is not None:
            tokens.count("warm")  # loads the tokenizer (tiktoken's file, or the server's)
        await client.ping()  # GET /models: a pooled connection is open for the first call
    except Exception as exc:
        log.warning("llm.warm_failed", reason=str(exc)[:200])
        warmed = False
    return {"warmed": warmed, "ms": round((time.perf_counter() - started) * 1000, 1)}
