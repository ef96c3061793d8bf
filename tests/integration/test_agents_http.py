"""Agents through the running service: AgentCards over JSON-RPC, the agent level of configuration,
tree-of-thought branches as Ray tasks, self-consistency, the plugin strategy, and cards that outlive
a restart of the service."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from reasonray.actors import NAMESPACE
from tests.integration.conftest import deploy, own_app, result_of, rpc

PLANNER = {
    "id": "planner",
    "name": "Planner",
    "description": "Searches before it answers.",
    "capabilities": ["reasoning.strategy.tree_of_thought", "reasoning.strategy.chain_of_thought", "domain.arithmetic"],
    "default_strategy": "tree_of_thought",
    "strategy_config": {"tree_of_thought": {"breadth": 2, "beam_width": 2, "depth": 3}},
}


@pytest.fixture(scope="module")
def agents_api(serve_base, simulator):
    """An application with every strategy enabled (the plugin too) and its own data directory."""
    strategies = ["chain_of_thought", "bounded_context", "tree_of_thought", "self_consistency", "step_back"]
    with own_app(serve_base, simulator.url, "agents", reasoning={"enabled_strategies": strategies}) as app:
        yield app


def test_an_agent_gets_its_default_is_refused_others_and_is_discovered(agents_api):
    client, _ = agents_api
    registered = result_of(rpc(client, "agent.register", PLANNER))
    assert registered["agent"]["id"] == "planner" and registered["agent"]["registered_at"]

    run = result_of(
        rpc(client, "reasoning.execute", {"query": "What is 17 * 23? [[sim slip=0.3]]", "agent_id": "planner", "include_trace": True})
    )
    assert run["answer"] == "391" and run["strategy_used"] == "tree_of_thought"
    assert run["resolution"]["strategy_decided_by"] == "agent" and run["resolution"]["agent_id"] == "planner"
    assert run["resolution"]["config"]["breadth"] == 2 and run["resolution"]["config_sources"]["breadth"] == "agent"
    assert run["resolution"]["config_sources"]["search"] == "system"  # config.toml's default_search

    refused = rpc(client, "reasoning.execute", {"query": "q", "agent_id": "planner", "strategy": "bounded_context"}).json()["error"]
    assert refused["code"] == -32002
    assert "agent 'planner' does not support strategy 'bounded_context'" in refused["message"]
    assert refused["data"]["available"] == ["tree_of_thought", "chain_of_thought"]

    found = result_of(rpc(client, "agent.discover", {"capabilities": ["reasoning.strategy.tree_of_thought", "domain.arithmetic"]}))
    assert [a["id"] for a in found["agents"]] == ["planner"]
    assert result_of(rpc(client, "agent.discover", {"capabilities": ["reasoning.strategy.bounded_context"]}))["agents"] == []


def test_tree_of_thought_branches_run_as_ray_tasks_and_the_trace_shows_the_tree(agents_api):
    client, _ = agents_api
    run = result_of(
        rpc(
            client,
            "reasoning.execute",
            {
                "query": "What is 12 * 12? [[sim slip=0.3]]",
                "strategy": "tree_of_thought",
                "strategy_config": {"breadth": 3, "beam_width": 2, "depth": 3},
                "include_trace": True,
            },
        )
    )
    assert run["answer"] == "144"
    branches = [e for e in run["trace"] if e["type"] == "BRANCH"]
    calls = [e for e in run["trace"] if e["type"] == "LLM_INVOCATION"]
    assert len(branches) == len(calls) == run["metrics"]["llm_calls"]  # every call ran in a branch
    assert {b["label"] for b in branches} == {"tree_of_thought.expand", "tree_of_thought.evaluate"}
    assert len({b["task_id"] for b in branches}) == len(branches)
    assert all(len(b["task_id"]) == 48 and int(b["task_id"], 16) for b in branches)  # Ray TaskIDs
    for pid in {b["pid"] for b in branches}:  # Ray worker processes (when they are still alive to look at)
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists():
            assert b"ray::" in cmdline.read_bytes()
    thoughts = [e for e in run["trace"] if e["type"] == "THOUGHT"]
    ids = {t["node_id"] for t in thoughts}
    assert all(t["parent_id"] in ids | {"0"} for t in thoughts)
    assert thoughts[-1]["status"] == "answer" and thoughts[-1]["text"] == "144"
    assert run["metrics"]["strategy_specific"]["nodes_evaluated"] == len({t["node_id"] for t in thoughts})


def test_self_consistency_votes_over_parallel_chains(agents_api):
    client, _ = agents_api
    run = result_of(
        rpc(
            client,
            "reasoning.execute",
            {
                "query": "What is 19 * 21? [[sim slip=0.3]]",
                "strategy": "self_consistency",
                "strategy_config": {"samples": 7},
                "include_trace": True,
            },
        )
    )
    specific = run["metrics"]["strategy_specific"]
    assert run["answer"] == "399" and sum(specific["votes"].values()) == 7
    assert specific["agreement"] == round(specific["votes"]["399"] / 7, 4)
    assert len([e for e in run["trace"] if e["type"] == "BRANCH"]) == 7


def test_the_plugin_strategy_answers_and_is_described(agents_api):
    client, _ = agents_api
    described = result_of(rpc(client, "reasoning.strategies", {}))
    step_back = next(s for s in described["strategies"] if s["name"] == "step_back")
    assert "reasoning.strategy.step_back" in step_back["capabilities"] and "max_tokens" in step_back["config_schema"]["properties"]
    run = result_of(
        rpc(client, "reasoning.execute", {"query": "What is 17 * 23?", "strategy": "step_back", "strategy_config": {"max_tokens": 200}})
    )
    assert run["answer"] == "391" and run["strategy_used"] == "step_back" and run["metrics"]["llm_calls"] == 2
    assert run["metrics"]["simulated"] is True


# slow suite: a second deployment (20-30 s of the default run); the cards' store outliving its registry is
# tests/unit/test_agents.py's, and a restart of the service over HTTP is tests/integration/test_sessions_http.py's
@pytest.mark.slow
def test_agent_cards_survive_a_restart_of_the_service(agents_api, serve_base):
    from ray import serve

    client, settings = agents_api
    result_of(rpc(client, "agent.register", {**PLANNER, "id": "survivor", "default_strategy": "chain_of_thought", "strategy_config": {}}))
    serve.delete("agents")
    ray.kill(ray.get_actor("agents-registry", namespace=NAMESPACE), no_restart=True)
    deploy(settings, "agents", "/agents")
    card = result_of(rpc(client, "agent.get", {"agent_id": "survivor"}))
    assert card["default_strategy"] == "chain_of_thought"
    run = result_of(rpc(client, "reasoning.execute", {"query": "What is 2 + 3?", "agent_id": "survivor"}))
    assert run["answer"] == "5" and run["resolution"]["strategy_decided_by"] == "agent"
    assert result_of(rpc(client, "agent.unregister", {"agent_id": "survivor"}))["unregistered"]["id"] == "survivor"
    missing = rpc(client, "agent.get", {"agent_id": "survivor"})
    assert missing.json()["error"]["code"] == -32005


def test_a_broken_plugin_in_a_ray_worker_is_reported_and_the_registry_serves(ray_cluster, tmp_path):
    from reasonray.actors.registry import StrategyRegistryActor
    from reasonray.kernel.config import ReasoningSettings
    from tests.plugins import write_broken_plugin

    plugins = write_broken_plugin(tmp_path / "plugins")
    reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought")
    actor = StrategyRegistryActor.options(runtime_env={"env_vars": {"PYTHONPATH": str(plugins)}}).remote(
        "test", reasoning.model_dump(mode="json"), str(tmp_path / "data")
    )
    described = ray.get(actor.describe.remote(), timeout=60)
    assert described["plugin_failures"] == [
        {"name": "broken", "target": "broken_plugin:Broken", "error": "ImportError: broken_plugin needs libfoo, which is not installed"}
    ]
    assert ray.get(actor.snapshot.remote()) == {"enabled": ["chain_of_thought"], "default": "chain_of_thought"}
    ray.kill(actor)
