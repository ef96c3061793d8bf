"""Where agent cards are kept: `<data_dir>/agents.json` (in memory without a data directory), or PostgreSQL's
`agent_cards` table (`[store] url`). Synchronous like their caller, the registry (a sync actor, so
registrations never interleave).

The stores keep any card that has an id (`StoredCard`): the strategies' `AgentCard` is one, and
`open_cards` opens a store of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from reasonray.kernel.config import ConfigError
from reasonray.kernel.errors import describe_errors
from reasonray.kernel.storage import write_atomic
from reasonray.stores import cluster_store

if TYPE_CHECKING:
    from reasonray.stores.postgres import PgStore


class StoredCard(BaseModel):
    """What a card store needs of a card: its id."""

    id: str


C = TypeVar("C", bound=StoredCard)


class CardFile(BaseModel, Generic[C]):
    """`<data_dir>/agents.json`."""

    version: int = 1
    agents: list[C]


class CardStore(Protocol[C]):
    """Where cards are kept: `FileCardStore` (one JSON file) or `PgCardStore` (`[store] url`)."""

    def all(self) -> dict[str, C]: ...

    def put(self, card: C) -> None: ...

    def delete(self, card_id: str) -> None: ...


class FileCardStore(Generic[C]):
    """Every card in `<data_dir>/agents.json`, replaced atomically on every change (None: in memory only)."""

    def __init__(self, model: type[C], path: Path | None) -> None:
        self.model = model
        self.path = path
        self.cards: dict[str, C] = self._load()

    def _load(self) -> dict[str, C]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            cards = CardFile[self.model].model_validate_json(self.path.read_bytes()).agents  # type: ignore[name-defined]
        except (OSError, ValidationError) as exc:
            detail = describe_errors(exc) if isinstance(exc, ValidationError) else f"{type(exc).__name__}: {exc}"
            raise ConfigError(
                f"the agent directory {self.path} is unreadable ({detail}); fix or move the file away "
                f"(every card in it must be a valid {self.model.__name__}) and start again"
            ) from None
        return {card.id: card for card in cards}

    def all(self) -> dict[str, C]:
        return dict(self.cards)

    def put(self, card: C) -> None:
        self._replace({**self.cards, card.id: card})

    def delete(self, card_id: str) -> None:
        self._replace({i: card for i, card in self.cards.items() if i != card_id})

    def _replace(self, cards: dict[str, C]) -> None:
        if self.path is not None:  # written first: a failed write leaves the directory as it was
            write_atomic(self.path, CardFile[self.model](agents=list(cards.values())).model_dump_json(indent=2).encode())  # type: ignore[name-defined]
        self.cards = cards


@dataclass
class PgCardStore(Generic[C]):
    """The `agent_cards` table: every replica and every node reads the same cards."""

    model: type[C]
    store: PgStore

    def all(self) -> dict[str, C]:
        rows = self.store.blocking(self.store.fetch("SELECT card FROM agent_cards ORDER BY agent_id"))
        return {card.id: card for card in (self.model.model_validate(r[0]) for r in rows)}

    def put(self, card: C) -> None:
        sql = "INSERT INTO agent_cards (agent_id, card) VALUES (%s, %s) ON CONFLICT (agent_id) DO UPDATE SET card = EXCLUDED.card, updated_at = now()"
        self.store.blocking(self.store.fetch(sql, (card.id, self.store.jsonb(card.model_dump(mode="json")))))

    def delete(self, card_id: str) -> None:
        self.store.blocking(self.store.fetch("DELETE FROM agent_cards WHERE agent_id = %s", (card_id,)))


def open_cards(model: type[C], store_url: str | None, data_dir: Path | None) -> CardStore[C]:
    """PostgreSQL when a store URL is configured, else `<data_dir>/agents.json` (no data_dir: in memory)."""
    if store_url is not None:
        return PgCardStore(model, cluster_store(store_url))
    return FileCardStore(model, Path(data_dir) / "agents.json" if data_dir is not None else None)
