"""The run index: every `reasoning.execute` call and session turn by trace id, with its full event log.

In `<data_dir>/runs/runs.sqlite3` without a store URL; in PostgreSQL's `runs` table with one (`open_runs`).
Async, like its callers (the reasoning service and the session pipeline).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import AwareDatetime, BaseModel, Field

from reasonray.kernel.events import read_event_log
from reasonray.kernel.storage import LocalDatabase
from reasonray.stores import cluster_store
from reasonray.stores.sql import LocalSql

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore


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
        self.db = LocalSql(LocalDatabase(self.root / "runs.sqlite3", self.SCHEMA, on_create=self._import_files, synchronous="NORMAL"))

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
        await self.db.fetch("INSERT OR REPLACE INTO runs VALUES (%s, %s, %s)", row)

    async def get(self, trace_id: str) -> tuple[RunRecord, list[dict[str, Any]]] | None:
        rows = await self.db.fetch("SELECT run, event_log FROM runs WHERE trace_id = %s", (trace_id,))
        if not rows:
            return None
        run, log_path = rows[0]
        events = read_event_log(Path(log_path)) if log_path and Path(log_path).exists() else []
        return RunRecord.model_validate_json(run), events


@dataclass
class PgRunIndex:
    """The `runs` table: the record's columns and the event log as JSONB (no file needed afterwards)."""

    COLUMNS: ClassVar = tuple(RunRecord.model_fields)  # beside the JSONB event log, in the order they are written and read

    store: PgStore

    async def record(self, run: RunRecord, event_log: Path | None) -> None:
        events = await asyncio.to_thread(read_event_log, event_log) if event_log is not None and event_log.exists() else []
        cols, row = self.COLUMNS, run.model_dump()
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in (*cols[1:], "events"))
        await self.store.fetch(
            f"INSERT INTO runs ({', '.join(cols)}, events) VALUES ({', '.join(['%s'] * (len(cols) + 1))}) "
            f"ON CONFLICT (trace_id) DO UPDATE SET {updates}",  # a session turn resumed after a hand-off records again
            (*(row[c] for c in cols), self.store.jsonb(events)),
        )

    async def get(self, trace_id: str) -> tuple[RunRecord, list[dict[str, Any]]] | None:
        rows = await self.store.fetch(f"SELECT {', '.join(self.COLUMNS)}, events FROM runs WHERE trace_id = %s", (trace_id,))
        if not rows:
            return None
        return RunRecord.model_validate(dict(zip(self.COLUMNS, rows[0][:-1], strict=True))), rows[0][-1]


def open_runs(store_url: str | None, data_dir: Path) -> RunIndex:
    """PostgreSQL with a store URL, else `<data_dir>/runs/runs.sqlite3`."""
    return SqliteRunIndex(data_dir) if store_url is None else PgRunIndex(cluster_store(store_url))
