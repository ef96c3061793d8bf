"""What the A2A agent stored, read straight from its SQLite file (the tests check nothing was left behind)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path


def stored_rows(sessions_dir: Path, table: str) -> int:
    """Rows of `table` (a2a_tasks, a2a_conversations) beside these sessions; 0 when nothing was ever stored."""
    path = sessions_dir / "a2a" / "a2a.sqlite3"
    if not path.exists():
        return 0
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
