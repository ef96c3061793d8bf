"""What the session store holds, read straight from its SQLite file (`<data_dir>/sessions/sessions.sqlite3`)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any


def stored_session(sessions_dir: Path, session_id: str) -> dict[str, Any] | None:
    """The stored state of a session (as JSON), or None when the store does not hold it."""
    path = sessions_dir / "sessions.sqlite3"
    if not path.exists():
        return None
    with closing(sqlite3.connect(path)) as db:
        row = db.execute("SELECT state FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else dict(json.loads(row[0]))
