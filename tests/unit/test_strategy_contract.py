"""Every installed strategy, built in or plugged in, keeps the same result and metrics contract."""

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.config import ReasoningSettings
from reasonray.strategies.registry import StrategyRegistry

INSTALLED = sorted(StrategyRegistry().discover().classes)
COMPOSES = {"matts": ["chain_of_thought"]}  # strategies that run another enabled strategy
QUERY = {"bounded_context": "[[sim think=3000 answer=391]] What is 17 * 23?"}


def test_every_strategy_the_issues_ask_for_is_installed():
    assert {"chain_of_thought", "bounded_context", "tree_of_thought", "self_consistency", "react", "refine", "matts", "step_back"} <= set(
        INSTALLED
    )


@pytest.mark.parametrize("name", INSTALLED)
async def test_result_and_metrics_contract(name):
    strategy = StrategyRegistry().discover().classes[name]()
    schema = strategy.get_config_schema()
    assert all(field.get("description") for field in schema["properties"].values()), "every config field is described"
    assert strategy.get_capabilities()[0] == f"reasoning.strategy.{name}"

    reasoning = ReasoningSettings(enabled_strategies=[name, *COMPOSES.get(name, [])], default_strategy=name)
    api = local_dispatcher(reasoning, SimulatedLLM())
    response, _ = await api.handle_payload(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "reasoning.execute",
            "params": {"query": QUERY.get(name, "What is 17 * 23?"), "include_trace": True},
        }
    )
    result = response["result"]
    assert result["answer"] == "391" and result["strategy_used"] == name
    metrics = result["metrics"]
    calls = [e for e in result["trace"] if e["type"] == "LLM_INVOCATION"]
    assert metrics["llm_calls"] == len(calls) >= 1
    assert metrics["prompt_tokens"] == sum(c["prompt_tokens"] for c in calls)
    assert metrics["completion_tokens"] == sum(c["completion_tokens"] for c in calls)
    assert metrics["total_tokens"] == metrics["prompt_tokens"] + metrics["completion_tokens"]
    assert metrics["simulated"] is True and metrics["model"] == "simulated"
    assert isinstance(metrics["strategy_specific"], dict) and metrics["execution_time_ms"] >= 0
    assert result["trace"][-1]["type"] == "RUN_END" and result["trace"][-1]["status"] == "ok"
    assert result["resolution"]["strategy"] == name and result["resolution"]["strategy_decided_by"] == "system"
