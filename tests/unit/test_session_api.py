"""The session.* JSON-RPC methods in-process: results, error codes and messages."""

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import (
    LocalSessions,
    SessionPipeline,
    SessionState,
)
from reasonray.stores.sessions import SqliteSessionStore
from tests.client_tools import WEATHER


@pytest.fixture
def api(tmp_path):
    llm = SimulatedLLM()
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    return local_dispatcher(
        ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"), llm, sessions=sessions
    )


async def rpc(api, method, params):
    response, _ = await api.handle_payload({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return response


async def test_create_turn_handoff_resume_get_close(api):
    created = (await rpc(api, "session.create", {"server_tools": ["calculator"], "client_tools": [WEATHER]}))["result"]
    sid = created["session_id"]
    assert created["server_tools"] == ["calculator"] and created["client_tools"] == ["get_weather"]
    message = 'Weather? [[sim call=calculator {"expression": "6*7"}]] [[sim call=get_weather {"city": "Oslo"}]]'
    turn = (await rpc(api, "session.turn", {"session_id": sid, "message": message}))["result"]
    assert turn["status"] == "awaiting_client_tools"
    [pending] = turn["pending_tool_calls"]
    assert pending["name"] == "get_weather" and pending["arguments"] == {"city": "Oslo"}
    got = (await rpc(api, "session.get", {"session_id": sid}))["result"]
    assert got["status"] == "awaiting_client_tools" and got["pending_tool_calls"] == [pending]
    conflict = (await rpc(api, "session.turn", {"session_id": sid, "message": "next"}))["error"]
    assert conflict["code"] == -32007 and conflict["data"]["pending_tool_call_ids"] == [pending["tool_call_id"]]
    wrong = (await rpc(api, "session.resume", {"session_id": sid, "tool_results": [{"tool_call_id": "nope", "content": "x"}]}))["error"]
    assert wrong["code"] == -32602 and wrong["data"]["error_type"] == "reentry_mismatch"
    assert wrong["data"]["missing"] == [pending["tool_call_id"]] and wrong["data"]["unexpected"] == ["nope"]
    done = (
        await rpc(
            api, "session.resume", {"session_id": sid, "tool_results": [{"tool_call_id": pending["tool_call_id"], "content": "Snow"}]}
        )
    )["result"]
    assert done["status"] == "completed" and done["answer"] == "Snow"
    assert [s["type"] for s in done["trace"]][-4:] == ["REENTRY_VERIFIED", "CONTINUATION", "LLM_CALL", "EXIT"]
    closed = (await rpc(api, "session.close", {"session_id": sid}))["result"]
    assert closed == {"session_id": sid, "status": "closed", "trace_id": closed["trace_id"]}


async def test_error_codes(api):
    missing = (await rpc(api, "session.turn", {"session_id": "unknown-session", "message": "hi"}))["error"]
    assert missing["code"] == -32005 and "create one with session.create" in missing["message"]
    bad = (await rpc(api, "session.create", {"server_tools": ["teleport"]}))["error"]
    assert bad["code"] == -32602 and "available: calculator, python" in bad["message"]
    sid = (await rpc(api, "session.create", {"server_tools": ["calculator"]}))["result"]["session_id"]
    failed = (await rpc(api, "session.turn", {"session_id": sid, "message": '[[sim call=calculator {"expression": "1/0"}]]'}))["error"]
    assert failed["code"] == -32006 and failed["data"]["tool"] == "calculator"
    # a tool call over a configured cap is the request asking too much: -32602 naming the cap, not a tool failure
    huge = '[[sim call=calculator {"expression": "(((9**64)**64)**64)**64"}]]'
    capped = (await rpc(api, "session.turn", {"session_id": sid, "message": huge}))["error"]
    assert capped["code"] == -32602 and capped["data"]["cap"] == "[limits] max_calculator_digits", capped
    assert capped["data"]["tool"] == "calculator" and "max_calculator_digits" in capped["message"]
    unknown_tool = (await rpc(api, "session.turn", {"session_id": sid, "message": "[[sim call=get_weather]]"}))["error"]
    assert unknown_tool["code"] == -32010 and unknown_tool["data"]["error_type"] == "unregistered_tool"
    tools = (await rpc(api, "session.tools", {}))["result"]["server_tools"]
    assert {t["function"]["name"] for t in tools} == {"calculator", "python"}


async def test_a_session_searches_the_reasoning_memory_with_the_memory_search_tool(tmp_path):
    from reasonray.memory.items import MemoryItem
    from tests.unit.memory_harness import local_memory, make_bank

    bank = make_bank(tmp_path / "bank")
    lesson = MemoryItem(
        title="Convert units first", description="Mixed units give wrong sums.", content="Convert to one unit before adding."
    )
    bank.store_items([lesson], workspace="default", keys=["add lengths in metres and centimetres"])
    llm = SimulatedLLM()
    toolbox = builtin_toolbox(memory=local_memory(bank))
    sessions = LocalSessions(SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, toolbox, data_dir=tmp_path))
    api = local_dispatcher(
        ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"), llm, sessions=sessions
    )
    assert "memory_search" in [t["function"]["name"] for t in (await rpc(api, "session.tools", {}))["result"]["server_tools"]]
    sid = (await rpc(api, "session.create", {"server_tools": ["memory_search"]}))["result"]["session_id"]
    message = 'How do I add 2 m and 30 cm? [[sim call=memory_search {"query": "add lengths in metres and centimetres"}]]'
    turn = (await rpc(api, "session.turn", {"session_id": sid, "message": message}))["result"]
    assert turn["status"] == "completed" and "Convert units first" in turn["answer"]
    bad = 'Search [[sim call=memory_search {"query": "x", "workspace": "Not Valid"}]]'
    failed = (await rpc(api, "session.turn", {"session_id": sid, "message": bad}))["error"]
    assert failed["code"] in (-32006, -32602) and "workspace" in failed["message"]
