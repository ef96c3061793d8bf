"""Shared counters for rate limits and budgets, in fixed windows.

Synchronous, because the limiter that owns them is a sync actor whose calls must not interleave. In
`<data_dir>/counters.sqlite3` without a store URL; in PostgreSQL's `counters` table with one (`open_counters`);
in memory only for a limiter without a data directory (`MemoryCounters`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from reasonray.kernel.storage import LocalDatabase
from reasonray.stores import cluster_store

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore


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


class MemoryCounters:
    """In this process only (a limiter without a data directory: tests and scripts)."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, int], int] = {}

    def add(self, key: str, amount: int = 1, window_s: int | None = None, now: float | None = None) -> int:
        slot = (key, window_start(window_s, now))
        self._values[slot] = self._values.get(slot, 0) + amount
        return self._values[slot]

    def get(self, key: str, window_s: int | None = None, now: float | None = None) -> int:
        return self._values.get((key, window_start(window_s, now)), 0)


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


@dataclass
class PgCounters:
    """The `counters` table, from synchronous code (the limiter actor) through the store's `blocking`."""

    store: PgStore

    def add(self, key: str, amount: int = 1, window_s: int | None = None, now: float | None = None) -> int:
        # not retried: an increment that committed before the connection dropped must not count twice
        rows = self.store.blocking(
            self.store.once(
                "INSERT INTO counters (key, window_start, value, expires_at) "
                "VALUES (%s, %s, %s, now() + make_interval(secs => %s)) "
                "ON CONFLICT (key, window_start) DO UPDATE SET value = counters.value + EXCLUDED.value RETURNING value",
                (key, window_start(window_s, now), amount, window_s),
            )
        )
        return int(rows[0][0])

    def get(self, key: str, window_s: int | None = None, now: float | None = None) -> int:
        query = "SELECT value FROM counters WHERE key = %s AND window_start = %s"
        rows = self.store.blocking(self.store.fetch(query, (key, window_start(window_s, now))))
        return int(rows[0][0]) if rows else 0


def open_counters(store_url: str | None, data_dir: Path) -> Counters:
    """PostgreSQL with a store URL, else `<data_dir>/counters.sqlite3`."""
    return SqliteCounters(data_dir) if store_url is None else PgCounters(cluster_store(store_url))
