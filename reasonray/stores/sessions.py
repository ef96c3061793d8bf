"""Where sessions are kept: `<data_dir>/sessions/sessions.sqlite3`, or PostgreSQL's `sessions` table (`[store] url`).

The stores keep any record that has a session id, a status and a version (`StoredSession`): the reasoner's
`SessionState` is one, and `open_sessions` opens a store of it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import structlog
from pydantic import BaseModel

from reasonray.kernel.errors import SessionStateError
from reasonray.kernel.storage import LocalDatabase
from reasonray.stores import cluster_store

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore

log = structlog.get_logger(__name__)


class StoredSession(BaseModel):
    """What a session store needs of a session: its id, its status (a column in PostgreSQL) and its stored version."""

    session_id: str
    status: str
    version: int = 0  # as stored; the store's optimistic concurrency (SessionStore)


S = TypeVar("S", bound=StoredSession)


class SessionStore(Protocol[S]):
    """Save and load session state. `save` must be atomic: a crash mid-save leaves the previous state.

    Optimistic concurrency: `load` returns the state with the `version` it was stored as; `save`
    stores `state` as `version + 1` only if the stored version is still `state.version` (0: the
    session must not exist yet), and raises SessionStateError otherwise, so two replicas that load
    the same session never interleave their turns: the later save fails and nothing of it is kept.
    Implementations: `SqliteSessionStore` and `PgSessionStore`, opened by `open_sessions`.
    """

    async def load(self, session_id: str) -> S | None: ...

    async def save(self, state: S) -> None: ...


class SqliteSessionStore(Generic[S]):
    """Sessions in `<root>/sessions.sqlite3` (one row each: the state as JSON, its version, when it was last
    written), which the processes of one machine share; survives process restarts.

    A save is one statement, so its version check and its write are atomic across the session hosts and
    replicas of the machine (SQLite's own locking: no lock file). Cluster-safe only when `root` is storage
    every node sees; a cluster should use the PostgreSQL store instead (`[store] url`). Sessions an earlier
    version kept as `<root>/<id>.json` files are imported once, when the database is made.
    """

    SWEEP_EVERY_S = 3600.0
    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS sessions (session_id TEXT PRIMARY KEY, version INTEGER NOT NULL, "
        "state TEXT NOT NULL, written_at REAL NOT NULL)",
        "CREATE INDEX IF NOT EXISTS sessions_by_age ON sessions (written_at)",
    )

    def __init__(self, model: type[S], root: Path, retention_days: float | None = None) -> None:
        self.model = model
        self.root = Path(root)
        self.path = self.root / "sessions.sqlite3"
        # sessions untouched this long are deleted ([limits] session_retention_days); None keeps them
        self.retention_s = retention_days * 86400 if retention_days else None
        self._swept_at = float("-inf")
        self._db = LocalDatabase(self.path, self.SCHEMA, on_create=self._import_files)

    def _import_files(self, db: sqlite3.Connection) -> None:
        for path in sorted(self.root.glob("*.json")):
            try:
                state = self.model.model_validate_json(path.read_bytes())
            except ValueError as exc:  # not a session an earlier version wrote: left where it is
                log.warning("sessions.import_skipped", file=str(path), error=str(exc)[:200])
                continue
            row = (state.session_id, state.version or 1, state.model_dump_json(exclude={"version"}), path.stat().st_mtime)
            db.execute("INSERT OR IGNORE INTO sessions VALUES (?, ?, ?, ?)", row)
            path.unlink()
            path.with_name(f".{path.stem}.lock").unlink(missing_ok=True)

    def sweep(self, now: float | None = None) -> int:
        """Delete the sessions not written for longer than the retention; how many went."""
        if self.retention_s is None:
            return 0
        cutoff = (time.time() if now is None else now) - self.retention_s
        gone = self._db.run(lambda db: db.execute("DELETE FROM sessions WHERE written_at < ?", (cutoff,)).rowcount)
        if gone:
            log.info("sessions.swept", deleted=gone, retention_days=self.retention_s / 86400)
        return int(gone)

    async def load(self, session_id: str) -> S | None:
        query = "SELECT state, version FROM sessions WHERE session_id = ?"
        row = await asyncio.to_thread(self._db.run, lambda db: db.execute(query, (session_id,)).fetchone())
        return None if row is None else self.model.model_validate_json(row[0]).model_copy(update={"version": row[1]})

    async def save(self, state: S) -> None:
        doc, now = state.model_dump_json(exclude={"version"}), time.time()
        if state.version == 0:  # a new session: only if no other process made it first
            statement = "INSERT INTO sessions VALUES (?, 1, ?, ?) ON CONFLICT (session_id) DO NOTHING"
            args: tuple[Any, ...] = (state.session_id, doc, now)
        else:
            statement = "UPDATE sessions SET version = version + 1, state = ?, written_at = ? WHERE session_id = ? AND version = ?"
            args = (doc, now, state.session_id, state.version)
        try:
            saved = await asyncio.to_thread(self._db.run, lambda db: db.execute(statement, args).rowcount)
        except sqlite3.OperationalError as exc:  # a full disk, an I/O error: a storage failure like any other
            raise OSError(f"session {state.session_id!r} could not be saved in {self.path}: {exc}") from exc
        if saved != 1:
            raise stale_version(state.session_id, state.version)
        if time.monotonic() - self._swept_at > self.SWEEP_EVERY_S:  # at most hourly, on the write path
            self._swept_at = time.monotonic()
            await asyncio.to_thread(self.sweep)


def stale_version(session_id: str, version: int) -> SessionStateError:
    return SessionStateError(
        f"session {session_id!r} was saved by another replica while this one worked on it (version {version} is stale); "
        "send the request again",
        {"session_id": session_id, "stale_version": version},
    )


@dataclass
class PgSessionStore(Generic[S]):
    """One row per session in the `sessions` table: the state as JSONB and its version for optimistic concurrency."""

    model: type[S]
    store: PgStore

    async def load(self, session_id: str) -> S | None:
        found = await self.row(session_id)
        return None if found is None else self.model.model_validate_json(found[0]).model_copy(update={"version": found[1]})

    async def save(self, state: S) -> None:
        """Store `state` as version `state.version + 1` if the stored version is still `state.version` (0: a new
        session). A retry after a lost connection that finds its own write already committed is a success."""
        session_id, version, doc = state.session_id, state.version, state.model_dump_json(exclude={"version"})
        if version == 0:
            sql = "INSERT INTO sessions (session_id, version, status, state) VALUES (%s, 1, %s, %s::jsonb) ON CONFLICT DO NOTHING RETURNING version"
            params: tuple[Any, ...] = (session_id, state.status, doc)
        else:
            sql = (
                "UPDATE sessions SET version = version + 1, status = %s, state = %s::jsonb, updated_at = now() "
                "WHERE session_id = %s AND version = %s RETURNING version"
            )
            params = (state.status, doc, session_id, version)
        if not await self.store.fetch(sql, params):
            current = await self.row(session_id)  # our own write, committed before the connection dropped, is no conflict
            if current is None or current[1] != version + 1 or json.loads(current[0]) != json.loads(doc):
                raise stale_version(session_id, version)

    async def row(self, session_id: str) -> tuple[str, int] | None:
        """The session's state as JSON text (parsed once, by the caller's model) and its version."""
        rows = await self.store.fetch("SELECT state::text, version FROM sessions WHERE session_id = %s", (session_id,))
        return (rows[0][0], rows[0][1]) if rows else None


def open_sessions(model: type[S], store_url: str | None, data_dir: Path, retention_days: float | None = None) -> SessionStore[S]:
    """PostgreSQL when a store URL is configured, else `<data_dir>/sessions/` (swept by `retention_days`)."""
    if store_url is None:
        return SqliteSessionStore(model, Path(data_dir) / "sessions", retention_days)
    return PgSessionStore(model, cluster_store(store_url))
