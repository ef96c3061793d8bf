"""The audit log: who did what (principal, method, target, outcome, trace id), written for operators to read.

`open_audit` picks the writer from the settings: with a cluster store (`[store] url`) every replica on
every node appends to its `audit_log` table (`PgAuditLog`); without one, `JsonlAuditLog` appends one
JSON object a line to `<data_dir>/audit/audit.jsonl`, created 0600.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog
from pydantic import BaseModel, Field

from reasonray.stores import cluster_store

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore

log = structlog.get_logger(__name__)

ANONYMOUS = "anonymous"
"""The principal recorded for a caller without a valid token."""


class AuditRecord(BaseModel):
    at: datetime = Field(default_factory=lambda: datetime.now(UTC), description="When the call ended (UTC).")
    principal: str = Field(description=f"The caller's `sub`; `{ANONYMOUS}` for a caller without a valid token.")
    roles: list[str] = Field(default_factory=list, description="The roles the caller's token carried.")
    method: str = Field(description="The JSON-RPC method, or for a request refused at the gate its HTTP route (`POST /rpc`).")
    target: str | None = Field(None, description="What the call named: `session:<id>`, `agent:<id>`, `workspace:<name>`.")
    outcome: str = Field(description="`ok` or the error type (unauthenticated, forbidden, rate_limited, not_found, ...).")
    trace_id: str | None = Field(None, description="The call's trace id, as in the event log, the X-Trace-Id header and errors.")
    reason: str | None = Field(None, description="Why the call failed or was refused: the error message the caller got.")


class AuditLog(Protocol):
    async def write(self, record: AuditRecord) -> None: ...


class NoAudit:
    async def write(self, record: AuditRecord) -> None:
        return None


class JsonlAuditLog:
    """Appends records to a JSONL file only its owner can read (O_APPEND: lines of replicas do not interleave)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.chmod(path, 0o600)  # an older file created with a laxer umask

    async def write(self, record: AuditRecord) -> None:
        os.write(self._fd, (json.dumps(record.model_dump(mode="json"), separators=(",", ":")) + "\n").encode())


@dataclass
class PgAuditLog:
    """The cluster store's `audit_log` table: `action` is the method, `detail` holds roles, target, outcome,
    trace id and reason."""

    store: PgStore

    async def write(self, record: AuditRecord) -> None:
        detail = record.model_dump(mode="json", include={"roles", "target", "outcome", "trace_id"})
        if record.reason is not None:  # failures and refusals: what the caller was told
            detail["reason"] = record.reason
        await self.store.fetch(
            "INSERT INTO audit_log (at, principal, action, detail) VALUES (%s, %s, %s, %s)",
            (record.at, record.principal, record.method, self.store.jsonb(detail)),
        )


async def audit_refusal(audit: AuditLog, *, method: str, outcome: str, reason: str, trace_id: str, principal: str | None = None) -> None:
    """Record a request refused before any method ran (no or a bad token at the gate, a route for other roles).
    An audit writer that fails is logged, never turned into a 500 for the caller."""
    try:
        await audit.write(
            AuditRecord(principal=principal or ANONYMOUS, method=method, outcome=outcome, trace_id=trace_id, reason=reason[:500])
        )
    except Exception as exc:
        log.warning("audit.write_failed", method=method, outcome=outcome, error=f"{type(exc).__name__}: {exc}"[:200])


def open_audit(store_url: str | None, data_dir: Path) -> AuditLog:
    """The cluster store's table with a store URL; the data directory's private JSONL file without one."""
    return JsonlAuditLog(data_dir / "audit" / "audit.jsonl") if store_url is None else PgAuditLog(cluster_store(store_url))
