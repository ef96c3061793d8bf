"""docs/architecture.md's "Where is X" table names files and the names defined in them: both must exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (?P<what>[^|]+) \| `(?P<file>[^`]+)` \| `(?P<name>[^`]+)` \|$")


def rows() -> list[tuple[str, str]]:
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("### Where is X", 1)[1].split("\n## ", 1)[0]
    return [(m["file"], m["name"]) for line in section.splitlines() if (m := ROW.match(line))]


def test_the_table_has_its_rows():
    assert len(rows()) >= 15


def test_every_file_and_name_in_the_table_exists():
    missing = []
    for file, name in rows():
        path = REPO / file
        source = path.read_text() if path.is_file() else ""
        if not re.search(rf"^\s*(?:async def|def|class) {re.escape(name)}\b|^{re.escape(name)}\s*[:=]", source, re.MULTILINE):
            missing.append(f"{file}: {name}")
    assert not missing, f"docs/architecture.md names what the code no longer has: {missing}"
