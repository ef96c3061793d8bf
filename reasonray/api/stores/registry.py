"""The registry service: the enabled strategy catalogue, plugin failures, and the agent directory.

One object answers every registry question; the registry actor (`actors/registry.py`) serves it to
the replicas of an application, and in-process callers use it directly through `LocalRegistry`.
Answers are JSON-ready dicts, so they cross the actor boundary unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from reasonray.kernel.config import ReasoningSettings
from reasonray.stores.agent_cards import open_cards
from reasonray.strategies.agents import AgentCard, AgentDirectory, AgentRegistration
from reasonray.strategies.registry import Catalogue, StrategyRegistry, build_catalogue

log = structlog.get_logger(__name__)


class RegistryService:
    def __init__(
        self, reasoning: ReasoningSettings, data_dir: Path | None, registry: StrategyRegistry | None = None, *, store_url: str | None = None
    ) -> None:
        self.registry = registry or StrategyRegistry().discover()
        self.catalogue: Catalogue = build_catalogue(self.registry, reasoning)  # ConfigError names a bad key
        self._described: dict[str, Any] | None = None
        # ConfigError names an unreadable directory file or an unreachable store
        self.agents = AgentDirectory(repository=open_cards(AgentCard, store_url, data_dir))
        for card in self.agents.cards.values():
            stale = [name for name in card.strategies if name not in self.catalogue.entries]
            if stale:  # registered while enabled, disabled since: requests for them get a clear error
                log.warning("agent.strategies_disabled", agent_id=card.id, strategies=stale)

    def snapshot(self) -> dict[str, Any]:
        """What replicas need to serve: the enabled names and the system default."""
        return {"enabled": list(self.catalogue.entries), "default": self.catalogue.default}

    def describe(self) -> dict[str, Any]:
        """Built once: the catalogue and the plugin failures are fixed when the service starts, and each strategy's
        config schema took about a millisecond of the actor's CPU to generate, on every `reasoning.strategies`."""
        if self._described is None:
            self._described = {**self.catalogue.describe(), "plugin_failures": [f.__dict__ for f in self.registry.failures]}
        return self._described

    def register_agent(self, registration: dict[str, Any], known_methods: list[str]) -> dict[str, Any]:
        card, replaced = self.agents.register(AgentRegistration.model_validate(registration), self.catalogue, known_methods)
        return {"agent": card.model_dump(mode="json"), "replaced": replaced}

    def get_agent(self, agent_id: str) -> dict[str, Any]:
        return self.agents.get(agent_id).model_dump(mode="json")

    def list_agents(self) -> list[dict[str, Any]]:
        return [card.model_dump(mode="json") for card in self.agents.cards.values()]

    def discover_agents(self, capabilities: list[str]) -> list[dict[str, Any]]:
        return [card.model_dump(mode="json") for card in self.agents.discover(capabilities)]

    def unregister_agent(self, agent_id: str) -> dict[str, Any]:
        return self.agents.unregister(agent_id).model_dump(mode="json")


class Registry(Protocol):
    """The registry as the API sees it: RegistryService's methods, awaited (locally or on the actor)."""

    async def describe(self) -> dict[str, Any]: ...

    async def register_agent(self, registration: dict[str, Any], known_methods: list[str]) -> dict[str, Any]: ...

    async def get_agent(self, agent_id: str) -> dict[str, Any]: ...

    async def list_agents(self) -> list[dict[str, Any]]: ...

    async def discover_agents(self, capabilities: list[str]) -> list[dict[str, Any]]: ...

    async def unregister_agent(self, agent_id: str) -> dict[str, Any]: ...


class LocalRegistry:
    """`Registry` over a RegistryService in this process (tests, notebooks)."""

    def __init__(self, service: RegistryService) -> None:
        self.service = service

    async def describe(self) -> dict[str, Any]:
        return copy.deepcopy(self.service.describe())  # the service's answer is shared; an actor's reaches callers copied

    async def register_agent(self, registration: dict[str, Any], known_methods: list[str]) -> dict[str, Any]:
        return self.service.register_agent(registration, known_methods)

    async def get_agent(self, agent_id: str) -> dict[str, Any]:
        return self.service.get_agent(agent_id)

    async def list_agents(self) -> list[dict[str, Any]]:
        return self.service.list_agents()

    async def discover_agents(self, capabilities: list[str]) -> list[dict[str, Any]]:
        return self.service.discover_agents(capabilities)

    async def unregister_agent(self, agent_id: str) -> dict[str, Any]:
        return self.service.unregister_agent(agent_id)


def agent_lookup(registry: Registry) -> Callable[[str], Awaitable[AgentCard]]:
    """The service's AgentLookup over a registry."""

    async def lookup(agent_id: str) -> AgentCard:
        return AgentCard.model_validate(await registry.get_agent(agent_id))

    return lookup
