"""How many calls one endpoint gets at once from this process, learned from how the server behaves.

A server that runs one request at a time (llama.cpp's python server, a one-slot llama.cpp) queues the rest
itself and they time out there, unseen. `EndpointLimiter` keeps them in our queue instead: a call takes a slot
before it is sent and gives it back when it ends. The limit is the configured or discovered one when there is
one; otherwise it starts at `ceiling` and is learned from streamed calls. When a call's first token arrives
only after another call's whole generation (one that started after this call was sent, and ran for at least
`MIN_EVIDENCE_S`) had finished, the server did not run them together: the limit drops to the most calls ever
seen generating at once. Every `RECOVERY_CALLS` calls without such evidence it grows by one again, so a
server that was only busy with someone else's work gets its parallelism back.

A small limit holds for the whole cluster, not per process: where one is installed (`use_shared_slots`), a call
to an endpoint whose limit is at most `SHARED_LIMIT_MAX` also takes a slot of `SharedSlots` (on Ray, the
application's endpoint actor), so five processes send a one-at-a-time server one call, not five. A larger limit
(vLLM, an unknown server) skips that round trip. A server that ends a stream without a finish reason cut it for
another request (llama-cpp-python's default `--interrupt_requests`): after the first such cut the endpoint is
serial (limit 1, told to every process); cut again while serial (by a caller outside the cluster), its calls go
plain, which such a server queues instead of cutting.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)

MIN_EVIDENCE_S = 0.5
"""A generation shorter than this says nothing about queueing (a fast reply can finish inside another's prefill)."""
RECOVERY_CALLS = 50
OVERLAP_S = 0.2
"""Two calls generating together for less than this may only be one ending as the next begins."""


SHARED_LIMIT_MAX = 8
"""An endpoint that takes at most this many calls at once gets its slots from `SharedSlots` too; above it, the
process's own limit is enough (a parallel server queues the excess itself without cutting or timing out)."""


@dataclass(slots=True, eq=False)
class Lease:
    """A slot of an endpoint held across processes; `serial`: the cluster knows this endpoint runs one call at a time."""

    endpoint: str
    id: str
    serial: bool = False


class SharedSlots(Protocol):
    """An endpoint's slots shared by every process that calls it: FIFO, and a holder that dies loses its slots."""

    async def acquire(self, endpoint: str, limit: int) -> Lease:
        """Wait in order for one of `limit` slots of `endpoint` (cancel-safe: a cancelled wait holds nothing)."""
        ...

    def release(self, lease: Lease) -> None:
        """Give the slot back (never blocks)."""
        ...

    def serialise(self, endpoint: str) -> None:
        """Tell every process that `endpoint` runs one call at a time (never blocks)."""
        ...


@dataclass(slots=True, eq=False)
class Ticket:
    """One call's slot, and when it reached the server's generation."""

    dispatched_at: float
    lease: Lease | None = None
    first_token_at: float | None = None
    finished_at: float | None = None


class EndpointLimiter:
    """A counting semaphore whose size is configured, discovered or learned; usable from several event loops."""

    def __init__(self, name: str, *, limit: int | None = None, ceiling: int = 256, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.ceiling = max(ceiling, 1)
        self.fixed = limit
        self.learned: int | None = None
        """The concurrency the server showed it sustains, once calls were seen waiting for each other."""
        self.peak_generating = 1
        self._clock = clock
        self._lock = threading.Lock()
        self.in_flight = 0
        self.on_the_wire = 0
        """Calls whose HTTP request is open (sent, not yet answered or closed): what keeps a serial server busy."""
        self._generating: set[Ticket] = set()
        self._recent: deque[Ticket] = deque(maxlen=256)  # finished, for the queueing test
        self._clean = 0
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self.shared: SharedSlots | None = _shared
        """The cluster's slots for a small limit (None: this process's slots only)."""
        self.serial = False
        """The server cut a stream for another call: one call at a time, whatever discovery says."""
        self.plain = False
        """Cut again while serial: streams from this endpoint are not safe, send plain calls."""

    @property
    def limit(self) -> int:
        return 1 if self.serial else next(limit for limit in (self.fixed, self.learned, self.ceiling) if limit is not None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        """Marks an HTTP request to the endpoint as open while the block runs."""
        with self._lock:
            self.on_the_wire += 1
        try:
            yield
        finally:
            with self._lock:
                self.on_the_wire -= 1

    def configure(self, limit: int | None) -> None:
        """Fix the limit (configured, or discovered from the server), or None to learn it."""
        with self._lock:
            self.fixed = limit
            self._grant()

    async def acquire(self) -> Ticket:
        """A slot of this process, then (for a small limit) one of the cluster's; the waits are in order."""
        await self._acquire_local()
        lease = None
        shared, limit = self.shared, self.limit
        if shared is not None and limit <= SHARED_LIMIT_MAX:
            try:
                lease = await shared.acquire(self.name, limit)
            except asyncio.CancelledError:
                self._give_back()
                raise
            except Exception as exc:  # the cluster's slots are a courtesy to the server: the call still goes
                log.warning("llm.concurrency.shared_unavailable", endpoint=self.name, reason=str(exc)[:200])
            if lease is not None and lease.serial and not self.serial:
                self._serialise(shared=False)
        return Ticket(self._clock(), lease)

    async def _acquire_local(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.in_flight < self.limit and not self._waiters:
                self.in_flight += 1
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))
                elif future.done() and not future.cancelled():  # granted just as we were cancelled: pass it on
                    self.in_flight -= 1
                    self._grant()
            raise

    def _give_back(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self._grant()

    def stream_cut(self) -> None:
        """A stream ended without a finish reason: the server cut it for another call. The first cut makes the
        endpoint serial here and across the cluster; a cut while serial sends this endpoint plain calls."""
        if not self.serial:
            self._serialise(shared=True)
        elif not self.plain:
            self.plain = True
            log.warning("llm.concurrency.plain_calls", endpoint=self.name, reason="streams cut while calls were serial")

    def _serialise(self, *, shared: bool) -> None:
        with self._lock:
            self.serial = True
        log.warning("llm.concurrency.serial", endpoint=self.name, reason="the server cut a stream for another call")
        if shared and self.shared is not None:
            try:
                self.shared.serialise(self.name)
            except Exception as exc:
                log.warning("llm.concurrency.shared_unavailable", endpoint=self.name, reason=str(exc)[:200])

    def _grant(self) -> None:
        # the lock is held
        while self._waiters and self.in_flight < self.limit:
            loop, future = self._waiters.popleft()
            if future.done():
                continue
            self.in_flight += 1
            try:
                loop.call_soon_threadsafe(self._resolve, future)
            except RuntimeError:  # that loop is closed: its waiter will never run
                self.in_flight -= 1

    def _resolve(self, future: asyncio.Future[None]) -> None:
        if future.done():  # cancelled after it was granted: give the slot back
            self._give_back()
        else:
            future.set_result(None)

    def started(self, ticket: Ticket) -> None:
        """The call's first token arrived: the server is working on it."""
        now = self._clock()
        with self._lock:
            ticket.first_token_at = now
            self._generating.add(ticket)
            queued = any(
                t.first_token_at is not None
                and t.finished_at is not None
                and t.first_token_at >= ticket.dispatched_at
                and t.finished_at <= now
                and t.finished_at - t.first_token_at >= MIN_EVIDENCE_S
                for t in self._recent
            )
            if queued and self.fixed is None:
                learned = min(self.peak_generating, self.learned or self.ceiling)
                if learned != self.learned:
                    log.info("llm.concurrency.learned", endpoint=self.name, limit=learned)
                self.learned, self._clean = learned, 0

    def release(self, ticket: Ticket) -> None:
        """The call ended (answered, failed or cancelled)."""
        with self._lock:
            now = ticket.finished_at = self._clock()
            self._generating.discard(ticket)
            if ticket.first_token_at is not None:
                # calls that generated alongside this one for a while (not a next call that began as this one ended)
                together = 1 + sum(1 for t in self._generating if t.first_token_at is not None and t.first_token_at <= now - OVERLAP_S)
                self.peak_generating = max(self.peak_generating, together)
                self._recent.append(ticket)
                self._clean += 1
                if self.learned is not None and self._clean >= RECOVERY_CALLS and self.learned < self.ceiling:
                    self.learned, self._clean = self.learned + 1, 0
            self.in_flight -= 1
            self._grant()
        if ticket.lease is not None and self.shared is not None:
            lease, ticket.lease = ticket.lease, None
            try:
                self.shared.release(lease)
            except Exception as exc:  # the holder's lease then expires with its heartbeat
                log.warning("llm.concurrency.shared_unavailable", endpoint=self.name, reason=str(exc)[:200])


_limiters: dict[str, EndpointLimiter] = {}
_limiters_lock = threading.Lock()
_shared: SharedSlots | None = None


def use_shared_slots(slots: SharedSlots | None) -> SharedSlots | None:
    """Have every limiter of this process (present and future) take small limits' slots from `slots`; returns the
    previous ones."""
    global _shared
    with _limiters_lock:
        previous, _shared = _shared, slots
        for limiter in _limiters.values():
            limiter.shared = slots
    return previous


def limiter_for(endpoint: str, *, ceiling: int = 256) -> EndpointLimiter:
    """The process's one limiter for `endpoint` (a base URL): every stack calling it shares its slots."""
    with _limiters_lock:
        return _limiters.setdefault(endpoint, EndpointLimiter(endpoint, ceiling=ceiling))
