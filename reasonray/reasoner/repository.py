"""Where sessions are kept: files under the data directory, or PostgreSQL (`[store] url`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from reasonray.reasoner.session import LocalSessionRepository, SessionRepository, SessionState, stale_version

if TYPE_CHECKING:
    from reasonray.kernel.pgstore import PgStore


class PgSessionRepository:
    """One row per session in the `sessions` table: the state as JSONB and its version for optimistic concurrency."""

    def __init__(self, store: PgStore) -> None:
        self.store = store

    async def load(self, session_id: str) -> SessionState | None:
        found = await self.store.load_session(session_id)
        if found is None:
            return None
        text, version = found
        return SessionState.model_validate_json(text).model_copy(update={"version": version})

    async def save(self, state: SessionState) -> None:
        doc = state.model_dump_json(exclude={"version"})
        if await self.store.save_session(state.session_id, state.status, doc, state.version) is None:
            raise stale_version(state.session_id, state.version)


def session_repository(store_url: str | None, data_dir: Path, retention_days: float | None = None) -> SessionRepository:
    """PostgreSQL when a store URL is configured, else `<data_dir>/sessions/` (swept by `retention_days`)."""
    if store_url is None:
        return LocalSessionRepository(Path(data_dir) / "sessions", retention_days)
    from reasonray.kernel.pgstore import pg_store  # psycopg only where a URL is configured

    return PgSessionRepository(pg_store(store_url))
