"""Third-party strategies: the example package is found, configured and run with no change to the core;
a broken one is reported and the rest of the service works."""

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.gateway.testing import ScriptedLLM
from reasonray.kernel.config import ConfigError, ReasoningSettings
from reasonray.strategies.registry import StrategyRegistry, build_catalogue
from tests.plugins import write_broken_plugin


def reasoning(**kw):
    return ReasoningSettings.model_validate(
        {"enabled_strategies": ["chain_of_thought", "step_back"], "default_strategy": "chain_of_thought", **kw}
    )


def test_the_example_package_is_discovered_through_its_entry_point():
    from reasonray_step_back import StepBack

    registry = StrategyRegistry().discover()
    assert registry.classes["step_back"] is StepBack
    assert StepBack.__module__ == "reasonray_step_back"  # lives outside ReasonRay's packages


async def test_the_plugin_is_configured_at_every_level_and_answers():
    llm = ScriptedLLM(
        [
            "<thinking>products</thinking><answer>Multiplication distributes over addition.</answer>",
            "<thinking>17*20 + 17*3</thinking><answer>391</answer>",
        ]
    )
    settings = reasoning(strategies={"step_back": {"default_max_tokens": 300}})
    api = local_dispatcher(settings, llm)
    response, _ = await api.handle_payload(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "reasoning.execute",
            "params": {"query": "What is 17 * 23?", "strategy": "step_back", "strategy_config": {"temperature": 0.2}},
        }
    )
    result = response["result"]
    llm.assert_complete()
    assert result["answer"] == "391" and result["strategy_used"] == "step_back"
    assert result["metrics"]["strategy_specific"]["principle"] == "Multiplication distributes over addition."
    sources = {"abstraction_prompt": "default", "max_tokens": "system", "temperature": "request"}
    # every strategy's config inherits the run-level thinking settings, a third party's too
    assert result["resolution"]["config_sources"] == {**sources, "reasoning_effort": "default", "thinking_budget": "default"}
    assert [r.max_tokens for r in llm.requests] == [300, 300] and llm.requests[1].temperature == 0.2
    assert "Principle: Multiplication distributes" in llm.requests[1].messages[1].content


def test_bad_plugin_defaults_in_config_name_the_key():
    with pytest.raises(
        ConfigError, match=r"\[reasoning.strategies.step_back\]: default_max_tokens: Input should be greater than or equal to 16"
    ):
        build_catalogue(StrategyRegistry().discover(), reasoning(strategies={"step_back": {"default_max_tokens": 1}}))


async def test_a_broken_plugin_is_reported_and_everything_else_is_served(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(write_broken_plugin(tmp_path)))
    registry = StrategyRegistry().discover()
    assert [f.name for f in registry.failures] == ["broken"]
    assert "ImportError: broken_plugin needs libfoo" in registry.failures[0].error
    api = local_dispatcher(reasoning(), ScriptedLLM(["<answer>4</answer>"]))
    described, _ = await api.handle_payload({"jsonrpc": "2.0", "id": 1, "method": "reasoning.strategies"})
    failures = described["result"]["plugin_failures"]
    assert failures == [
        {"name": "broken", "target": "broken_plugin:Broken", "error": "ImportError: broken_plugin needs libfoo, which is not installed"}
    ]
    answered, _ = await api.handle_payload({"jsonrpc": "2.0", "id": 2, "method": "reasoning.execute", "params": {"query": "2+2?"}})
    assert answered["result"]["answer"] == "4"
    with pytest.raises(
        ConfigError, match="strategy 'broken' is not installed \\(its plugin failed to load: ImportError: broken_plugin needs libfoo"
    ):
        build_catalogue(registry, reasoning(enabled_strategies=["broken"], default_strategy=None))
