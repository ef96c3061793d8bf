"""AgentCards: validation, the directory on disk, three-level resolution and the agent.* methods in-process."""

import json
import os

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.api.registry_service import RegistryService
from reasonray.gateway.testing import FunctionLLM
from reasonray.kernel.config import ConfigError, ReasoningSettings
from reasonray.kernel.errors import InvalidParamsError, NotFoundError
from reasonray.strategies.agents import AgentDirectory, AgentRegistration
from reasonray.strategies.registry import StrategyRegistry, build_catalogue

METHODS = ["agent.register", "reasoning.execute"]


def reasoning(**kw):
    base = {
        "enabled_strategies": ["chain_of_thought", "tree_of_thought", "bounded_context"],
        "default_strategy": "chain_of_thought",
        "strategies": {"chain_of_thought": {"default_max_tokens": 512, "default_temperature": 0.1}},
    }
    return ReasoningSettings.model_validate({**base, **kw})


@pytest.fixture
def catalogue():
    return build_catalogue(StrategyRegistry().discover(), reasoning())


def card(**kw):
    base = {
        "id": "planner",
        "name": "Planner",
        "capabilities": ["reasoning.strategy.tree_of_thought", "reasoning.strategy.chain_of_thought", "domain.math"],
        "default_strategy": "tree_of_thought",
        "strategy_config": {"tree_of_thought": {"breadth": 2, "depth": 2}},
    }
    return AgentRegistration.model_validate({**base, **kw})


def test_a_valid_card_is_stored_and_survives_a_restart(tmp_path, catalogue):
    path = tmp_path / "agents.json"
    stored, replaced = AgentDirectory(path).register(card(), catalogue, METHODS)
    assert not replaced and stored.registered_at.tzinfo is not None
    reopened = AgentDirectory(path)
    assert reopened.get("planner") == stored
    assert reopened.get("planner").strategies == ["tree_of_thought", "chain_of_thought"]
    _, replaced = reopened.register(card(name="Planner v2"), catalogue, METHODS)
    assert replaced and AgentDirectory(path).get("planner").name == "Planner v2"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"capabilities": ["domain.math"]}, "capabilities advertise no strategy; add `reasoning.strategy.<name>`"),
        (
            {"capabilities": ["reasoning.strategy.self_consistency"], "default_strategy": None, "strategy_config": {}},
            "'self_consistency' is installed but not enabled on this server",
        ),
        (
            {"capabilities": ["reasoning.strategy.tree_of_light"], "default_strategy": None, "strategy_config": {}},
            "'tree_of_light' is not a known strategy",
        ),
        ({"default_strategy": "bounded_context"}, "default_strategy 'bounded_context' is not among the agent's strategies"),
        (
            {"strategy_config": {"tree_of_thought": {"breadth": 99}}},
            r"strategy_config.tree_of_thought: breadth: Input should be less than or equal to 8",
        ),
        ({"strategy_config": {"bounded_context": {}}}, "strategy_config.bounded_context: the agent does not advertise"),
        ({"supported_methods": ["reasoning.teleport"]}, r"supported_methods \['reasoning.teleport'\] are not methods of this server"),
    ],
)
def test_an_invalid_card_is_refused_with_every_problem_named(tmp_path, catalogue, changes, message):
    directory = AgentDirectory(tmp_path / "agents.json")
    with pytest.raises(InvalidParamsError, match=message) as err:
        directory.register(card(**changes), catalogue, METHODS)
    assert err.value.data["enabled"] == ["bounded_context", "chain_of_thought", "tree_of_thought"]
    assert directory.cards == {} and not (tmp_path / "agents.json").exists()


def test_malformed_cards_fail_validation_before_the_directory():
    with pytest.raises(ValueError, match="id"):
        AgentRegistration(id="Not Valid!", name="x", capabilities=["reasoning.strategy.chain_of_thought"])
    with pytest.raises(ValueError, match="without spaces"):
        AgentRegistration(id="ok", name="x", capabilities=["reasoning strategy"])


def test_a_failed_write_keeps_the_old_file_and_the_old_state(tmp_path, catalogue, monkeypatch):
    path = tmp_path / "agents.json"
    directory = AgentDirectory(path)
    directory.register(card(), catalogue, METHODS)
    before = path.read_text()

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        directory.register(card(id="second"), catalogue, METHODS)
    with pytest.raises(OSError):
        directory.unregister("planner")
    assert path.read_text() == before
    assert list(directory.cards) == ["planner"]
    assert [p.name for p in tmp_path.iterdir()] == ["agents.json"]  # no temporary files left behind


def test_an_unreadable_directory_file_stops_start_up_naming_the_file(tmp_path):
    path = tmp_path / "agents.json"
    path.write_text('{"version": 1, "agents": [{"id": "x"}]}')
    with pytest.raises(ConfigError, match=f"the agent directory {path} is unreadable .*agents.0.name"):
        AgentDirectory(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="Invalid JSON"):
        AgentDirectory(path)


def test_discover_is_all_of_and_unregister_forgets(tmp_path, catalogue):
    directory = AgentDirectory(tmp_path / "agents.json")
    directory.register(card(), catalogue, METHODS)
    directory.register(
        card(id="cot-only", capabilities=["reasoning.strategy.chain_of_thought"], default_strategy=None, strategy_config={}),
        catalogue,
        METHODS,
    )
    ids = lambda caps: [c.id for c in directory.discover(caps)]
    assert ids([]) == ["planner", "cot-only"]
    assert ids(["reasoning.strategy.chain_of_thought"]) == ["planner", "cot-only"]
    assert ids(["reasoning.strategy.chain_of_thought", "domain.math"]) == ["planner"]
    assert ids(["reasoning.strategy.chain_of_thought", "domain.poetry"]) == []
    directory.unregister("planner")
    with pytest.raises(NotFoundError, match="no agent with id 'planner'; registered agents: cot-only"):
        directory.get("planner")
    assert [c["id"] for c in json.loads((tmp_path / "agents.json").read_text())["agents"]] == ["cot-only"]


# -- through the JSON-RPC API, in-process ----------------------------------------------------


def answering_llm():
    return FunctionLLM(lambda req: "<thinking>easy</thinking><answer>4</answer>" if len(req.messages) else "")


async def rpc(dispatcher, method, params):
    response, _ = await dispatcher.handle_payload({"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
    return response


@pytest.fixture
def api(tmp_path):
    return local_dispatcher(reasoning(), answering_llm(), data_dir=tmp_path)


async def test_agent_methods_round_trip(api):
    registered = await rpc(api, "agent.register", card().model_dump())
    assert registered["result"]["replaced"] is False
    assert registered["result"]["agent"]["strategy_config"] == {"tree_of_thought": {"breadth": 2, "depth": 2}}
    got = await rpc(api, "agent.get", {"agent_id": "planner"})
    assert got["result"]["name"] == "Planner"
    listed = await rpc(api, "agent.list", {})
    assert [a["id"] for a in listed["result"]["agents"]] == ["planner"]
    found = await rpc(api, "agent.discover", {"capabilities": ["domain.math"]})
    assert [a["id"] for a in found["result"]["agents"]] == ["planner"]
    gone = await rpc(api, "agent.unregister", {"agent_id": "planner"})
    assert gone["result"]["unregistered"]["id"] == "planner"
    missing = await rpc(api, "agent.get", {"agent_id": "planner"})
    assert missing["error"]["code"] == -32005 and missing["error"]["data"]["error_type"] == "not_found"
    assert "no agents are registered; add one with agent.register" in missing["error"]["message"]


async def test_registration_errors_are_invalid_params(api):
    bad = await rpc(
        api,
        "agent.register",
        card(capabilities=["reasoning.strategy.tree_of_light"], default_strategy=None, strategy_config={}).model_dump(),
    )
    assert bad["error"]["code"] == -32602
    assert "'tree_of_light' is not a known strategy" in bad["error"]["message"]
    malformed = await rpc(api, "agent.register", {"id": "x", "name": "x"})
    assert malformed["error"]["code"] == -32602 and "capabilities: Field required" in malformed["error"]["message"]


async def test_three_levels_decide_strategy_and_each_config_field(api):
    await rpc(
        api,
        "agent.register",
        card(
            capabilities=["reasoning.strategy.chain_of_thought", "reasoning.strategy.tree_of_thought"],
            default_strategy="chain_of_thought",
            strategy_config={"chain_of_thought": {"max_tokens": 128}},
        ).model_dump(),
    )
    result = (await rpc(api, "reasoning.execute", {"query": "2+2?", "agent_id": "planner", "strategy_config": {"seed": 7}}))["result"]
    resolution = result["resolution"]
    assert resolution["strategy"] == "chain_of_thought" and resolution["strategy_decided_by"] == "agent"
    assert resolution["agent_id"] == "planner"
    assert resolution["config"]["max_tokens"] == 128 and resolution["config_sources"]["max_tokens"] == "agent"
    assert resolution["config"]["temperature"] == 0.1 and resolution["config_sources"]["temperature"] == "system"
    assert resolution["config"]["seed"] == 7 and resolution["config_sources"]["seed"] == "request"
    assert resolution["config_sources"]["system_prompt"] == "default"
    no_agent = (await rpc(api, "reasoning.execute", {"query": "2+2?"}))["result"]["resolution"]
    assert no_agent["strategy_decided_by"] == "system" and no_agent["config"]["max_tokens"] == 512


async def test_an_agent_is_refused_strategies_it_does_not_advertise(api):
    await rpc(api, "agent.register", card().model_dump())
    refused = await rpc(api, "reasoning.execute", {"query": "2+2?", "agent_id": "planner", "strategy": "bounded_context"})
    error = refused["error"]
    assert error["code"] == -32002
    assert error["message"] == (
        "agent 'planner' does not support strategy 'bounded_context' (the request names 'bounded_context'); "
        "the agent supports: tree_of_thought, chain_of_thought"
    )
    assert error["data"]["available"] == ["tree_of_thought", "chain_of_thought"]
    unknown = await rpc(api, "reasoning.execute", {"query": "2+2?", "agent_id": "nobody"})
    assert unknown["error"]["code"] == -32005 and unknown["error"]["data"]["registered"] == ["planner"]


async def test_an_agent_without_a_default_must_support_the_system_default(api):
    await rpc(
        api,
        "agent.register",
        card(capabilities=["reasoning.strategy.tree_of_thought"], default_strategy=None, strategy_config={}).model_dump(),
    )
    refused = await rpc(api, "reasoning.execute", {"query": "2+2?", "agent_id": "planner"})
    assert refused["error"]["code"] == -32002
    assert "(the system default is 'chain_of_thought')" in refused["error"]["message"]


async def test_an_agent_that_does_not_serve_execute_is_refused(api):
    await rpc(api, "agent.register", card(supported_methods=["agent.register"]).model_dump())
    refused = await rpc(api, "reasoning.execute", {"query": "2+2?", "agent_id": "planner"})
    assert refused["error"]["code"] == -32602
    assert "does not support reasoning.execute" in refused["error"]["message"]


def test_zero_enabled_strategies_is_a_valid_server_that_refuses_agents(tmp_path):
    service = RegistryService(reasoning(enabled_strategies=[], default_strategy=None, strategies={}), tmp_path)
    assert service.snapshot() == {"enabled": [], "default": None}
    with pytest.raises(InvalidParamsError, match="enabled: none"):
        service.register_agent(card(default_strategy=None, strategy_config={}), METHODS)


def test_cards_whose_strategies_were_disabled_since_are_kept_and_logged(tmp_path):
    RegistryService(reasoning(), tmp_path).register_agent(card(), METHODS)
    import structlog

    with structlog.testing.capture_logs() as logs:
        service = RegistryService(reasoning(enabled_strategies=["chain_of_thought"]), tmp_path)
    assert service.get_agent("planner").id == "planner"
    assert any(e["event"] == "agent.strategies_disabled" and e["strategies"] == ["tree_of_thought"] for e in logs)


def test_a_remote_agent_carries_its_a2a_card_url_and_its_skills_through_discover(tmp_path, catalogue):
    directory = AgentDirectory(tmp_path / "agents.json")
    url = "https://planner.example/.well-known/agent-card.json"
    # as agent.register stores it once the card was fetched: its skills, not local strategies (tests/unit/test_a2a.py)
    remote = card(a2a_card_url=url, capabilities=["a2a.skill.plan", "domain.math"], default_strategy="plan", strategy_config={})
    directory.register(remote, catalogue, METHODS)
    [found] = AgentDirectory(tmp_path / "agents.json").discover(["a2a.skill.plan"])
    assert found.a2a_card_url == url and found.model_dump(mode="json")["a2a_card_url"] == url and found.remote_skills == ["plan"]
    with pytest.raises(InvalidParamsError, match="not this server's strategies"):
        directory.register(card(a2a_card_url=url), catalogue, METHODS)
    with pytest.raises(ValueError, match="a2a_card_url"):
        card(a2a_card_url="not a url")


async def test_the_strategies_description_is_built_once_and_each_in_process_caller_gets_its_own_copy(tmp_path, monkeypatch):
    from reasonray.api.registry_service import LocalRegistry

    service = RegistryService(reasoning(), tmp_path)
    built = []
    describe = service.catalogue.describe
    monkeypatch.setattr(service.catalogue, "describe", lambda: built.append(1) or describe())
    registry = LocalRegistry(service)
    first = await registry.describe()
    first["strategies"].clear()  # a caller that edits its answer changes nobody else's
    second = await registry.describe()
    assert second["strategies"] and second == service.describe() and built == [1]
