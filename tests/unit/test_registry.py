from datetime import UTC, datetime
from importlib.metadata import EntryPoint

import pytest
import structlog

from reasonray.kernel.config import ConfigError, ReasoningSettings
from reasonray.kernel.errors import InvalidParamsError, StrategyUnavailableError
from reasonray.strategies.agents import AgentCard
from reasonray.strategies.bounded_context import BoundedContext
from reasonray.strategies.chain_of_thought import ChainOfThought
from reasonray.strategies.registry import (
    ENTRY_POINT_GROUP,
    StrategyRegistry,
    build_catalogue,
)
from reasonray.strategies.self_consistency import SelfConsistency
from reasonray.strategies.tree_of_thought import TreeOfThought


def settings(**kw):
    base = {"enabled_strategies": ["chain_of_thought"], "default_strategy": "chain_of_thought"}
    return ReasoningSettings.model_validate({**base, **kw})


def test_built_in_strategies_are_discovered_through_entry_points():
    registry = StrategyRegistry().discover()
    assert registry.classes["chain_of_thought"] is ChainOfThought
    assert registry.classes["bounded_context"] is BoundedContext
    assert registry.classes["tree_of_thought"] is TreeOfThought
    assert registry.classes["self_consistency"] is SelfConsistency
    assert registry.failures == []


def test_a_broken_plugin_is_recorded_and_logged_not_raised():
    found = [
        EntryPoint("good", "reasonray.strategies.chain_of_thought:ChainOfThought", ENTRY_POINT_GROUP),
        EntryPoint("broken", "no_such_module:Strategy", ENTRY_POINT_GROUP),
        EntryPoint("not_a_strategy", "json:dumps", ENTRY_POINT_GROUP),
    ]
    with structlog.testing.capture_logs() as logs:
        registry = StrategyRegistry().discover(found)
    assert list(registry.classes) == ["good"]
    assert [f.name for f in registry.failures] == ["broken", "not_a_strategy"]
    assert "ModuleNotFoundError" in registry.failures[0].error
    assert "missing reason" in registry.failures[1].error
    assert sum(e["event"] == "strategy.plugin_failed" for e in logs) == 2


def test_enabling_an_unknown_strategy_is_a_config_error_listing_the_installed_ones():
    with pytest.raises(
        ConfigError, match=r"'tree_of_light' is not installed; installed strategies: bounded_context, chain_of_thought, .*tree_of_thought"
    ):
        build_catalogue(StrategyRegistry().discover(), settings(enabled_strategies=["tree_of_light"], default_strategy=None))


def test_strategy_section_keys_are_validated_with_their_names():
    registry = StrategyRegistry().discover()
    with pytest.raises(ConfigError, match=r"chain_of_thought\]: default_max_tokens: Input should be greater than or equal to 1"):
        build_catalogue(registry, settings(strategies={"chain_of_thought": {"default_max_tokens": 0}}))
    with pytest.raises(ConfigError, match=r"max_bogus.*allowed keys: default_max_tokens"):
        build_catalogue(registry, settings(strategies={"chain_of_thought": {"max_bogus": 1}}))


def catalogue(**kw):
    return build_catalogue(StrategyRegistry().discover(), settings(**kw))


def test_resolution_request_overrides_system_field_by_field():
    cat = catalogue(strategies={"chain_of_thought": {"default_max_tokens": 1000, "default_temperature": 0.2}})
    resolved = cat.resolve("chain_of_thought", {"temperature": 0.0})
    assert resolved.strategy_decided_by == "request"
    assert resolved.config["max_tokens"] == 1000 and resolved.config["temperature"] == 0.0
    assert resolved.config_sources["max_tokens"] == "system"
    assert resolved.config_sources["temperature"] == "request"
    assert resolved.config_sources["seed"] == "default"


def test_resolution_falls_back_to_agent_then_system():
    cat = catalogue()
    assert cat.resolve(None).strategy_decided_by == "system"
    agent = AgentCard(
        id="a1",
        name="A",
        capabilities=["reasoning.strategy.chain_of_thought"],
        default_strategy="chain_of_thought",
        strategy_config={"chain_of_thought": {"max_tokens": 64}},
        registered_at=datetime.now(UTC),
    )
    by_agent = cat.resolve(None, agent=agent)
    assert by_agent.strategy_decided_by == "agent" and by_agent.config_sources["max_tokens"] == "agent"
    assert by_agent.agent_id == "a1" and by_agent.config["max_tokens"] == 64


def test_unknown_disabled_and_missing_default_strategies_are_explained():
    cat = catalogue()
    with pytest.raises(StrategyUnavailableError, match="'tree_of_light' is not a known strategy; available: chain_of_thought"):
        cat.resolve("tree_of_light")
    cat_none = build_catalogue(StrategyRegistry().discover(), settings(enabled_strategies=[], default_strategy=None))
    with pytest.raises(StrategyUnavailableError, match="installed but not enabled") as err:
        cat_none.resolve("chain_of_thought")
    assert err.value.data["available"] == []
    with pytest.raises(StrategyUnavailableError, match="no default strategy; no strategies are enabled"):
        cat_none.resolve(None)


def test_invalid_request_config_names_the_field_and_ships_the_schema():
    with pytest.raises(InvalidParamsError, match="max_tokens: Input should be greater than or equal to 1") as err:
        catalogue().resolve("chain_of_thought", {"max_tokens": 0})
    assert err.value.data["config_schema"]["properties"]["max_tokens"]["description"]
    with pytest.raises(InvalidParamsError, match="nonsense: Extra inputs are not permitted"):
        catalogue().resolve("chain_of_thought", {"nonsense": 1})


def test_describe_lists_capabilities_and_schemas():
    described = catalogue().describe()
    assert described["default_strategy"] == "chain_of_thought"
    [entry] = described["strategies"]
    assert "reasoning.strategy.chain_of_thought" in entry["capabilities"]
    assert "max_tokens" in entry["config_schema"]["properties"]
