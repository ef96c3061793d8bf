"""Many sessions in one process: which are live, their locks, and the bound on how many a host holds.

A session host (actors/session.py) serves every session routed to it from one event loop. What it
keeps for a live session is small: a lock that orders and serialises the session's calls (turns,
re-entries, close), and its place in a least-recently-used order. The session's state itself is read
from the repository at the start of every call and saved at its end, so a host that dies, or drops
the session for idleness, loses nothing: the next call, on this host or another, reads it again.

The bound (`capacity`) keeps a host's memory flat under load: a new session that finds the host full
takes the place of the least recently used idle one; when every live session is busy (in a call or
queued behind one) the new one is refused with `OverloadedError`, never queued without limit.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import structlog

from reasonray.kernel.errors import OverloadedError

log = structlog.get_logger(__name__)


@dataclass
class _Live:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # calls in progress or waiting for the lock
    last_used: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class LiveSessions:
    """The live sessions of one host, at most `capacity` of them."""

    capacity: int
    idle_timeout_s: float
    retry_after_s: float = 1.0
    _live: OrderedDict[str, _Live] = field(default_factory=OrderedDict, init=False)  # least recently used first

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._live

    @property
    def busy(self) -> int:
        return sum(1 for entry in self._live.values() if entry.users)

    @asynccontextmanager
    async def use(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session's lock for one call: calls into one session run one at a time, in arrival order
        (asyncio.Lock wakes its waiters first in, first out)."""
        entry = self._live.get(session_id)
        if entry is None:
            self._make_room(session_id)
            entry = self._live[session_id] = _Live()
        self._live.move_to_end(session_id)
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            entry.last_used = time.monotonic()

    def drop(self, session_id: str) -> None:
        """Forget a session that is not in use (closed): it takes no slot any more."""
        entry = self._live.get(session_id)
        if entry is not None and not entry.users:
            del self._live[session_id]

    def drop_idle(self) -> int:
        """Forget sessions unused for `idle_timeout_s`; returns how many."""
        cutoff = time.monotonic() - self.idle_timeout_s
        idle = [sid for sid, entry in self._live.items() if not entry.users and entry.last_used < cutoff]
        for sid in idle:
            del self._live[sid]
        return len(idle)

    def _make_room(self, session_id: str) -> None:
        if len(self._live) < self.capacity:
            return
        for sid, entry in self._live.items():  # least recently used first
            if not entry.users:
                del self._live[sid]
                log.debug("session.evicted_for_room", session_id=sid)
                return
        raise OverloadedError(
            f"this session host holds {self.capacity} live sessions and every one is busy; retry session {session_id!r} "
            f"in {self.retry_after_s:g} s, or raise [sessions] max_live_per_host or [sessions] hosts",
            {"session_id": session_id, "retry_after_s": self.retry_after_s},
        )
