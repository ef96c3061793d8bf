"""Session rows in PostgreSQL's `sessions` table: the state as JSON text, its version for optimistic concurrency.

The typed repository over them (`SessionState` in, `SessionState` out) and the SQLite one of one machine
are `reasonray.reasoner.repository` and `reasonray.reasoner.session.LocalSessionRepository`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore


class PgSessionRows:
    def __init__(self, store: PgStore) -> None:
        self.store = store

    async def load(self, session_id: str) -> tuple[str, int] | None:
        """The session's state as JSON text (parsed once, by the caller's model) and its version."""
        rows = await self.store.fetch("SELECT state::text, version FROM sessions WHERE session_id = %s", (session_id,))
        return (rows[0][0], rows[0][1]) if rows else None

    async def save(self, session_id: str, status: str, state_json: str, version: int) -> int | None:
        """Store `state_json` as version `version + 1` if the stored version is still `version` (0: a new session).

        Returns the new version, or None when another writer saved in between. A retry after a lost
        connection that finds its own write already committed is a success.
        """
        if version == 0:
            sql = "INSERT INTO sessions (session_id, version, status, state) VALUES (%s, 1, %s, %s::jsonb) ON CONFLICT DO NOTHING RETURNING version"
            params: tuple[Any, ...] = (session_id, status, state_json)
        else:
            sql = (
                "UPDATE sessions SET version = version + 1, status = %s, state = %s::jsonb, updated_at = now() "
                "WHERE session_id = %s AND version = %s RETURNING version"
            )
            params = (status, state_json, session_id, version)
        rows = await self.store.fetch(sql, params)
        if rows:
            stored: int = rows[0][0]
            return stored
        current = await self.load(session_id)
        if current is not None and current[1] == version + 1 and json.loads(current[0]) == json.loads(state_json):
            return version + 1  # our own write, committed before the connection dropped
        return None

    async def ids(self) -> list[str]:
        return [r[0] for r in await self.store.fetch("SELECT session_id FROM sessions ORDER BY session_id")]
