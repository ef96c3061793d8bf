"""Retention of event logs (reasonray.kernel.retention): the service's sweep by age and total size, and
the CLI's purge by date, on real files with set modification times."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime
from pathlib import Path

from reasonray.kernel.retention import Swept, purge, sweep

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC).timestamp()
DAY = 86400
KIB = 1024


def event_log(events: Path, day: str, name: str, *, age_s: float, size: int = 100) -> Path:
    path = events / day / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return path


def test_logs_older_than_the_age_limit_go_and_newer_ones_stay(tmp_path):
    old = event_log(tmp_path, "2026-11-14", "old", age_s=10 * DAY, size=300)
    edge = event_log(tmp_path, "2026-11-17", "edge", age_s=7 * DAY, size=200)  # exactly the limit: kept
    new = event_log(tmp_path, "2026-11-24", "new", age_s=3600, size=100)
    assert sweep(tmp_path, max_age_days=7, max_total_mb=None, now=NOW) == Swept(1, 300, 2)
    assert not old.exists() and edge.exists() and new.exists()


def test_over_the_size_limit_the_oldest_go_until_the_rest_fit(tmp_path):
    logs = [event_log(tmp_path, "2026-11-24", f"run{n}", age_s=(3 - n) * 60, size=512 * KIB) for n in range(3)]
    # 1.5 MiB against a 1 MiB limit: the oldest goes, and the two left fit exactly
    assert sweep(tmp_path, max_age_days=None, max_total_mb=1, now=NOW) == Swept(1, 512 * KIB, 2)
    assert [p.exists() for p in logs] == [False, True, True]


def test_age_and_size_limits_apply_together(tmp_path):
    stale = event_log(tmp_path, "2026-11-01", "stale", age_s=23 * DAY, size=10)
    big_old = event_log(tmp_path, "2026-11-23", "big-old", age_s=DAY, size=800 * KIB)
    big_new = event_log(tmp_path, "2026-11-24", "big-new", age_s=60, size=800 * KIB)
    assert sweep(tmp_path, max_age_days=7, max_total_mb=1, now=NOW) == Swept(2, 10 + 800 * KIB, 1)
    assert not stale.exists() and not big_old.exists() and big_new.exists()


def test_without_limits_or_logs_nothing_is_deleted(tmp_path):
    kept = event_log(tmp_path, "2020-01-01", "ancient", age_s=2000 * DAY, size=7)
    assert sweep(tmp_path, max_age_days=None, max_total_mb=None, now=NOW) == Swept(0, 0, 1)
    assert kept.exists()
    assert sweep(tmp_path / "missing", max_age_days=1, max_total_mb=1, now=NOW) == Swept(0, 0, 0)


def test_the_sweep_removes_empty_old_day_directories_but_keeps_today_and_yesterday(tmp_path):
    for day in ("2026-11-20", "2026-11-23", "2026-11-24"):
        (tmp_path / day).mkdir()
    event_log(tmp_path, "2026-11-21", "gone", age_s=3 * DAY)
    sweep(tmp_path, max_age_days=1, max_total_mb=None, now=NOW)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2026-11-23", "2026-11-24"]


def test_purge_deletes_the_days_before_the_date_with_their_directories(tmp_path):
    event_log(tmp_path, "2020-01-01", "a", age_s=0, size=10)
    event_log(tmp_path, "2020-01-02", "b", age_s=0, size=20)
    kept = event_log(tmp_path, "2020-01-03", "c", age_s=0, size=40)
    other = event_log(tmp_path, "not-a-day", "d", age_s=0, size=80)  # not a day directory: not the purge's to delete
    assert purge(tmp_path, before=date(2020, 1, 3)) == Swept(2, 30, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2020-01-03", "not-a-day"]
    assert kept.exists() and other.exists()
    assert purge(tmp_path / "missing", before=date(2020, 1, 3)) == Swept(0, 0, 0)
