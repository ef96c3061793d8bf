"""The MCP server over an in-process API, through the mcp SDK's own client (connected in-process)."""

from __future__ import annotations

import json

import jsonschema
from mcp import Client

from reasonray.api.app import local_dispatcher
from reasonray.api.mcp_server import build_server
from reasonray.api.service import ExecuteParams
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import FileSessionRepository, LocalSessions, SessionPipeline


def server(tmp_path):
    llm = SimulatedLLM()
    sessions = LocalSessions(SessionPipeline(FileSessionRepository(tmp_path), llm, builtin_toolbox(), data_dir=tmp_path))
    return build_server(
        local_dispatcher(
            ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"), llm, sessions=sessions
        )
    )


async def test_tools_are_the_methods_with_their_pydantic_schemas_and_results(tmp_path):
    async with Client(server(tmp_path)) as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        # no memory bank here: the seed's memory tools are not offered
        assert set(tools) == {"reason", "session_create", "session_turn", "session_resume", "session_get", "session_close"}
        assert tools["reason"].input_schema == ExecuteParams.model_json_schema()
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
