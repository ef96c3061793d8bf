"""Requests refused before any method ran, recorded in the audit log (`reasonray.stores.audit`)."""

from __future__ import annotations

import structlog

from reasonray.stores.audit import ANONYMOUS, AuditLog, AuditRecord

log = structlog.get_logger(__name__)


async def audit_refusal(audit: AuditLog, *, method: str, outcome: str, reason: str, trace_id: str, principal: str | None = None) -> None:
    """Record a request refused before any method ran (no or a bad token at the gate, a route for other roles).
    An audit writer that fails is logged, never turned into a 500 for the caller."""
    try:
        await audit.write(
            AuditRecord(principal=principal or ANONYMOUS, method=method, outcome=outcome, trace_id=trace_id, reason=reason[:500])
        )
    except Exception as exc:
        log.warning("audit.write_failed", method=method, outcome=outcome, error=f"{type(exc).__name__}: {exc}"[:200])
