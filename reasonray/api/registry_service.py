"""The registry service: the enabled strategy catalogue, plugin failures, and the agent directory.

One object answers every registry question; the registry actor (`actors/registry.py`) serves it to
the replicas of an application, and in-process callers use it directly through `LocalRegistry`.
Answers are typed: the agents' `AgentCard`s themselves and small TypedDicts, which cross the actor boundary as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypedDict, TypeVar, cast

import structlog

from reasonray.kernel.config import ReasoningSettings
from reasonray.stores.agent_cards import open_cards
from reasonray.strategies.agents import AgentCard, AgentDirectory, AgentRegistration
from reasonray.strategies.registry import Catalogue, StrategyRegistry, build_catalogue

log = structlog.get_logger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


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
            # registered while enabled, disabled since: requests for them get a clear error
            if stale := [name for name in card.strategies if name not in self.catalogue.entries]:
                log.warning("agent.strategies_disabled", agent_id=card.id, strategies=stale)

    def snapshot(self) -> CatalogueSnapshot:
        return {"enabled": list(self.catalogue.entries), "default": self.catalogue.default}

    def describe(self) -> StrategiesDescription:
        """Built once: the catalogue and the plugin failures are fixed when the service starts, and each strategy's
        config schema took about a millisecond of the actor's CPU to generate, on every `reasoning.strategies`."""
        if self._described is None:
            failures = [f.__dict__ for f in self.registry.failures]
            self._described = cast(StrategiesDescription, {**self.catalogue.describe(), "plugin_failures": failures})
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


def _remote(method: Callable[Concatenate[RegistryService, P], T]) -> Callable[Concatenate[Registry, P], Coroutine[Any, Any, T]]:
    """A RegistryService method as a Registry's: the same arguments, one `_call` by its name, awaited."""

    async def call(self: Registry, /, *args: P.args, **kwargs: P.kwargs) -> T:
        result: T = await self._call(method.__name__, *args, **kwargs)
        return result

    call.__name__, call.__doc__ = method.__name__, method.__doc__
    return call


class Registry:
    """The registry as the API sees it: RegistryService's methods, awaited; each is one `_call` of the method by
    name, in this process (`LocalRegistry`) or on the registry actor (`actors.registry.RayRegistry`)."""

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    snapshot = _remote(RegistryService.snapshot)
    describe = _remote(RegistryService.describe)
    register_agent = _remote(RegistryService.register_agent)
    get_agent = _remote(RegistryService.get_agent)
    list_agents = _remote(RegistryService.list_agents)
    discover_agents = _remote(RegistryService.discover_agents)
    unregister_agent = _remote(RegistryService.unregister_agent)


class LocalRegistry(Registry):
    """`Registry` over a RegistryService in this process (tests, notebooks). Answers are copies, as an actor's
    reach their callers: a caller that edits its answer changes nobody else's."""

    def __init__(self, service: RegistryService) -> None:
        self.service = service

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return copy.deepcopy(getattr(self.service, method)(*args, **kwargs))
