"""The A2A agent's tasks and conversations, each record owned (its owner's `sub`, none while authentication is off).

PostgreSQL (tables `a2a_tasks` and `a2a_conversations`, `reasonray/stores/migrations/0002.a2a.sql`) with a
store URL, else tables of the same names in SQLite, `<data_dir>/sessions/a2a/a2a.sqlite3` (`open_a2a`): the
same statements on both (`reasonray.stores.sql`).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonray.kernel.storage import LocalDatabase
from reasonray.stores import cluster_store
from reasonray.stores.sql import LocalSql, Sql


@dataclass(frozen=True)
class TaskQuery:
    """Which of an owner's tasks to list: filters (None: any), the page's cursor and its size."""

    owner: str | None
    context_id: str | None = None
    state: int | None = None
    since_ns: int | None = None
    after: tuple[int, str] | None = None  # (status_ns, task_id) of the last task of the previous page
    limit: int = 100


class Repository:
    """Owned A2A records as JSON, in one set of statements, on PostgreSQL's `a2a_tasks` and `a2a_conversations` tables
    and on SQLite's of the same names (`Sql`). Every row has an owner (NULL: authentication off); each write that checks
    an owner or a version is one statement, so the database's own locking makes it atomic; listing filters,
    orders and pages in SQL instead of reading every task."""

    def __init__(self, db: Sql) -> None:
        self.db = db

    async def save_a2a_task(
        self, task_id: str, owner: str | None, context_id: str, state: int, status_ns: int, task: dict[str, Any]
    ) -> bool:
        # another owner's task stays as it was: the update's WHERE fails and nothing is returned
        rows = await self.db.fetch(
            "INSERT INTO a2a_tasks (task_id, owner, context_id, state, status_ns, task) VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (task_id) DO UPDATE SET context_id = excluded.context_id, state = excluded.state, "
            f"status_ns = excluded.status_ns, task = excluded.task{self.db.touch} "
            "WHERE a2a_tasks.owner IS NOT DISTINCT FROM excluded.owner RETURNING 1",
            (task_id, owner, context_id, state, status_ns, self.db.jsonb(task)),
        )
        return bool(rows)

    async def a2a_task(self, task_id: str, owner: str | None) -> dict[str, Any] | None:
        where, params = _owned(owner)
        rows = await self.db.fetch(f"SELECT task FROM a2a_tasks WHERE task_id = %s AND {where}", (task_id, *params))
        return self.db.loads(rows[0][0]) if rows else None

    async def a2a_tasks(self, query: TaskQuery) -> tuple[list[dict[str, Any]], int]:
        """The owner's tasks newest first (by status time, then id), from just after `after`; and how many match in all."""
        q = query
        where, params = _owned(q.owner)
        clauses, values = [where], list(params)
        for clause, value in (("context_id = %s", q.context_id), ("state = %s", q.state), ("status_ns >= %s", q.since_ns)):
            if value is not None:
                clauses.append(clause)
                values.append(value)
        filtered = " AND ".join(clauses)
        total = int((await self.db.fetch(f"SELECT count(*) FROM a2a_tasks WHERE {filtered}", tuple(values)))[0][0])
        page = f"{filtered} AND (status_ns, task_id) < (%s, %s)" if q.after is not None else filtered
        rows = await self.db.fetch(
            f"SELECT task FROM a2a_tasks WHERE {page} ORDER BY status_ns DESC, task_id DESC LIMIT %s",
            (*values, *(q.after or ()), q.limit),
        )
        return [self.db.loads(r[0]) for r in rows], total

    async def delete_a2a_task(self, task_id: str, owner: str | None) -> None:
        where, params = _owned(owner)
        await self.db.fetch(f"DELETE FROM a2a_tasks WHERE task_id = %s AND {where}", (task_id, *params))

    async def load_a2a_conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], int] | None:
        sql = "SELECT exchanges, version FROM a2a_conversations WHERE conversation_id = %s"
        rows = await self.db.fetch(sql, (conversation_id,))
        return (self.db.loads(rows[0][0]), int(rows[0][1])) if rows else None

    async def save_a2a_conversation(
        self, conversation_id: str, owner: str | None, context_id: str, exchanges: list[dict[str, Any]], version: int
    ) -> bool:
        """Saved only over the version it was loaded at (0: none stored yet); the stored version is then one more."""
        if version == 0:
            sql = (
                "INSERT INTO a2a_conversations (conversation_id, owner, context_id, version, exchanges) VALUES (%s, %s, %s, 1, %s) "
                "ON CONFLICT DO NOTHING RETURNING 1"
            )
            params: tuple[Any, ...] = (conversation_id, owner, context_id, self.db.jsonb(exchanges))
        else:
            sql = (
                f"UPDATE a2a_conversations SET version = version + 1, exchanges = %s{self.db.touch} "
                "WHERE conversation_id = %s AND version = %s RETURNING 1"
            )
            params = (self.db.jsonb(exchanges), conversation_id, version)
        return bool(await self.db.fetch(sql, params))


class SqliteRepository(Repository):
    """`<sessions>/a2a/a2a.sqlite3`, shared by the processes of one machine. Records that an earlier version kept
    as JSON files (`tasks/`, `contexts/` beside it) are imported once, when the database is made."""

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS a2a_tasks (task_id TEXT PRIMARY KEY, owner TEXT, context_id TEXT NOT NULL, "
        "state INTEGER NOT NULL, status_ns INTEGER NOT NULL, task TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS a2a_tasks_by_owner ON a2a_tasks (owner, status_ns DESC, task_id DESC)",
        "CREATE TABLE IF NOT EXISTS a2a_conversations (conversation_id TEXT PRIMARY KEY, owner TEXT, "
        "context_id TEXT NOT NULL, version INTEGER NOT NULL, exchanges TEXT NOT NULL)",
    )

    def __init__(self, sessions_dir: Path) -> None:
        self.root = Path(sessions_dir) / "a2a"
        super().__init__(LocalSql(LocalDatabase(self.root / "a2a.sqlite3", self.SCHEMA, on_create=self._import_files)))

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


def _owned(owner: str | None) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause selecting one owner's rows (`= NULL` matches nothing, and IS NOT DISTINCT FROM skips the index)."""
    return ("owner IS NULL", ()) if owner is None else ("owner = %s", (owner,))


def open_a2a(store_url: str | None, sessions_dir: Path) -> Repository:
    """PostgreSQL when a store URL is configured (as for sessions), else SQLite beside the sessions."""
    return SqliteRepository(sessions_dir) if store_url is None else Repository(cluster_store(store_url))
