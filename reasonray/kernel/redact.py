"""Redaction for the opt-in debug logging of queries: secrets and personal data never reach the logs.

Queries are never logged by default. With `[logging] log_queries = true` and level debug, the
query is logged with e-mail addresses, API keys and secrets, long digit runs (card, account and
phone numbers) and IP addresses replaced by placeholders.
"""

from __future__ import annotations

import re

_PATTERNS = [
    (re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+"), "[email]"),
    (re.compile(r"\b(?:sk|pk|rk|ghp|xox[abp])[-_][A-Za-z0-9_-]{12,}\b"), "[secret]"),
    (re.compile(r"(?i)\b(password|passwd|secret|token|api[_-]?key)\s*[:=]\s*\S+"), r"\1=[secret]"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "[ip]"),
    (re.compile(r"(?<![\w.])\+?\d[\d -]{7,}\d\b"), "[number]"),
]


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
