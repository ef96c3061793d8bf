"""Agent cards in PostgreSQL's `agent_cards` table, as JSON (`reasonray.strategies.agents` types them).

Synchronous like their caller, the registry (a sync actor, so registrations never interleave).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore


class PgCardRows:
    def __init__(self, store: PgStore) -> None:
        self.store = store

    def all(self) -> list[dict[str, Any]]:
        return [r[0] for r in self.store.blocking(self.store.fetch("SELECT card FROM agent_cards ORDER BY agent_id"))]

    def put(self, agent_id: str, card: dict[str, Any]) -> None:
        sql = "INSERT INTO agent_cards (agent_id, card) VALUES (%s, %s) ON CONFLICT (agent_id) DO UPDATE SET card = EXCLUDED.card, updated_at = now()"
        self.store.blocking(self.store.fetch(sql, (agent_id, self.store.jsonb(card))))

    def delete(self, agent_id: str) -> None:
        self.store.blocking(self.store.fetch("DELETE FROM agent_cards WHERE agent_id = %s", (agent_id,)))
