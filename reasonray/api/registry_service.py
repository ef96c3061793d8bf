"""The registry service: the enabled strategy catalogue, plugin failures, and the agent directory.

One object answers every registry question; the registry actor (`actors/registry.py`) serves it to
the replicas of an application, and in-process callers use it directly through `LocalRegistry`.
Answers are typed: the agents' `AgentCard`s themselves and small TypedDicts, which cross the actor boundary as they are.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Protocol, TypedDict

import structlog

from reasonray.kernel.config import ReasoningSettings
from reasonray.stores.agent_cards import open_cards
from reasonray.strategies.agents import AgentCard, AgentDirectory, AgentRegistration
from reasonray.strategies.registry import Catalogue, StrategyRegistry, build_catalogue

log = structlog.get_logger(__name__)


class CatalogueSnapshot(TypedDict):
    """What replicas need to serve: the enabled strategy names and the system default."""

    enabled: list[str]
    default: str | None


class StrategiesDescription(TypedDict):
    """`reasoning.strategies`: the catalogue (`Catalogue.describe`) and the plugins that failed to load."""

    default_strategy: str | None
    strategies: list[dict[str, Any]]
    plugin_failures: list[dict[str, Any]]


class RegisteredAgent(TypedDict):
    """`agent.register`: the card as stored and whether it replaced one with the same id."""

    agent: AgentCard
    replaced: bool


class RegistryService:
    def __init__(
        self, reasoning: ReasoningSettings, data_dir: Path | None, registry: StrategyRegistry | None = None, *, store_url: str | None = None
    ) -> None:
        self.registry = registry or StrategyRegistry().discover()
        self.catalogue: Catalogue = build_catalogue(self.registry, reasoning)  # ConfigError names a bad key
        self._described: StrategiesDescription | None = None
        # ConfigError names an unreadable directory file or an unreachable store
        self.agents = AgentDirectory(repository=open_cards(AgentCard, store_url, data_dir))
        for card in self.agents.cards.values():
            stale = [name for name in card.strategies if name not in self.catalogue.entries]
            if stale:  # registered while enabled, disabled since: requests for them get a clear error
                log.warning("agent.strategies_disabled", agent_id=card.id, strategies=stale)

    def snapshot(self) -> CatalogueSnapshot:
        return {"enabled": list(self.catalogue.entries), "default": self.catalogue.default}

    def describe(self) -> StrategiesDescription:
        """Built once: the catalogue and the plugin failures are fixed when the service starts, and each strategy's
        config schema took about a millisecond of the actor's CPU to generate, on every `reasoning.strategies`."""
        if self._described is None:
            catalogue = self.catalogue.describe()
            failures = [f.__dict__ for f in self.registry.failures]
            self._described = {
                "default_strategy": catalogue["default_strategy"],
                "strategies": catalogue["strategies"],
                "plugin_failures": failures,
            }
        return self._described

    def register_agent(self, registration: AgentRegistration, known_methods: list[str]) -> RegisteredAgent:
        card, replaced = self.agents.register(registration, self.catalogue, known_methods)
        return {"agent": card, "replaced": replaced}

    def get_agent(self, agent_id: str) -> AgentCard:
        return self.agents.get(agent_id)

    def list_agents(self) -> list[AgentCard]:
        return list(self.agents.cards.values())

    def discover_agents(self, capabilities: list[str]) -> list[AgentCard]:
        return self.agents.discover(capabilities)

    def unregister_agent(self, agent_id: str) -> AgentCard:
        return self.agents.unregister(agent_id)


class Registry(Protocol):
    """The registry as the API sees it: RegistryService's methods, awaited (locally or on the actor)."""

    async def describe(self) -> StrategiesDescription: ...

    async def register_agent(self, registration: AgentRegistration, known_methods: list[str]) -> RegisteredAgent: ...

    async def get_agent(self, agent_id: str) -> AgentCard: ...

    async def list_agents(self) -> list[AgentCard]: ...

    async def discover_agents(self, capabilities: list[str]) -> list[AgentCard]: ...

    async def unregister_agent(self, agent_id: str) -> AgentCard: ...


class LocalRegistry:
    """`Registry` over a RegistryService in this process (tests, notebooks). Answers are copies, as an actor's
    reach their callers: a caller that edits its answer changes nobody else's."""

    def __init__(self, service: RegistryService) -> None:
        self.service = service

    async def describe(self) -> StrategiesDescription:
        return copy.deepcopy(self.service.describe())

    async def register_agent(self, registration: AgentRegistration, known_methods: list[str]) -> RegisteredAgent:
        return self.service.register_agent(registration, known_methods)

    async def get_agent(self, agent_id: str) -> AgentCard:
        return self.service.get_agent(agent_id)

    async def list_agents(self) -> list[AgentCard]:
        return self.service.list_agents()

    async def discover_agents(self, capabilities: list[str]) -> list[AgentCard]:
        return self.service.discover_agents(capabilities)

    async def unregister_agent(self, agent_id: str) -> AgentCard:
        return self.service.unregister_agent(agent_id)
