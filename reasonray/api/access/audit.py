"""The audit log: who did what (principal, method, target, outcome, trace id), behind a small repository.

`audit_log_for` picks the writer from the settings: with a cluster store (`[store] url`) every
replica on every node appends to its `audit_log` table (`StoreAuditLog`); without one,
`JsonlAuditLog` appends one JSON object a line to `<data_dir>/audit/audit.jsonl`, created 0600.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import structlog
from pydantic import BaseModel, Field

from reasonray.kernel import repositories

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
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.chmod(path, 0o600)  # an older file created with a laxer umask

    async def write(self, record: AuditRecord) -> None:
        os.write(self._fd, (json.dumps(record.model_dump(mode="json"), separators=(",", ":")) + "\n").encode())


async def audit_refusal(audit: AuditLog, *, method: str, outcome: str, reason: str, trace_id: str, principal: str | None = None) -> None:
    """Record a request refused before any method ran (no or a bad token at the gate, a route for other roles).
    An audit writer that fails is logged, never turned into a 500 for the caller."""
    try:
        await audit.write(
            AuditRecord(principal=principal or ANONYMOUS, method=method, outcome=outcome, trace_id=trace_id, reason=reason[:500])
        )
    except Exception as exc:
        log.warning("audit.write_failed", method=method, outcome=outcome, error=f"{type(exc).__name__}: {exc}"[:200])


def audit_log_path(data_dir: Path) -> Path:
    return data_dir / "audit" / "audit.jsonl"


class StoreAuditLog:
    """Writes records to the kernel's audit repository (the cluster store's `audit_log` table): `action` is the
    method, `detail` holds roles, target, outcome, trace id and reason."""

    def __init__(self, log: repositories.AuditLog) -> None:
        self.log = log

    async def write(self, record: AuditRecord) -> None:
        detail = record.model_dump(mode="json", include={"roles", "target", "outcome", "trace_id"})
        if record.reason is not None:  # failures and refusals: what the caller was told
            detail["reason"] = record.reason
        await self.log.append(repositories.AuditEntry(at=record.at, principal=record.principal, action=record.method, detail=detail))


def audit_log_for(store_url: str | None, data_dir: Path) -> AuditLog:
    """The cluster store's table with a store URL; the data directory's private JSONL file without one."""
    if store_url is not None:
        return StoreAuditLog(repositories.audit_log(store_url, data_dir))
    return JsonlAuditLog(audit_log_path(data_dir))
