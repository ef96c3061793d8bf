"""Retention of event logs: by age and by total size (the service's periodic sweep), and by date (the CLI's purge).

Event logs live at `<data_dir>/events/<UTC date>/<trace_id>.jsonl`. A file's age is its modification
time, so a run still writing is never the oldest. The sweep keeps the directories of the last two
days even when empty (a run started before midnight may still open its file there); `purge` removes
empty day directories too.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Swept:
    deleted_files: int
    deleted_bytes: int
    kept_files: int


def _logs(events_dir: Path) -> list[tuple[float, int, Path]]:
    """(modification time, size, path) of every event log, oldest first (none when there is no directory)."""
    found = []
    for path in events_dir.glob("*/*.jsonl"):
        try:
            stat = path.stat()
        except FileNotFoundError:  # deleted meanwhile (another replica's sweep)
            continue
        found.append((stat.st_mtime, stat.st_size, path))
    return sorted(found)


def _delete(logs: list[tuple[float, int, Path]]) -> tuple[int, int]:
    """Delete these event logs: the files and bytes that went (one deleted meanwhile, by another replica's sweep, is not counted)."""
    sizes = []
    for _, size, path in logs:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            sizes.append(size)
    return len(sizes), sum(sizes)


def sweep(events_dir: Path, *, max_age_days: float | None, max_total_mb: float | None, now: float | None = None) -> Swept:
    """Delete event logs older than `max_age_days`, then the oldest until the rest fit in `max_total_mb`."""
    now = time.time() if now is None else now
    logs = _logs(events_dir)
    total = sum(size for _, size, _ in logs)
    cutoff = now - max_age_days * 86400 if max_age_days is not None else None
    limit = max_total_mb * 1024 * 1024 if max_total_mb is not None else None
    doomed = 0  # the oldest logs go while they are too old or the rest too big
    for mtime, size, _ in logs:
        if not ((cutoff is not None and mtime < cutoff) or (limit is not None and total > limit)):
            break
        doomed += 1
        total -= size
    deleted_files, deleted_bytes = _delete(logs[:doomed])
    recent = {(datetime.fromtimestamp(now, UTC).date() - timedelta(days=d)).isoformat() for d in (0, 1)}
    _remove_empty_days(events_dir, keep=recent)
    if deleted_files:
        log.info("events.swept", deleted_files=deleted_files, deleted_bytes=deleted_bytes)
    return Swept(deleted_files, deleted_bytes, len(logs) - deleted_files)


def purge(events_dir: Path, before: date) -> Swept:
    """Delete the event logs of every UTC day before `before` (by directory name), and their directories."""
    doomed = []
    for entry in _logs(events_dir):
        with contextlib.suppress(ValueError):  # a directory that is not a day's is not ours to delete
            if date.fromisoformat(entry[2].parent.name) < before:
                doomed.append(entry)
    deleted_files, deleted_bytes = _delete(doomed)
    _remove_empty_days(events_dir, keep=set())
    return Swept(deleted_files, deleted_bytes, len(_logs(events_dir)))


def _remove_empty_days(events_dir: Path, keep: set[str]) -> None:
    for day in events_dir.glob("*/"):  # the directories, none when there is no events directory
        if day.name not in keep and not any(day.iterdir()):
            day.rmdir()
