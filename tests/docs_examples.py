"""Pulls the code blocks out of the README and docs so that tests run them as written."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(relative: str, language: str) -> list[str]:
    text = (REPO / relative).read_text()
    return [body for lang, body in FENCE.findall(text) if lang == language]
