"""The cluster store: PostgreSQL behind the repository seams (`[store] url = "postgresql://..."`).

One `PgStore` per process and URL (`pg_store`) owns the connection pools and speaks SQL, not records:
each kind of record has its PostgreSQL implementation beside its file or SQLite one in this package
(`sessions`, `agent_cards`, `a2a`, `ownership`, `runs`, `audit`, `counters`). The schema is created or
migrated when the store is made, with yoyo-migrations from the SQL files in `reasonray/stores/migrations/` (yoyo takes a lock, so
replicas starting together migrate once).

The driver is psycopg 3's async API: every statement is a coroutine over an `AsyncConnectionPool`.
A pool belongs to the event loop that opened it, so the store keeps one pool per loop (a session host
or a Serve replica has one loop, hence one pool). Callers that are synchronous by design (the
registry, ownership and limiter actors, which Ray runs one call at a time so that claims and counts
never race) go through `blocking`, which runs the coroutine on the store's own loop thread.

Each operation is one round trip on an autocommit connection (no BEGIN/COMMIT, no liveness check
before use), with statements prepared on first use. Statements that are safe to repeat are retried
when the connection drops (`psycopg.OperationalError`: a server restart, a failover, a broken pooled
connection); the pool replaces broken connections itself.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Coroutine
from dataclasses import KW_ONLY, dataclass, field
from importlib import resources
from typing import Any, TypeVar

import psycopg
import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from reasonray.kernel.config import ConfigError

log = structlog.get_logger(__name__)

T = TypeVar("T")
RETRY_ATTEMPTS = 5  # with backoff 0.1 s doubling to 2 s: about 4 s of outage ridden out


@dataclass(eq=False, repr=False)  # no repr: the URL may carry a password
class PgStore:
    """One PostgreSQL database: its pools (one per event loop), retries and a loop thread for synchronous callers.
    Made, it has created or migrated the schema."""

    url: str
    _: KW_ONLY
    # Every session host and replica is a process of its own with its own pool, so pools stay small: a
    # loop makes a few statements at a time. Hundreds of processes: put PgBouncer in front.
    min_size: int = 1
    max_size: int = 4
    timeout_s: float = 10.0
    _pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncConnectionPool] = field(
        default_factory=weakref.WeakKeyDictionary, init=False
    )
    _thread_loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)
    _thread_lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        try:
            migrate(self.url)
        except psycopg.OperationalError as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: Exception) -> ConfigError:
        return ConfigError(
            f"[store] url: cannot connect to PostgreSQL at {redacted(self.url)} within {self.timeout_s:g} s "
            f"({str(exc).strip()[:300]}); start it or fix the URL"
        )

    async def pool(self) -> AsyncConnectionPool:
        """The running loop's pool, opened (and filled to `min_size`) on first use."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = AsyncConnectionPool(
                self.url,
                min_size=self.min_size,
                max_size=self.max_size,
                timeout=self.timeout_s,
                open=False,
                # autocommit: a statement is its own transaction, one round trip; prepare_threshold 0: every
                # statement is prepared on its first use on a connection (the session statements repeat)
                kwargs={"autocommit": True, "prepare_threshold": 0},
                name=f"reasonray-store-{id(loop):x}",
            )
            self._pools[loop] = pool
            try:
                await pool.open(wait=True, timeout=self.timeout_s)
            except PoolTimeout as exc:
                del self._pools[loop]
                await pool.close()
                raise self._unreachable(exc) from None
        return pool

    async def aclose(self) -> None:
        """Close the running loop's pool."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    def close(self) -> None:
        """Close the pool `blocking` uses and stop its thread (pools of other loops close with `aclose`)."""
        with self._thread_lock:
            loop, self._thread_loop = self._thread_loop, None
        if loop is not None:
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(self.timeout_s)
            loop.call_soon_threadsafe(loop.stop)

    def blocking(self, work: Coroutine[Any, Any, T]) -> T:
        """Run one of this store's coroutines to completion from synchronous code (on the store's loop thread)."""
        with self._thread_lock:
            if self._thread_loop is None:
                self._thread_loop = asyncio.new_event_loop()
                threading.Thread(target=self._thread_loop.run_forever, name="reasonray-store", daemon=True).start()
            loop = self._thread_loop
        return asyncio.run_coroutine_threadsafe(work, loop).result()

    async def once(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement once (for statements that must not run twice, such as an increment); its rows."""
        pool = await self.pool()
        async with pool.connection() as conn:
            # the connection's own execute: no cursor object to open and close (measurably cheaper per statement)
            cur = await conn.execute(sql, params)
            return await cur.fetchall() if cur.description else []

    touch = ", updated_at = now()"  # `reasonray.stores.sql.Sql`: the tables keep when a row last changed

    @staticmethod
    def jsonb(value: Any) -> Jsonb:
        """`value` as a JSONB parameter (the record modules leave psycopg unimported until a store is used)."""
        return Jsonb(value)

    @staticmethod
    def loads(column: Any) -> Any:
        """A JSONB column as read: psycopg has parsed it already."""
        return column

    @retry(
        retry=retry_if_exception_type(psycopg.OperationalError),
        stop=stop_after_attempt(RETRY_ATTEMPTS),
        wait=wait_exponential(multiplier=0.1, max=2),
        reraise=True,
        before_sleep=lambda state: log.warning(
            "store.retry", attempt=state.attempt_number, error=str(state.outcome and state.outcome.exception())[:200]
        ),
    )
    async def fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (retried if the connection drops: only for statements safe to repeat); its rows."""
        return await self.once(sql, params)


def migrate(url: str) -> list[str]:
    """Create or migrate the schema to the newest version; returns the ids of the migrations applied."""
    from yoyo import get_backend, read_migrations  # imported here: only processes with a store URL need it

    scheme, _, rest = url.partition("://")  # yoyo names psycopg 3 `postgresql+psycopg`
    backend = get_backend(f"postgresql+psycopg://{rest}" if scheme in ("postgresql", "postgres") else url)
    with resources.as_file(resources.files("reasonray.stores") / "migrations") as path:
        migrations = read_migrations(str(path))
        with backend.lock():
            pending = backend.to_apply(migrations)
            backend.apply_migrations(pending)
    applied = [m.id for m in pending]
    if applied:
        log.info("store.migrated", applied=applied, url=redacted(url))
    return applied


def redacted(url: str) -> str:
    """The URL without its password, for logs and errors."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    return f"{info.get('user', '')}@{info.get('host', '')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


_stores: dict[str, PgStore] = {}
_lock = threading.Lock()


def pg_store(url: str) -> PgStore:
    """The process's store for `url`, created (and the schema migrated) on first use."""
    with _lock:
        if url not in _stores:
            _stores[url] = PgStore(url)
        return _stores[url]
