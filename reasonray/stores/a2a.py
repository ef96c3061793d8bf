"""The A2A agent's tasks and conversations, each record owned (its owner's `sub`, none while authentication is off).

PostgreSQL (tables `a2a_tasks` and `a2a_conversations`, `reasonray/stores/migrations/0002.a2a.sql`) with a
store URL, else tables of the same names in SQLite, `<data_dir>/sessions/a2a/a2a.sqlite3` (`open_a2a`).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from reasonray.kernel.storage import LocalDatabase
from reasonray.stores import cluster_store

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore


@dataclass(frozen=True)
class TaskQuery:
    """Which of an owner's tasks to list: filters (None: any), the page's cursor and its size."""

    owner: str | None
    context_id: str | None = None
    state: int | None = None
    since_ns: int | None = None
    after: tuple[int, str] | None = None  # (status_ns, task_id) of the last task of the previous page
    limit: int = 100


class Repository(Protocol):
    """Owned A2A records as JSON: `SqliteRepository` and `PgRepository` implement it."""

    async def save_a2a_task(
        self, task_id: str, owner: str | None, context_id: str, state: int, status_ns: int, task: dict[str, Any]
    ) -> bool: ...

    async def a2a_task(self, task_id: str, owner: str | None) -> dict[str, Any] | None: ...

    async def a2a_tasks(self, query: TaskQuery) -> tuple[list[dict[str, Any]], int]:
        """The owner's tasks newest first (by status time, then id), from just after `after`; and how many match in all."""
        ...

    async def delete_a2a_task(self, task_id: str, owner: str | None) -> None: ...

    async def load_a2a_conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], int] | None: ...

    async def save_a2a_conversation(
        self, conversation_id: str, owner: str | None, context_id: str, exchanges: list[dict[str, Any]], version: int
    ) -> bool: ...


class SqliteRepository:
    """`<sessions>/a2a/a2a.sqlite3`: one table of tasks and one of conversations, shared by the processes of one
    machine. Each write that checks an owner or a version is one statement, so SQLite's own locking makes it
    atomic; listing filters, orders and pages in SQL instead of reading every task. The work runs in a thread,
    off the event loop, as a write may wait for another process's. Records that an earlier version kept as
    JSON files (`tasks/`, `contexts/` beside it) are imported once, when the database is made."""

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS a2a_tasks (task_id TEXT PRIMARY KEY, owner TEXT, context_id TEXT NOT NULL, "
        "state INTEGER NOT NULL, status_ns INTEGER NOT NULL, task TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS a2a_tasks_by_owner ON a2a_tasks (owner, status_ns DESC, task_id DESC)",
        "CREATE TABLE IF NOT EXISTS a2a_conversations (conversation_id TEXT PRIMARY KEY, owner TEXT, "
        "context_id TEXT NOT NULL, version INTEGER NOT NULL, exchanges TEXT NOT NULL)",
    )

    def __init__(self, sessions_dir: Path) -> None:
        self.root = Path(sessions_dir) / "a2a"
        self.path = self.root / "a2a.sqlite3"
        self._db = LocalDatabase(self.path, self.SCHEMA, on_create=self._import_files)

    def _import_files(self, db: sqlite3.Connection) -> None:
        for path in sorted((self.root / "tasks").glob("*.json")):
            d = json.loads(path.read_bytes())
            db.execute(
                "INSERT OR IGNORE INTO a2a_tasks VALUES (?, ?, ?, ?, ?, ?)",
                (d["task"]["id"], d["owner"], d["context_id"], d["state"], d["status_ns"], json.dumps(d["task"])),
            )
        for path in sorted((self.root / "contexts").glob("*.json")):
            d = json.loads(path.read_bytes())
            db.execute(
                "INSERT OR IGNORE INTO a2a_conversations VALUES (?, ?, ?, ?, ?)",
                (d.get("conversation_id", path.stem), d["owner"], d["context_id"], d["version"], json.dumps(d["exchanges"])),
            )

    async def save_a2a_task(
        self, task_id: str, owner: str | None, context_id: str, state: int, status_ns: int, task: dict[str, Any]
    ) -> bool:
        # another owner's task stays as it was: the update's WHERE fails and nothing is returned
        row = (task_id, owner, context_id, state, status_ns, json.dumps(task))
        saved = await asyncio.to_thread(
            self._db.run,
            lambda db: db.execute(
                "INSERT INTO a2a_tasks VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET "
                "context_id = excluded.context_id, state = excluded.state, status_ns = excluded.status_ns, task = excluded.task "
                "WHERE a2a_tasks.owner IS excluded.owner RETURNING task_id",
                row,
            ).fetchone(),
        )
        return saved is not None

    async def a2a_task(self, task_id: str, owner: str | None) -> dict[str, Any] | None:
        row = await asyncio.to_thread(
            self._db.run, lambda db: db.execute("SELECT task FROM a2a_tasks WHERE task_id = ? AND owner IS ?", (task_id, owner)).fetchone()
        )
        return json.loads(row[0]) if row is not None else None

    async def a2a_tasks(self, query: TaskQuery) -> tuple[list[dict[str, Any]], int]:
        q = query
        where = "owner IS ? AND (? IS NULL OR context_id = ?) AND (? IS NULL OR state = ?) AND (? IS NULL OR status_ns >= ?)"
        args: tuple[Any, ...] = (q.owner, q.context_id, q.context_id, q.state, q.state, q.since_ns, q.since_ns)

        def page(db: sqlite3.Connection) -> tuple[list[str], int]:
            (total,) = db.execute(f"SELECT count(*) FROM a2a_tasks WHERE {where}", args).fetchone()
            cursor = "" if q.after is None else " AND (status_ns, task_id) < (?, ?)"
            rows = db.execute(
                f"SELECT task FROM a2a_tasks WHERE {where}{cursor} ORDER BY status_ns DESC, task_id DESC LIMIT ?",
                (*args, *(q.after or ()), q.limit),
            ).fetchall()
            return [r[0] for r in rows], int(total)

        tasks, total = await asyncio.to_thread(self._db.run, page)
        return [json.loads(t) for t in tasks], total

    async def delete_a2a_task(self, task_id: str, owner: str | None) -> None:
        await asyncio.to_thread(
            self._db.run, lambda db: db.execute("DELETE FROM a2a_tasks WHERE task_id = ? AND owner IS ?", (task_id, owner))
        )

    async def load_a2a_conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], int] | None:
        row = await asyncio.to_thread(
            self._db.run,
            lambda db: db.execute(
                "SELECT exchanges, version FROM a2a_conversations WHERE conversation_id = ?", (conversation_id,)
            ).fetchone(),
        )
        return (json.loads(row[0]), int(row[1])) if row is not None else None

    async def save_a2a_conversation(
        self, conversation_id: str, owner: str | None, context_id: str, exchanges: list[dict[str, Any]], version: int
    ) -> bool:
        """Saved only over the version it was loaded at (0: none stored yet); the stored version is then one more."""
        text = json.dumps(exchanges)

        def save(db: sqlite3.Connection) -> bool:
            if version == 0:
                cursor = db.execute(
                    "INSERT OR IGNORE INTO a2a_conversations VALUES (?, ?, ?, 1, ?)", (conversation_id, owner, context_id, text)
                )
            else:
                cursor = db.execute(
                    "UPDATE a2a_conversations SET owner = ?, context_id = ?, exchanges = ?, version = version + 1 "
                    "WHERE conversation_id = ? AND version = ?",
                    (owner, context_id, text, conversation_id, version),
                )
            return cursor.rowcount == 1

        return await asyncio.to_thread(self._db.run, save)


class PgRepository:
    """The cluster store's `a2a_tasks` and `a2a_conversations` tables: every row has an owner (NULL: authentication off)."""

    def __init__(self, store: PgStore) -> None:
        self.store = store

    async def save_a2a_task(
        self, task_id: str, owner: str | None, context_id: str, state: int, status_ns: int, task: dict[str, Any]
    ) -> bool:
        rows = await self.store.fetch(
            "INSERT INTO a2a_tasks (task_id, owner, context_id, state, status_ns, task) VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (task_id) DO UPDATE SET context_id = EXCLUDED.context_id, state = EXCLUDED.state, "
            "status_ns = EXCLUDED.status_ns, task = EXCLUDED.task, updated_at = now() "
            "WHERE a2a_tasks.owner IS NOT DISTINCT FROM EXCLUDED.owner RETURNING 1",
            (task_id, owner, context_id, state, status_ns, self.store.jsonb(task)),
        )
        return bool(rows)

    async def a2a_task(self, task_id: str, owner: str | None) -> dict[str, Any] | None:
        where, params = _owned(owner)
        rows = await self.store.fetch(f"SELECT task FROM a2a_tasks WHERE task_id = %s AND {where}", (task_id, *params))
        return rows[0][0] if rows else None

    async def a2a_tasks(self, query: TaskQuery) -> tuple[list[dict[str, Any]], int]:
        q = query
        where, params = _owned(q.owner)
        clauses, values = [where], list(params)
        for clause, value in (("context_id = %s", q.context_id), ("state = %s", q.state), ("status_ns >= %s", q.since_ns)):
            if value is not None:
                clauses.append(clause)
                values.append(value)
        filtered = " AND ".join(clauses)
        total = int((await self.store.fetch(f"SELECT count(*) FROM a2a_tasks WHERE {filtered}", tuple(values)))[0][0])
        page = f"{filtered} AND (status_ns, task_id) < (%s, %s)" if q.after is not None else filtered
        rows = await self.store.fetch(
            f"SELECT task FROM a2a_tasks WHERE {page} ORDER BY status_ns DESC, task_id DESC LIMIT %s",
            (*values, *(q.after or ()), q.limit),
        )
        return [r[0] for r in rows], total

    async def delete_a2a_task(self, task_id: str, owner: str | None) -> None:
        where, params = _owned(owner)
        await self.store.fetch(f"DELETE FROM a2a_tasks WHERE task_id = %s AND {where}", (task_id, *params))

    async def load_a2a_conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], int] | None:
        sql = "SELECT exchanges, version FROM a2a_conversations WHERE conversation_id = %s"
        rows = await self.store.fetch(sql, (conversation_id,))
        return (rows[0][0], rows[0][1]) if rows else None

    async def save_a2a_conversation(
        self, conversation_id: str, owner: str | None, context_id: str, exchanges: list[dict[str, Any]], version: int
    ) -> bool:
        if version == 0:
            sql = (
                "INSERT INTO a2a_conversations (conversation_id, owner, context_id, version, exchanges) VALUES (%s, %s, %s, 1, %s) "
                "ON CONFLICT DO NOTHING RETURNING 1"
            )
            params: tuple[Any, ...] = (conversation_id, owner, context_id, self.store.jsonb(exchanges))
        else:
            sql = (
                "UPDATE a2a_conversations SET version = version + 1, exchanges = %s, updated_at = now() "
                "WHERE conversation_id = %s AND version = %s RETURNING 1"
            )
            params = (self.store.jsonb(exchanges), conversation_id, version)
        return bool(await self.store.fetch(sql, params))


def _owned(owner: str | None) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause selecting one owner's rows (`= NULL` matches nothing, and IS NOT DISTINCT FROM skips the index)."""
    return ("owner IS NULL", ()) if owner is None else ("owner = %s", (owner,))


def open_a2a(store_url: str | None, sessions_dir: Path) -> Repository:
    """PostgreSQL when a store URL is configured (as for sessions), else SQLite beside the sessions."""
    return SqliteRepository(sessions_dir) if store_url is None else PgRepository(cluster_store(store_url))
