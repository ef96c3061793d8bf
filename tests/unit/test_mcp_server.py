"""The MCP server over an in-process API, through the mcp SDK's own client (connected in-process)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from mcp import Client, MCPError

from reasonray.api.app import local_dispatcher
from reasonray.api.service import ExecuteParams
from reasonray.api.surfaces.mcp_server import build_server, fillable, unsupported_version
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
from reasonray.stores.sessions import SqliteSessionStore


def server(tmp_path):
    llm = SimulatedLLM()
    sessions = LocalSessions(SessionPipeline(SqliteSessionStore(SessionState, tmp_path), llm, builtin_toolbox(), data_dir=tmp_path))
    return build_server(
        local_dispatcher(
            ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"), llm, sessions=sessions
        )
    )


async def test_tools_are_the_methods_with_their_pydantic_schemas_and_results(tmp_path):
    async with Client(server(tmp_path)) as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        # no memory bank here: the ReasoningBank memory tools are not offered
        assert set(tools) == {"reason", "session_create", "session_turn", "session_resume", "session_get", "session_close"}
        assert tools["reason"].input_schema == fillable(ExecuteParams.model_json_schema())
        result = await mcp.call_tool("reason", {"query": "What is 17 * 23?"})
        assert not result.is_error and result.structured_content["answer"] == "391"
        jsonschema.validate(result.structured_content, tools["reason"].output_schema)
        session = (await mcp.call_tool("session_create", {"server_tools": ["calculator"]})).structured_content
        turn = await mcp.call_tool("session_turn", {"session_id": session["session_id"], "message": "What is 6 * 7?"})
        assert turn.structured_content["status"] == "completed" and turn.structured_content["answer"] == "42"
        resource = await mcp.read_resource(f"reasonray://sessions/{session['session_id']}")
        assert json.loads(resource.contents[0].text)["turn"] == 1


async def test_a_failed_call_is_a_tool_error_carrying_the_jsonrpc_error(tmp_path):
    async with Client(server(tmp_path)) as mcp:
        unknown = await mcp.call_tool("reason", {"query": "q", "strategy": "no_such_strategy"})
        missing = await mcp.call_tool("session_get", {"session_id": "nosuchsession"})
        strategies = json.loads((await mcp.read_resource("reasonray://strategies")).contents[0].text)
    assert unknown.is_error and json.loads(unknown.content[0].text)["code"] == -32002
    assert missing.is_error and json.loads(missing.content[0].text)["code"] == -32005
    assert strategies["default_strategy"] == "chain_of_thought"


# -- with [auth]: the stdio server runs as its token's principal, through the tenancy guard -----------------

SECRET = "unit-mcp-secret-" + "x" * 32
ROLES = {
    "reasoner": {"methods": ["*"], "strategies": ["*"]},
    "cot_only": {"methods": ["*"], "strategies": ["chain_of_thought"]},
    "lister": {"methods": ["reasoning.strategies"], "strategies": ["*"]},
}


def guarded(tmp_path):
    """The API as `reasonray mcp` builds it with [auth] configured (in_process_api's guard), over the simulated model."""
    from reasonray.api.access.tenancy import install_guard
    from reasonray.api.app import Backends, build_application, local_guard
    from reasonray.kernel.config import Settings

    llm = SimulatedLLM()
    reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought", "tree_of_thought"], default_strategy="chain_of_thought")
    settings = Settings(data_dir=tmp_path, reasoning=reasoning, auth={"jwt_secret": SECRET, "roles": ROLES})
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    application = build_application(
        settings, llm=llm, backends=Backends(cache=None, memory=None, sessions=lambda _: sessions), data_dir=tmp_path
    )
    install_guard(application.dispatcher, local_guard(settings, application))
    return settings, application.dispatcher


def as_caller(settings, rpc, sub, *roles, ttl=600):
    from reasonray.api.access.auth import mint_token
    from reasonray.api.surfaces.mcp_server import StdioCaller

    caller = StdioCaller(settings, mint_token(SECRET, sub, list(roles), ttl))
    return build_server(rpc, principal=caller.principal)


def error_of(result) -> dict:
    assert result.is_error, result.structured_content
    return json.loads(result.content[0].text)


def test_with_auth_the_stdio_caller_needs_a_valid_token_and_says_how_to_give_one(tmp_path):
    from reasonray.api.access.auth import mint_token
    from reasonray.api.surfaces.mcp_server import StdioCaller
    from reasonray.kernel.config import Settings
    from reasonray.kernel.errors import UnauthenticatedError

    settings, _ = guarded(tmp_path)
    for missing in (None, "", "  "):
        with pytest.raises(UnauthenticatedError) as refused:
            StdioCaller(settings, missing)
        assert (
            "--token" in str(refused.value) and "REASONRAY_TOKEN" in str(refused.value) and "reasonray token create" in str(refused.value)
        )
    with pytest.raises(UnauthenticatedError, match="signature verification failed"):
        StdioCaller(settings, mint_token("another-secret-" + "y" * 32, "alice", ["reasoner"], 60)).principal()
    with pytest.raises(UnauthenticatedError, match="token expired"):
        StdioCaller(settings, mint_token(SECRET, "alice", ["reasoner"], -3600)).principal()
    with pytest.raises(UnauthenticatedError, match="malformed token"):
        StdioCaller(settings, "not-a-jwt").principal()
    alice = StdioCaller(settings, mint_token(SECRET, "alice", ["reasoner"], 60)).principal()
    assert alice is not None and alice.sub == "alice" and alice.roles == ("reasoner",)
    # without [auth] there is nobody to be: the server runs unguarded, whatever token it was given
    assert StdioCaller(Settings(data_dir=tmp_path), "anything").principal() is None


async def test_with_auth_every_tool_runs_as_the_principal_through_the_guard(tmp_path):
    settings, rpc = guarded(tmp_path)
    async with Client(as_caller(settings, rpc, "alice", "reasoner")) as alice:
        answered = await alice.call_tool("reason", {"query": "What is 17 * 23?", "strategy": "tree_of_thought"})
        assert not answered.is_error and answered.structured_content["answer"] == "391"
        session = (await alice.call_tool("session_create", {"server_tools": ["calculator"]})).structured_content
        turn = await alice.call_tool("session_turn", {"session_id": session["session_id"], "message": "What is 6 * 7?"})
        assert turn.structured_content["answer"] == "42"
    async with Client(as_caller(settings, rpc, "bob", "reasoner")) as bob:
        # another principal's session: refused as if it did not exist, through tools and resources alike
        theirs = error_of(await bob.call_tool("session_get", {"session_id": session["session_id"]}))
        nothing = error_of(await bob.call_tool("session_get", {"session_id": "0" * 32}))
        assert theirs["code"] == nothing["code"] == -32003
        assert theirs["message"].split("'")[0] == nothing["message"].split("'")[0]
        assert error_of(await bob.call_tool("session_close", {"session_id": session["session_id"]}))["code"] == -32003
        with pytest.raises(MCPError) as unreadable:
            await bob.read_resource(f"reasonray://sessions/{session['session_id']}")
        assert unreadable.value.code == -32003 and "forbidden" in unreadable.value.message
    async with Client(as_caller(settings, rpc, "carol", "cot_only")) as carol:
        forbidden = error_of(await carol.call_tool("reason", {"query": "2+2?", "strategy": "tree_of_thought"}))
        assert forbidden["code"] == -32003 and forbidden["data"]["strategy"] == "tree_of_thought"
        assert not (await carol.call_tool("reason", {"query": "What is 2 + 2?"})).is_error  # the default, chain_of_thought
    async with Client(as_caller(settings, rpc, "dave", "lister")) as dave:
        assert error_of(await dave.call_tool("session_create", {}))["code"] == -32003  # the role may not call session.create
        assert "chain_of_thought" in (await dave.read_resource("reasonray://strategies")).contents[0].text
    async with Client(as_caller(settings, rpc, "alice", "reasoner")) as alice_again:
        got = await alice_again.call_tool("session_get", {"session_id": session["session_id"]})
        assert not got.is_error and got.structured_content["turn"] == 1
    # every call was audited under its principal, refusals included
    audited = [json.loads(line) for line in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    assert any(r["principal"] == "bob" and r["method"] == "session.get" and r["outcome"] == "forbidden" for r in audited)
    assert any(r["principal"] == "alice" and r["method"] == "reasoning.execute" and r["outcome"] == "ok" for r in audited)


async def test_a_token_that_expires_while_the_stdio_server_runs_stops_working(tmp_path):
    from reasonray.api.access.auth import mint_token
    from reasonray.api.surfaces.mcp_server import StdioCaller

    settings, rpc = guarded(tmp_path)
    caller = StdioCaller(settings, mint_token(SECRET, "alice", ["reasoner"], 600))
    async with Client(build_server(rpc, principal=caller.principal)) as mcp:
        assert not (await mcp.call_tool("session_create", {})).is_error
        caller.token = mint_token(SECRET, "alice", ["reasoner"], -3600)  # the same key, now past its exp (and the leeway)
        expired = error_of(await mcp.call_tool("session_create", {}))
        assert expired["code"] == -32016 and "token expired" in expired["message"]


def test_input_schemas_are_fillable_forms_that_accept_what_the_method_accepts():
    schema = fillable(ExecuteParams.model_json_schema())
    text = json.dumps(schema)
    # what a form-filling client (the MCP Inspector) cannot fill: references and `anyOf [T, null]`
    assert "$ref" not in text and "anyOf" not in text and "$defs" not in schema
    memory = schema["properties"]["memory"]
    assert memory["type"] == "object" and "workspace" in memory["properties"]
    assert schema["properties"]["strategy_config"]["type"] == "object" and schema["required"] == ["query"]
    example = {"query": "q", "memory": {"workspace": "w"}, "budget": {"max_total_tokens": 100}, "sampling": {"temperature": 1}}
    jsonschema.validate(example, schema)
    ExecuteParams.model_validate(example)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"query": "q", "budget": {"max_total_tokens": 0}}, schema)


def test_a_recursive_definition_stays_a_reference():
    tree = {
        "$defs": {"Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
        "type": "object",
        "properties": {"root": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}], "default": None}},
    }
    schema = fillable(tree)
    assert schema["properties"]["root"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert schema["$defs"]["Node"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    jsonschema.validate({"root": {"children": [{"children": []}]}}, schema)


def test_an_unknown_protocol_version_is_refused_naming_the_supported_ones():
    refusal = unsupported_version({"headers": [(b"mcp-protocol-version", b"1999-01-01")]})
    assert refusal is not None and refusal.status_code == 400
    error = json.loads(bytes(refusal.body))["error"]
    assert "1999-01-01" in error["message"] and "2025-06-18" in error["message"] and "2025-06-18" in error["data"]["supported"]
    assert unsupported_version({"headers": [(b"mcp-protocol-version", b"2025-06-18")]}) is None
    assert unsupported_version({"headers": []}) is None
