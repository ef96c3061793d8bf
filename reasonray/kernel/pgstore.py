"""The cluster store: PostgreSQL behind the repository seams (`[store] url = "postgresql://..."`).

One `PgStore` per process and URL (`pg_store`) owns the connection pools and speaks JSON, not domain
types: the typed repositories sit in the layers that own the data (sessions in
`reasonray.reasoner.repository`, agent cards in `reasonray.strategies.agents`, A2A tasks and
conversations in `reasonray.api.stores.a2a_store`, ownership in `reasonray.api.access.tenancy`, runs, the audit log
and counters in `reasonray.kernel.repositories`). The schema is created or migrated when the store is
made, with yoyo-migrations from the SQL files in `reasonray/kernel/migrations/` (yoyo takes a lock, so
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
import json
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar

import psycopg
import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential

from reasonray.kernel.config import ConfigError

log = structlog.get_logger(__name__)

T = TypeVar("T")
RETRY_ATTEMPTS = 5  # with backoff 0.1 s doubling to 2 s: about 4 s of outage ridden out


# the run index's columns beside its JSONB event log, in the order they are written and read
RUN_COLUMNS = (
    "trace_id",
    "kind",
    "principal",
    "strategy",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "started_at",
    "elapsed_ms",
    "error",
)


class PgStore:
    """Sessions, agent cards, A2A tasks, runs, ownership records, audit entries and counters in one PostgreSQL database."""

    # Every session host and replica is a process of its own with its own pool, so pools stay small: a
    # loop makes a few statements at a time. Hundreds of processes: put PgBouncer in front.
    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 4, timeout_s: float = 10.0) -> None:
        self.url = url
        self.min_size = min_size
        self.max_size = max_size
        self.timeout_s = timeout_s
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncConnectionPool] = weakref.WeakKeyDictionary()
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._thread_lock = threading.Lock()
        try:
            migrate(url)
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

    async def _retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(psycopg.OperationalError),
            stop=stop_after_attempt(RETRY_ATTEMPTS),
            wait=wait_exponential(multiplier=0.1, max=2),
            reraise=True,
            before_sleep=_log_retry,
        ):
            with attempt:
                return await fn()
        raise AssertionError("unreachable")  # AsyncRetrying re-raises the last error

    async def _once(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        pool = await self.pool()
        async with pool.connection() as conn:
            # the connection's own execute: no cursor object to open and close (measurably cheaper per statement)
            cur = await conn.execute(sql, params)
            return await cur.fetchall() if cur.description else []

    async def fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (retried if the connection drops: only for statements safe to repeat); its rows."""
        return await self._retry(lambda: self._once(sql, params))

    # -- sessions: one row each, optimistic concurrency on `version` ------------------------------------
    async def load_session(self, session_id: str) -> tuple[str, int] | None:
        """The session's state as JSON text (parsed once, by the caller's model) and its version."""
        rows = await self.fetch("SELECT state::text, version FROM sessions WHERE session_id = %s", (session_id,))
        return (rows[0][0], rows[0][1]) if rows else None

    async def save_session(self, session_id: str, status: str, state_json: str, version: int) -> int | None:
        """Store `state_json` as version `version + 1` if the stored version is still `version` (0: a new session).

        Returns the new version, or None when another writer saved in between. A retry after a lost
        connection that finds its own write already committed is a success.
        """
        if version == 0:
            sql = "INSERT INTO sessions (session_id, version, status, state) VALUES (%s, 1, %s, %s::jsonb) ON CONFLICT DO NOTHING RETURNING version"
            params: tuple[Any, ...] = (session_id, status, state_json)
        else:
            sql = (
                "UPDATE sessions SET version = version + 1, status = %s, state = %s::jsonb, updated_at = now() "
                "WHERE session_id = %s AND version = %s RETURNING version"
            )
            params = (status, state_json, session_id, version)
        rows = await self.fetch(sql, params)
        if rows:
            stored: int = rows[0][0]
            return stored
        current = await self.load_session(session_id)
        if current is not None and current[1] == version + 1 and json.loads(current[0]) == json.loads(state_json):
            return version + 1  # our own write, committed before the connection dropped
        return None

    async def session_ids(self) -> list[str]:
        return [r[0] for r in await self.fetch("SELECT session_id FROM sessions ORDER BY session_id")]

    # -- agent cards -----------------------------------------------------------------------------------------
    async def cards(self) -> list[dict[str, Any]]:
        return [r[0] for r in await self.fetch("SELECT card FROM agent_cards ORDER BY agent_id")]

    async def put_card(self, agent_id: str, card: dict[str, Any]) -> None:
        await self.fetch(
            "INSERT INTO agent_cards (agent_id, card) VALUES (%s, %s) ON CONFLICT (agent_id) DO UPDATE SET card = EXCLUDED.card, updated_at = now()",
            (agent_id, Jsonb(card)),
        )

    async def delete_card(self, agent_id: str) -> None:
        await self.fetch("DELETE FROM agent_cards WHERE agent_id = %s", (agent_id,))

    # -- A2A tasks and conversations: every row has an owner (NULL: authentication off) --------------------
    async def save_a2a_task(
        self, task_id: str, owner: str | None, context_id: str, state: int, status_ns: int, task: dict[str, Any]
    ) -> bool:
        """Insert or replace a task; False when the id is taken by another owner (nothing is written)."""
        rows = await self.fetch(
            "INSERT INTO a2a_tasks (task_id, owner, context_id, state, status_ns, task) VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (task_id) DO UPDATE SET context_id = EXCLUDED.context_id, state = EXCLUDED.state, "
            "status_ns = EXCLUDED.status_ns, task = EXCLUDED.task, updated_at = now() "
            "WHERE a2a_tasks.owner IS NOT DISTINCT FROM EXCLUDED.owner RETURNING 1",
            (task_id, owner, context_id, state, status_ns, Jsonb(task)),
        )
        return bool(rows)

    async def a2a_task(self, task_id: str, owner: str | None) -> dict[str, Any] | None:
        where, params = _owned(owner)
        rows = await self.fetch(f"SELECT task FROM a2a_tasks WHERE task_id = %s AND {where}", (task_id, *params))
        return rows[0][0] if rows else None

    async def a2a_tasks(
        self,
        owner: str | None,
        *,
        context_id: str | None,
        state: int | None,
        since_ns: int | None,
        after: tuple[int, str] | None,
        limit: int,
    ) -> tuple[list[dict[str, Any]], int]:
        """The owner's tasks newest first (by status time, then id), from just after `after`; and how many match in all."""
        where, params = _owned(owner)
        clauses, values = [where], list(params)
        for clause, value in (("context_id = %s", context_id), ("state = %s", state), ("status_ns >= %s", since_ns)):
            if value is not None:
                clauses.append(clause)
                values.append(value)
        filtered = " AND ".join(clauses)
        total = int((await self.fetch(f"SELECT count(*) FROM a2a_tasks WHERE {filtered}", tuple(values)))[0][0])
        page = f"{filtered} AND (status_ns, task_id) < (%s, %s)" if after is not None else filtered
        rows = await self.fetch(
            f"SELECT task FROM a2a_tasks WHERE {page} ORDER BY status_ns DESC, task_id DESC LIMIT %s",
            (*values, *(after or ()), limit),
        )
        return [r[0] for r in rows], total

    async def delete_a2a_task(self, task_id: str, owner: str | None) -> None:
        where, params = _owned(owner)
        await self.fetch(f"DELETE FROM a2a_tasks WHERE task_id = %s AND {where}", (task_id, *params))

    async def load_a2a_conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], int] | None:
        """A conversation's exchanges and its version."""
        rows = await self.fetch("SELECT exchanges, version FROM a2a_conversations WHERE conversation_id = %s", (conversation_id,))
        return (rows[0][0], rows[0][1]) if rows else None

    async def save_a2a_conversation(
        self, conversation_id: str, owner: str | None, context_id: str, exchanges: list[dict[str, Any]], version: int
    ) -> bool:
        """Store `exchanges` as version `version + 1` if the stored version is still `version` (0: new); False otherwise."""
        if version == 0:
            sql = (
                "INSERT INTO a2a_conversations (conversation_id, owner, context_id, version, exchanges) VALUES (%s, %s, %s, 1, %s) "
                "ON CONFLICT DO NOTHING RETURNING 1"
            )
            params: tuple[Any, ...] = (conversation_id, owner, context_id, Jsonb(exchanges))
        else:
            sql = (
                "UPDATE a2a_conversations SET version = version + 1, exchanges = %s, updated_at = now() "
                "WHERE conversation_id = %s AND version = %s RETURNING 1"
            )
            params = (Jsonb(exchanges), conversation_id, version)
        return bool(await self.fetch(sql, params))

    # -- runs: the index and the full event log ------------------------------------------------------------
    async def record_run(self, run: dict[str, Any], events: list[dict[str, Any]]) -> None:
        cols = RUN_COLUMNS
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in (*cols[1:], "events"))
        await self.fetch(
            f"INSERT INTO runs ({', '.join(cols)}, events) VALUES ({', '.join(['%s'] * (len(cols) + 1))}) "
            f"ON CONFLICT (trace_id) DO UPDATE SET {updates}",  # a session turn resumed after a hand-off records again
            (*(run[c] for c in cols), Jsonb(events)),
        )

    async def run(self, trace_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        rows = await self.fetch(f"SELECT {', '.join(RUN_COLUMNS)}, events FROM runs WHERE trace_id = %s", (trace_id,))
        if not rows:
            return None
        return dict(zip(RUN_COLUMNS, rows[0][:-1], strict=True)), rows[0][-1]

    async def run_ids(self, limit: int) -> list[str]:
        return [r[0] for r in await self.fetch("SELECT trace_id FROM runs ORDER BY started_at DESC LIMIT %s", (limit,))]

    # -- ownership of sessions, agent cards and workspaces --------------------------------------------------
    async def owner_of(self, kind: str, ident: str) -> tuple[str, list[str]] | None:
        """The owner and the read-only sharers of `kind:ident`; None when nobody owns it."""
        rows = await self.fetch("SELECT owner, readers FROM ownership WHERE kind = %s AND ident = %s", (kind, ident))
        return (rows[0][0], list(rows[0][1])) if rows else None

    async def claim_owner(self, kind: str, ident: str, sub: str) -> bool:
        """Make `sub` the owner of `kind:ident` unless someone owns it; True when `sub` owns it afterwards.

        Safe to retry: an insert that committed before the connection dropped is found as ours.
        """
        inserted = await self.fetch(
            "INSERT INTO ownership (kind, ident, owner) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING owner", (kind, ident, sub)
        )
        if inserted:
            return True
        current = await self.owner_of(kind, ident)
        return current is not None and current[0] == sub

    async def share_owned(self, kind: str, ident: str, readers: list[str]) -> None:
        await self.fetch("UPDATE ownership SET readers = %s WHERE kind = %s AND ident = %s", (sorted(set(readers)), kind, ident))

    async def drop_owner(self, kind: str, ident: str) -> None:
        await self.fetch("DELETE FROM ownership WHERE kind = %s AND ident = %s", (kind, ident))

    async def readable_by(self, kind: str, sub: str) -> list[str]:
        """Ids of `kind` that `sub` owns or that are shared with it."""
        rows = await self.fetch(
            "SELECT ident FROM ownership WHERE kind = %s AND (owner = %s OR %s = ANY(readers)) ORDER BY ident", (kind, sub, sub)
        )
        return [r[0] for r in rows]

    async def owned_ids(self, kind: str) -> set[str]:
        return {r[0] for r in await self.fetch("SELECT ident FROM ownership WHERE kind = %s", (kind,))}

    # -- audit log and counters --------------------------------------------------------------------------------
    async def append_audit(self, principal: str | None, action: str, detail: dict[str, Any], at: datetime) -> None:
        await self.fetch(
            "INSERT INTO audit_log (at, principal, action, detail) VALUES (%s, %s, %s, %s)", (at, principal, action, Jsonb(detail))
        )

    async def audit(self, principal: str | None, limit: int) -> list[tuple[datetime, str | None, str, dict[str, Any]]]:
        where, params = ("WHERE principal = %s", (principal, limit)) if principal is not None else ("", (limit,))
        rows = await self.fetch(f"SELECT at, principal, action, detail FROM audit_log {where} ORDER BY id DESC LIMIT %s", params)
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    async def add_counter(self, key: str, window_start: int, amount: int, ttl_s: float | None) -> int:
        """Add `amount` to the counter of `key` in the window starting at `window_start`; returns the new value.

        Not retried: an increment that committed before the connection dropped must not count twice.
        """
        rows = await self._once(
            "INSERT INTO counters (key, window_start, value, expires_at) "
            "VALUES (%s, %s, %s, now() + make_interval(secs => %s)) "
            "ON CONFLICT (key, window_start) DO UPDATE SET value = counters.value + EXCLUDED.value RETURNING value",
            (key, window_start, amount, ttl_s),
        )
        return int(rows[0][0])

    async def counter(self, key: str, window_start: int) -> int:
        rows = await self.fetch("SELECT value FROM counters WHERE key = %s AND window_start = %s", (key, window_start))
        return int(rows[0][0]) if rows else 0

    async def prune_counters(self) -> int:
        """Drop counters whose window has expired; returns how many."""
        rows = await self.fetch("DELETE FROM counters WHERE expires_at < now() RETURNING 1")
        return len(rows)


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    log.warning("store.retry", attempt=state.attempt_number, error=str(error)[:200])


def _owned(owner: str | None) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause selecting one owner's rows (`= NULL` matches nothing, and IS NOT DISTINCT FROM skips the index)."""
    return ("owner IS NULL", ()) if owner is None else ("owner = %s", (owner,))


def migrate(url: str) -> list[str]:
    """Create or migrate the schema to the newest version; returns the ids of the migrations applied."""
    from yoyo import get_backend, read_migrations  # imported here: only processes with a store URL need it

    backend = get_backend(yoyo_url(url))
    with resources.as_file(resources.files("reasonray.kernel") / "migrations") as path:
        migrations = read_migrations(str(path))
        with backend.lock():
            pending = backend.to_apply(migrations)
            backend.apply_migrations(pending)
    applied = [m.id for m in pending]
    if applied:
        log.info("store.migrated", applied=applied, url=redacted(url))
    return applied


def yoyo_url(url: str) -> str:
    """yoyo names psycopg 3 `postgresql+psycopg`."""
    scheme, _, rest = url.partition("://")
    return f"postgresql+psycopg://{rest}" if scheme in ("postgresql", "postgres") else url


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
