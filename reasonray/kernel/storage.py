"""Files the service keeps: atomic replacement (readers see the old content or the new, never half of either)
and SQLite databases shared by the processes of one machine."""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

_T = TypeVar("_T")


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, then rename it over `path`."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the service's data: its user's alone
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(eq=False)  # one connection each: compared and hashed by identity
class LocalDatabase:
    """One SQLite file that the processes of one machine share, behind one connection per process.

    Autocommit (each statement its own transaction, so a check-and-write in one statement is atomic across
    processes), WAL (readers never wait for the writer), a 30 s wait for another process's write lock, and the
    file its user's alone. `on_create` runs once, when the file is made (to import what an earlier version kept
    elsewhere). The connection is shared by the caller's threads under a lock."""

    path: Path
    schema: Sequence[str]
    on_create: Callable[[sqlite3.Connection], None] | None = None
    synchronous: str = "FULL"
    _db: sqlite3.Connection | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock:
            if self._db is None:
                self._db = self._open()
            return work(self._db)

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fresh = not self.path.exists()
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self.synchronous}")
        for statement in self.schema:
            db.execute(statement)
        if fresh:
            self.path.chmod(0o600)
            if self.on_create is not None:
                self.on_create(db)
        return db
