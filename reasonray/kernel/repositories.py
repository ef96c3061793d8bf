"""Repositories for the data the kernel owns: the run index, the audit log and counters.

Each is a small Protocol with two implementations: files under the data directory (the zero-setup
default for one machine; the run index and the counters in SQLite files there) and PostgreSQL (`[store] url`, `reasonray.kernel.pgstore`), which every
node and replica of a cluster shares. `run_index`, `audit_log` and `counters` pick one from the
settings. The run index and the audit log are async (their callers, the reasoning service, the
session pipeline and the API guard, are); counters are synchronous, because the limiter that owns
them is a sync actor whose calls must not interleave. Sessions and agent cards have theirs in the layers that own them
(`reasonray.reasoner.repository`, `reasonray.strategies.agents`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import AwareDatetime, BaseModel, Field

from reasonray.kernel.events import read_event_log
from reasonray.kernel.storage import LocalDatabase

if TYPE_CHECKING:
    from reasonray.kernel.pgstore import PgStore


class RunRecord(BaseModel):
    """One run in the index: a `reasoning.execute` call or a session turn."""

    trace_id: str
    kind: Literal["execute", "session"]
    principal: str | None = Field(None, description="Who asked (the authenticated principal), when known.")
    strategy: str
    status: str = Field(description="ok, error, or awaiting_client_tools (a session turn handed to the client).")
    prompt_tokens: int
    completion_tokens: int
    started_at: AwareDatetime
    elapsed_ms: int
    error: str | None = None


class RunIndex(Protocol):
    """Runs by trace id, each with its full event log."""

    async def record(self, run: RunRecord, event_log: Path | None) -> None:
        """Index `run`; `event_log` is its JSONL file under the data directory (None: no events kept)."""

    async def get(self, trace_id: str) -> tuple[RunRecord, list[dict[str, Any]]] | None: ...


class SqliteRunIndex:
    """`<data_dir>/runs/runs.sqlite3`: the record and the path of its event log file, one row per run.

    One insert per run (synchronous=NORMAL: durable at the WAL's checkpoint), where a file per run with its own
    fsync cost a replica a tenth of its CPU under load; records an earlier version kept as
    `runs/<trace_id>.json` files are imported once."""

    SCHEMA = ("CREATE TABLE IF NOT EXISTS runs (trace_id TEXT PRIMARY KEY, run TEXT NOT NULL, event_log TEXT)",)

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "runs"
        self._db = LocalDatabase(self.root / "runs.sqlite3", self.SCHEMA, on_create=self._import_files, synchronous="NORMAL")

    def _import_files(self, db: sqlite3.Connection) -> None:
        for path in sorted(self.root.glob("*.json")):
            try:
                doc = json.loads(path.read_bytes())
                row = (doc["run"]["trace_id"], json.dumps(doc["run"]), doc.get("event_log"))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # unreadable: left where it is
            db.execute("INSERT OR IGNORE INTO runs VALUES (?, ?, ?)", row)
            path.unlink()

    async def record(self, run: RunRecord, event_log: Path | None) -> None:
        row = (run.trace_id, run.model_dump_json(), str(event_log) if event_log else None)
        # off the event loop: another process may hold the write lock for a moment
        await asyncio.to_thread(self._db.run, lambda db: db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?)", row))

    async def get(self, trace_id: str) -> tuple[RunRecord, list[dict[str, Any]]] | None:
        def read(db: sqlite3.Connection) -> tuple[str, str | None] | None:
            row = db.execute("SELECT run, event_log FROM runs WHERE trace_id = ?", (trace_id,)).fetchone()
            return (row[0], row[1]) if row else None

        found = await asyncio.to_thread(self._db.run, read)
        if found is None:
            return None
        log_path = Path(found[1]) if found[1] else None
        events = read_event_log(log_path) if log_path is not None and log_path.exists() else []
        return RunRecord.model_validate_json(found[0]), events


class PgRunIndex:
    """The `runs` table: the record's columns and the event log as JSONB (no file needed afterwards)."""

    def __init__(self, store: PgStore) -> None:
        self.store = store

    async def record(self, run: RunRecord, event_log: Path | None) -> None:
        events = await asyncio.to_thread(read_event_log, event_log) if event_log is not None and event_log.exists() else []
        await self.store.record_run(run.model_dump(), events)

    async def get(self, trace_id: str) -> tuple[RunRecord, list[dict[str, Any]]] | None:
        found = await self.store.run(trace_id)
        return (RunRecord.model_validate(found[0]), found[1]) if found else None


class AuditEntry(BaseModel):
    at: AwareDatetime
    principal: str | None = None
    action: str = Field(description="What was done, e.g. 'agent.register' or 'auth.denied'.")
    detail: dict[str, Any] = Field(default_factory=dict)


class AuditLog(Protocol):
    """Append-only record of who did what; newest first when read."""

    async def append(self, entry: AuditEntry) -> None: ...

    async def recent(self, principal: str | None = None, limit: int = 100) -> list[AuditEntry]: ...


class FileAuditLog:
    """`<data_dir>/audit.jsonl`, one line per entry (each a single O_APPEND write, so lines never interleave)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "audit.jsonl"

    async def append(self, entry: AuditEntry) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, entry.model_dump_json().encode() + b"\n")
        finally:
            os.close(fd)

    async def recent(self, principal: str | None = None, limit: int = 100) -> list[AuditEntry]:
        if not self.path.exists():
            return []
        entries = [AuditEntry.model_validate_json(line) for line in self.path.read_bytes().splitlines() if line]
        return [e for e in reversed(entries) if principal is None or e.principal == principal][:limit]


class PgAuditLog:
    def __init__(self, store: PgStore) -> None:
        self.store = store

    async def append(self, entry: AuditEntry) -> None:
        await self.store.append_audit(entry.principal, entry.action, entry.detail, entry.at)

    async def recent(self, principal: str | None = None, limit: int = 100) -> list[AuditEntry]:
        return [AuditEntry(at=at, principal=p, action=a, detail=d) for at, p, a, d in await self.store.audit(principal, limit)]


class Counters(Protocol):
    """Shared counters for rate limits and budgets: fixed windows of `window_s` seconds (None: one window, forever)."""

    def add(self, key: str, amount: int = 1, window_s: int | None = None, now: float | None = None) -> int:
        """Add `amount` to `key`'s current window; returns the window's total after the addition."""

    def get(self, key: str, window_s: int | None = None, now: float | None = None) -> int: ...


def window_start(window_s: int | None, now: float | None) -> int:
    if window_s is None:
        return 0
    t = time.time() if now is None else now
    return int(t // window_s) * window_s


class SqliteCounters:
    """`<data_dir>/counters.sqlite3`: the processes of one machine share it, and SQLite's own locking makes each
    addition one atomic statement (no lock file, no rewrite of every counter per charge)."""

    PRUNE_EVERY_S = 60.0  # ended windows are deleted at most this often

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "counters.sqlite3"
        schema = (
            "CREATE TABLE IF NOT EXISTS counters "
            "(key TEXT PRIMARY KEY, window_start INTEGER NOT NULL, value INTEGER NOT NULL, expires REAL NOT NULL)",
        )
        # synchronous=NORMAL: durable at each WAL checkpoint; a power loss forgets at most the last charges
        self._db = LocalDatabase(self.path, schema, on_create=self._import_json, synchronous="NORMAL")
        self._pruned_at = 0.0

    def _import_json(self, db: sqlite3.Connection) -> None:
        """Counters an earlier version kept in `counters.json` carry over once (budgets mid-window stay charged)."""
        old = self.path.with_name("counters.json")
        if not old.exists():
            return
        rows = [(k, v["window_start"], v["value"], v.get("expires", time.time() + 10**9)) for k, v in json.loads(old.read_bytes()).items()]
        db.executemany("INSERT OR IGNORE INTO counters VALUES (?, ?, ?, ?)", rows)
        old.unlink()
        old.with_suffix(".lock").unlink(missing_ok=True)

    def add(self, key: str, amount: int = 1, window_s: int | None = None, now: float | None = None) -> int:
        start = window_start(window_s, now)
        t = time.time() if now is None else now
        expires = start + window_s if window_s else t + 10**9

        def charge(db: sqlite3.Connection) -> int:
            # the SET expressions read the row as it was: another window's value starts again from this amount
            (value,) = db.execute(
                "INSERT INTO counters VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                "value = CASE WHEN window_start = excluded.window_start THEN value + excluded.value ELSE excluded.value END, "
                "window_start = excluded.window_start, expires = excluded.expires RETURNING value",
                (key, start, amount, expires),
            ).fetchone()
            if t - self._pruned_at >= self.PRUNE_EVERY_S or t < self._pruned_at:
                db.execute("DELETE FROM counters WHERE expires <= ?", (t,))
                self._pruned_at = t
            return int(value)

        return self._db.run(charge)

    def get(self, key: str, window_s: int | None = None, now: float | None = None) -> int:
        start = window_start(window_s, now)
        query = "SELECT value FROM counters WHERE key = ? AND window_start = ?"
        row = self._db.run(lambda db: db.execute(query, (key, start)).fetchone())
        return int(row[0]) if row else 0


class PgCounters:
    """The `counters` table, from synchronous code (the limiter actor) through the store's `blocking`."""

    def __init__(self, store: PgStore) -> None:
        self.store = store

    def add(self, key: str, amount: int = 1, window_s: int | None = None, now: float | None = None) -> int:
        return self.store.blocking(self.store.add_counter(key, window_start(window_s, now), amount, window_s))

    def get(self, key: str, window_s: int | None = None, now: float | None = None) -> int:
        return self.store.blocking(self.store.counter(key, window_start(window_s, now)))


def _store(url: str | None) -> PgStore | None:
    if url is None:
        return None
    from reasonray.kernel.pgstore import pg_store  # psycopg only where a URL is configured

    return pg_store(url)


def run_index(store_url: str | None, data_dir: Path) -> RunIndex:
    store = _store(store_url)
    return PgRunIndex(store) if store is not None else SqliteRunIndex(data_dir)


def audit_log(store_url: str | None, data_dir: Path) -> AuditLog:
    store = _store(store_url)
    return PgAuditLog(store) if store is not None else FileAuditLog(data_dir)


def counters(store_url: str | None, data_dir: Path) -> Counters:
    store = _store(store_url)
    return PgCounters(store) if store is not None else SqliteCounters(data_dir)
