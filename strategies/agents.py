"""AgentCards: what an agent advertises, the agent level of configuration, and where cards are kept.

An agent advertises the strategies it runs as capabilities `reasoning.strategy.<name>` (other
capabilities, such as `reasoning.parallel`, are free-form labels for discovery), the JSON-RPC
methods it supports, its own default strategy and per-strategy config. A request naming the agent
(`agent_id`) can only use the agent's strategies; the agent's default and config apply where the
request is silent (request > agent > system, `strategies.registry.Catalogue.resolve`).

`AgentDirectory` validates cards against the enabled catalogue and keeps them in an
`AgentRepository`: one JSON file under the data directory, replaced atomically on every change (a
restart finds every card and a crash mid-write leaves the previous file intact), or the
`agent_cards` table of the PostgreSQL store (`[store] url`), which every node shares.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from pydantic import (
    AwareDatetime,
    ConfigDict,
    Field,
    field_validator,
)

from reasonray.kernel.errors import InvalidParamsError, NotFoundError
from reasonray.stores.agent_cards import CardStore, FileCardStore, StoredCard

if TYPE_CHECKING:
    from reasonray.strategies.registry import Catalogue

log = structlog.get_logger(__name__)

STRATEGY_CAPABILITY = "reasoning.strategy."
REMOTE_SKILL = "a2a.skill."  # a remote A2A agent's skills, from its card (reasonray.api.a2a_remote)


def remote_strategy(agent_id: str) -> str:
    """The strategy name a run forwarded to a remote agent goes by (results, metrics, and roles' `strategies`)."""
    return f"a2a:{agent_id}"


AGENT_ID = r"^[a-z0-9][a-z0-9._-]{0,63}$"


class AgentRegistration(StoredCard):
    """An agent as it registers itself: the parameters of `agent.register`."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=AGENT_ID, description="Unique id: lower-case letters, digits, '.', '_' or '-'; at most 64.")
    name: str = Field(min_length=1, max_length=200, description="Human-readable name.")
    description: str = Field("", max_length=2000, description="What the agent is for.")
    capabilities: list[str] = Field(
        min_length=1,
        max_length=64,
        description="`reasoning.strategy.<name>` for each strategy the agent runs (at least one), plus free-form labels.",
    )
    supported_methods: list[str] = Field(["reasoning.execute"], description="JSON-RPC methods the agent can be named in.")
    default_strategy: str | None = Field(None, description="The strategy used when a request names none; one of the agent's.")
    strategy_config: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per-strategy config defaults, by strategy name; override the system's."
    )
    a2a_card_url: str | None = Field(
        None,
        pattern=r"^https?://\S+$",
        max_length=2000,
        description="A remote A2A agent's card URL (.../.well-known/agent-card.json): the card is fetched and validated at "
        "registration and its skills advertised as `a2a.skill.<id>`; reasoning.execute naming the agent is forwarded "
        "to it (docs/interop.md).",
    )

    @field_validator("capabilities")
    @classmethod
    def _well_formed(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if not v or len(v) > 128 or any(ch.isspace() for ch in v)]
        if bad:
            raise ValueError(f"capabilities must be non-empty strings without spaces, at most 128 characters: {bad}")
        return list(dict.fromkeys(values))  # order kept, duplicates dropped

    @property
    def strategies(self) -> list[str]:
        return [c.removeprefix(STRATEGY_CAPABILITY) for c in self.capabilities if c.startswith(STRATEGY_CAPABILITY)]

    @property
    def remote_skills(self) -> list[str]:
        """A remote A2A agent's skills (its `a2a.skill.<id>` capabilities)."""
        return [c.removeprefix(REMOTE_SKILL) for c in self.capabilities if c.startswith(REMOTE_SKILL)]


class AgentCard(AgentRegistration):
    """A registered agent, as `agent.get` returns it."""

    registered_at: AwareDatetime = Field(description="When the server registered this version of the card.")


def validate_card(card: AgentRegistration, catalogue: Catalogue, known_methods: list[str]) -> AgentRegistration:
    """The card, once every strategy it advertises and configures is enabled here and configured validly; else
    InvalidParamsError naming every problem and the fix."""
    enabled = sorted(catalogue.entries)
    problems: list[str] = []
    unknown = [m for m in card.supported_methods if m not in known_methods]
    methods = [f"supported_methods {unknown} are not methods of this server (known: {', '.join(known_methods)})"] if unknown else []
    if card.a2a_card_url is not None:  # a remote A2A agent (its card already fetched: `remote_skills` are its skills)
        if not card.remote_skills:
            problems.append(f"the agent's A2A card advertises no skills ({REMOTE_SKILL}<id>)")
        if card.strategies:
            problems.append(f"a remote A2A agent runs its own skills, not this server's strategies: drop {STRATEGY_CAPABILITY}*")
        if card.strategy_config:
            problems.append("strategy_config applies to this server's strategies; a remote A2A agent takes none")
        if card.default_strategy is not None and card.default_strategy not in card.remote_skills:
            problems.append(f"default_strategy {card.default_strategy!r} is not one of the remote agent's skills {card.remote_skills}")
        problems += methods
        if problems:
            raise InvalidParamsError(f"agent {card.id!r} cannot be registered: " + "; ".join(problems), {"problems": problems})
        return card
    if not card.strategies:
        problems.append(
            f"capabilities advertise no strategy; add `{STRATEGY_CAPABILITY}<name>` for one of: {', '.join(enabled) or 'none enabled'}"
        )
    for name in card.strategies:
        if name not in catalogue.entries:
            why = "is installed but not enabled on this server" if name in catalogue.installed else "is not a known strategy"
            problems.append(f"capability {STRATEGY_CAPABILITY}{name}: strategy {name!r} {why} (enabled: {', '.join(enabled) or 'none'})")
    problems += methods
    if card.default_strategy is not None and card.default_strategy not in card.strategies:
        problems.append(f"default_strategy {card.default_strategy!r} is not among the agent's strategies {card.strategies}")
    for name, values in card.strategy_config.items():
        if name not in card.strategies:
            problems.append(f"strategy_config.{name}: the agent does not advertise {STRATEGY_CAPABILITY}{name}")
        elif name in catalogue.entries and (parse := getattr(catalogue.entries[name].strategy, "parse_config", None)) is not None:
            try:  # strategies built on `Strategy` validate their config (a strategy not enabled is reported above)
                parse(values)
            except InvalidParamsError as exc:
                problems.append(f"strategy_config.{name}: {exc.message.split(': ', 1)[-1]}")
    if problems:
        raise InvalidParamsError(
            f"agent {card.id!r} cannot be registered: " + "; ".join(problems), {"problems": problems, "enabled": enabled}
        )
    return card


AgentRepository = CardStore[AgentCard]


class AgentDirectory:
    """Registered AgentCards, kept in an AgentRepository (a path or None: `FileCardStore`)."""

    def __init__(self, path: Path | None = None, repository: AgentRepository | None = None) -> None:
        self.repository = repository or FileCardStore(AgentCard, path)

    @property
    def cards(self) -> dict[str, AgentCard]:
        return self.repository.all()

    def register(self, registration: AgentRegistration, catalogue: Catalogue, known_methods: list[str]) -> tuple[AgentCard, bool]:
        """Validate and store a card; returns it as stored and whether it replaced a card with the same id."""
        valid = validate_card(registration, catalogue, known_methods)
        card = AgentCard(**valid.model_dump(), registered_at=datetime.now(UTC))
        replaced = card.id in self.cards
        self.repository.put(card)
        log.info("agent.registered", agent_id=card.id, strategies=card.strategies, replaced=replaced)
        return card, replaced

    def get(self, agent_id: str) -> AgentCard:
        cards = self.cards
        if agent_id in cards:
            return cards[agent_id]
        known = sorted(cards)
        hint = f"registered agents: {', '.join(known)}" if known else "no agents are registered; add one with agent.register"
        raise NotFoundError(f"no agent with id {agent_id!r}; {hint}", {"agent_id": agent_id, "registered": known})

    def unregister(self, agent_id: str) -> AgentCard:
        card = self.get(agent_id)
        self.repository.delete(agent_id)
        log.info("agent.unregistered", agent_id=agent_id)
        return card

    def discover(self, capabilities: list[str]) -> list[AgentCard]:
        """Agents advertising every one of `capabilities` (all of them when the list is empty)."""
        wanted = set(capabilities)
        return [card for card in self.cards.values() if wanted <= set(card.capabilities)]
