"""Where sessions are kept: files under the data directory, or PostgreSQL (`[store] url`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from reasonray.reasoner.session import LocalSessionRepository, SessionRepository, SessionState, stale_version

if TYPE_CHECKING:
    from reasonray.stores.sessions import PgSessionRows


class PgSessionRepository:
    """One row per session in the `sessions` table: the state as JSONB and its version for optimistic concurrency."""

    def __init__(self, rows: PgSessionRows) -> None:
        self.rows = rows

    async def load(self, session_id: str) -> SessionState | None:
        found = await self.rows.load(session_id)
        if found is None:
            return None
        text, version = found
        return SessionState.model_validate_json(text).model_copy(update={"version": version})

    async def save(self, state: SessionState) -> None:
        doc = state.model_dump_json(exclude={"version"})
        if await self.rows.save(state.session_id, state.status, doc, state.version) is None:
            raise stale_version(state.session_id, state.version)


def session_repository(store_url: str | None, data_dir: Path, retention_days: float | None = None) -> SessionRepository:
    """PostgreSQL when a store URL is configured, else `<data_dir>/sessions/` (swept by `retention_days`)."""
    if store_url is None:
        return LocalSessionRepository(Path(data_dir) / "sessions", retention_days)
    from reasonray.stores.postgres import pg_store  # psycopg only where a URL is configured
    from reasonray.stores.sessions import PgSessionRows

    return PgSessionRepository(PgSessionRows(pg_store(store_url)))
