"""Strategy discovery (the `reasonray.strategies` entry-point group), the enabled catalogue, and resolution.

Built-in strategies register through the same entry points a third-party package uses, so a
strategy in another installed package appears without any change here. A plugin that fails to load
is recorded in `StrategyRegistry.failures` and logged; it never takes the service down.

Resolution picks the strategy (request > agent > system default) and merges its config field by
field with the same precedence, recording which level decided each.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal, Protocol

import structlog
from pydantic import BaseModel, Field, ValidationError

from reasonray.kernel.config import ConfigError, ReasoningSettings
from reasonray.kernel.errors import StrategyUnavailableError, describe_errors
from reasonray.strategies.base import ReasoningStrategy

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "reasonray.strategies"
Level = Literal["request", "agent", "system", "default"]


class AgentDefaults(Protocol):
    """What resolution reads of an agent: its strategies, its default and its per-strategy config.
    `strategies.agents.AgentCard` is one; the cards validate against the catalogue, so they import this
    module and never the other way round."""

    @property
    def id(self) -> str: ...
    @property
    def strategies(self) -> list[str]: ...
    @property
    def default_strategy(self) -> str | None: ...
    @property
    def strategy_config(self) -> dict[str, dict[str, Any]]: ...


@dataclass(frozen=True)
class PluginFailure:
    name: str
    target: str
    error: str


class StrategyRegistry:
    """Every strategy class this process can run, by name."""

    def __init__(self) -> None:
        self.classes: dict[str, type] = {}
        self.failures: list[PluginFailure] = []

    def discover(self, found: Iterable[EntryPoint] | None = None) -> StrategyRegistry:
        """Register every strategy class of the entry-point group under its entry point's name."""
        for ep in entry_points(group=ENTRY_POINT_GROUP) if found is None else found:
            try:
                cls, name = ep.load(), ep.name
                missing = [m for m in ("reason", "get_config_schema", "get_capabilities") if not callable(getattr(cls, m, None))]
                if missing:
                    raise TypeError(f"{cls.__qualname__} does not implement ReasoningStrategy: missing {', '.join(missing)}")
                if name in self.classes and self.classes[name] is not cls:
                    raise TypeError(f"two strategies are named {name!r}: {self.classes[name].__module__} and {cls.__module__}")
                self.classes[name] = cls
            except Exception as exc:  # a broken plugin is reported, not fatal
                failure = PluginFailure(ep.name, ep.value, f"{type(exc).__name__}: {exc}")
                self.failures.append(failure)
                log.error("strategy.plugin_failed", name=ep.name, target=ep.value, error=failure.error)
        return self


class Resolution(BaseModel):
    strategy: str = Field(description="The strategy that runs.")
    agent_id: str | None = Field(None, description="The agent the request named, whose default and config applied.")
    strategy_decided_by: Literal["request", "agent", "system"] = Field(description="Which level chose the strategy.")
    config: dict[str, Any] = Field(description="The effective strategy config.")
    config_sources: dict[str, Level] = Field(description="For each config field, the level that set it.")


@dataclass
class CatalogueEntry:
    strategy: ReasoningStrategy
    defaults: dict[str, Any] = field(default_factory=dict)  # system-level config defaults

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.strategy.name,
            "description": getattr(self.strategy, "description", ""),
            "capabilities": self.strategy.get_capabilities(),
            "config_schema": self.strategy.get_config_schema(),
            "system_defaults": self.defaults,
        }


@dataclass
class Catalogue:
    """The enabled strategies, their system defaults, and the system default strategy."""

    entries: dict[str, CatalogueEntry]
    default: str | None
    installed: frozenset[str] = frozenset()

    def describe(self) -> dict[str, Any]:
        return {"default_strategy": self.default, "strategies": [e.describe() for e in self.entries.values()]}

    def _unavailable(self, message: str) -> StrategyUnavailableError:
        available = sorted(self.entries)
        hint = (
            f"available: {', '.join(available)}"
            if available
            else ("no strategies are enabled on this server; an operator enables them in [reasoning] enabled_strategies")
        )
        return StrategyUnavailableError(f"{message}; {hint}", {"available": available})

    def choose(self, requested: str | None, agent: AgentDefaults | None = None) -> tuple[str, Literal["request", "agent", "system"]]:
        if requested:
            name, level = requested, "request"
        elif agent is not None and agent.default_strategy:
            name, level = agent.default_strategy, "agent"
        elif self.default:
            name, level = self.default, "system"
        else:
            raise self._unavailable("the request names no strategy and the server has no default strategy")
        if name not in self.entries:
            why = "is installed but not enabled on this server" if name in self.installed else "is not a known strategy"
            raise self._unavailable(f"strategy {name!r} {why}")
        if agent is not None and name not in agent.strategies:
            usable = [s for s in agent.strategies if s in self.entries]
            chosen = "the request names" if level == "request" else f"the {level} default is"
            raise StrategyUnavailableError(
                f"agent {agent.id!r} does not support strategy {name!r} ({chosen} {name!r}); "
                f"the agent supports: {', '.join(usable) or 'none that are enabled'}",
                {"available": usable, "agent_id": agent.id},
            )
        return name, level

    def resolve(
        self, requested: str | None, request_config: dict[str, Any] | None = None, *, agent: AgentDefaults | None = None
    ) -> Resolution:
        name, level = self.choose(requested, agent)
        entry = self.entries[name]
        layers: list[tuple[Level, dict[str, Any]]] = [
            ("system", entry.defaults),
            ("agent", agent.strategy_config.get(name, {}) if agent is not None else {}),
            ("request", request_config or {}),
        ]
        merged = {key: value for _, values in layers for key, value in values.items()}  # later layers win
        sources: dict[str, Level] = {key: layer for layer, values in layers for key in values}
        parse = getattr(entry.strategy, "parse_config", None)
        if parse is not None:  # strategies built on `Strategy` validate and fill in their defaults
            merged = parse(merged).model_dump(mode="json")
            sources = {key: sources.get(key, "default") for key in merged}
        return Resolution(
            strategy=name,
            agent_id=agent.id if agent is not None else None,
            strategy_decided_by=level,
            config=merged,
            config_sources=sources,
        )


def _instantiate(cls: type, name: str, section: dict[str, Any]) -> CatalogueEntry:
    config_model = getattr(cls, "Config", None)
    config_fields = set(config_model.model_fields) if config_model else set()
    is_default = {k: k.startswith("default_") and k.removeprefix("default_") in config_fields for k in section}
    defaults = {k.removeprefix("default_"): v for k, v in section.items() if is_default[k]}
    rest = {k: v for k, v in section.items() if not is_default[k]}
    where = f"[reasoning.strategies.{name}]"
    if config_model is not None:
        try:
            config_model.model_validate(defaults)
        except ValidationError as exc:
            problems = "; ".join(f"default_{e['loc'][0]}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"{where}: {problems}") from None
    settings_model = getattr(cls, "Settings", None)
    if settings_model is None:
        if rest:
            raise ConfigError(f"{where}: unknown keys {sorted(rest)}; allowed: {sorted('default_' + f for f in config_fields)}")
        return CatalogueEntry(cls(), defaults)
    try:
        settings = settings_model.model_validate(rest)
    except ValidationError as exc:
        allowed = sorted([*("default_" + f for f in config_fields), *settings_model.model_fields])
        raise ConfigError(f"{where}: {describe_errors(exc)}; allowed keys: {', '.join(allowed)}") from None
    return CatalogueEntry(cls(settings), defaults)


def build_catalogue(registry: StrategyRegistry, settings: ReasoningSettings) -> Catalogue:
    """The enabled catalogue, or a ConfigError naming the key and the allowed values."""
    known = sorted(registry.classes)
    for name in [*settings.enabled_strategies, *settings.strategies]:
        if name not in registry.classes:
            broken = [f.error for f in registry.failures if f.name == name]
            detail = f" (its plugin failed to load: {broken[0]})" if broken else ""
            raise ConfigError(f"[reasoning] strategy {name!r} is not installed{detail}; installed strategies: {', '.join(known) or 'none'}")
    entries = {name: _instantiate(registry.classes[name], name, settings.strategies.get(name, {})) for name in settings.enabled_strategies}
    return Catalogue(entries=entries, default=settings.default_strategy, installed=frozenset(known))
