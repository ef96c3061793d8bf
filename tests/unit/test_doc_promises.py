"""docs/api.md's promises, each checked across every method and strategy it speaks of:
every response carries its trace id (results, errors, batch answers); every code in the error table is
one the API gives, and each is produced here through the dispatcher."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from pathlib import Path

import pytest

from reasonray.api import jsonrpc
from reasonray.api.app import local_dispatcher
from reasonray.gateway.errors import ProviderUnavailableError
from reasonray.gateway.protocol import ToolCall
from reasonray.gateway.testing import FunctionLLM, ScriptedLLM
from reasonray.kernel.config import ReasoningSettings
from reasonray.kernel.errors import (
    ForbiddenError,
    MemoryUnavailableError,
    OverloadedError,
    RateLimitedError,
    SessionStateError,
    UnauthenticatedError,
)

REPO = Path(__file__).resolve().parents[2]
API = (REPO / "docs" / "api.md").read_text()
# docs/api.md: every result carries its trace id (its result model's `trace_id`), except rpc.discover's: the
# OpenRPC document itself, which admits no other member (its trace id is in X-Trace-Id)
VERBATIM_RESULTS = frozenset({"rpc.discover"})
PROSE = " ".join(API.split())
STRATEGIES = ["chain_of_thought", "self_consistency", "tree_of_thought", "refine", "matts", "react", "bounded_context"]
REPLY = "<thinking>6 times 7</thinking><answer>42</answer><score>0.9</score><feedback>fine</feedback><vote>1</vote>"


def dispatcher(llm, strategies=STRATEGIES):
    reasoning = ReasoningSettings(enabled_strategies=list(strategies), default_strategy=strategies[0])
    return local_dispatcher(reasoning, llm, data_dir=Path(tempfile.mkdtemp(prefix="promises-")))


async def call(rpc, method, params, request_id=1):
    response, trace_ids = await rpc.handle_payload({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
    return response, trace_ids


def carried_trace_id(response: dict) -> str | None:
    if "result" in response:
        return response["result"].get("trace_id")
    return response["error"].get("data", {}).get("trace_id")


def test_the_promise_is_still_written_as_tested():
    assert "Every response to a call carries its trace id: in `result.trace_id` (except `rpc.discover`" in PROSE
    assert "in `error.data.trace_id`, and (for single calls) in the `X-Trace-Id` header" in PROSE
    assert "When a run fails part-way, what it achieved is kept in `error.data.partial`" in PROSE


@pytest.mark.parametrize(
    "method",
    [
        "agent.discover",
        "agent.list",
        "agent.get",
        "agent.register",
        "agent.unregister",
        "reasoning.strategies",
        "reasoning.bounded_context",
        "reasoning.execute",
    ],
)
async def test_every_method_carries_its_trace_id_in_results_and_errors(method):
    rpc = dispatcher(FunctionLLM(lambda r: REPLY))
    assert method in rpc.methods
    response, (trace_id,) = await call(rpc, method, {})  # a result for some, a -32602 for the others
    assert carried_trace_id(response) == trace_id, response


async def test_every_registered_method_is_covered_above():
    covered = {"agent.discover", "agent.list", "agent.get", "agent.register", "agent.unregister", "reasoning.strategies"}
    covered |= {"reasoning.bounded_context", "reasoning.execute"}
    covered |= VERBATIM_RESULTS  # answered with a document of a fixed schema (OpenRPC), trace id in X-Trace-Id
    assert set(dispatcher(FunctionLLM(lambda r: REPLY)).methods) == covered


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_every_strategy_carries_its_trace_id_in_its_result_and_its_error(strategy):
    rpc = dispatcher(FunctionLLM(lambda r: REPLY))
    response, (trace_id,) = await call(rpc, "reasoning.execute", {"query": "What is 6 * 7?", "strategy": strategy})
    assert response["result"]["trace_id"] == trace_id and response["result"]["strategy_used"] == strategy
    failing = dispatcher(FunctionLLM(lambda r: ProviderUnavailableError("down", attempts=3, status_code=500)))
    response, (trace_id,) = await call(failing, "reasoning.execute", {"query": "What is 6 * 7?", "strategy": strategy})
    assert response["error"]["data"]["trace_id"] == trace_id and "partial" in response["error"]["data"]


async def test_every_answer_in_a_batch_carries_its_own_trace_id():
    rpc = dispatcher(FunctionLLM(lambda r: REPLY))
    batch = [
        {"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "What is 6 * 7?"}, "id": "ok"},
        {"jsonrpc": "2.0", "method": "reasoning.strategies", "id": "list"},
        {"jsonrpc": "2.0", "method": "nope", "id": "unknown"},
        {"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": ""}, "id": "invalid"},
    ]
    responses, trace_ids = await rpc.handle_payload(batch)
    assert [carried_trace_id(r) for r in responses] == trace_ids and len(set(trace_ids)) == 4


def documented_codes() -> list[int]:
    table = API.split("## Errors", 1)[1].split("## REST mirrors", 1)[0]
    return [int(code) for code in re.findall(r"^\| (-32\d{3}) \|", table, re.MULTILINE)]


def test_every_documented_code_is_one_the_api_gives():
    given = {cls.code for cls in jsonrpc.error_classes()} | set(jsonrpc.CODE_NAMES)
    assert set(documented_codes()) <= given


def calculator(expression: str) -> ToolCall:
    return ToolCall(id="c1", name="calculator", arguments=json.dumps({"expression": expression}))


# code -> (method, params, the model's replies): each produced through the dispatcher
PRODUCERS = {
    -32600: None,  # an envelope problem, below
    -32700: None,  # not JSON, below
    -32601: ("made.up", {}, []),
    -32602: ("reasoning.execute", {"query": ""}, []),
    -32603: ("reasoning.execute", {"query": "q"}, [KeyError("a bug")]),
    -32002: ("reasoning.execute", {"query": "q", "strategy": "tree_of_light"}, []),
    -32004: ("reasoning.execute", {"query": "q " * 200, "budget": {"max_total_tokens": 5}}, []),
    -32005: ("reasoning.execute", {"query": "q", "agent_id": "ghost"}, []),
    -32006: (
        "reasoning.execute",
        {"query": "q", "strategy": "react", "strategy_config": {"tools": ["calculator"]}},
        [calculator("import os")],
    ),
    -32007: ("reasoning.execute", {"query": "q"}, [SessionStateError("a turn while calls are pending")]),
    -32008: ("reasoning.execute", {"query": "q"}, [MemoryUnavailableError("chroma is down")]),
    -32011: ("reasoning.execute", {"query": "q"}, [OverloadedError("no room now", {"retry_after_s": 1.0})]),
    # the auth gate and the tenancy guard raise these in front of a method; their mapping is what is checked here
    -32016: ("reasoning.execute", {"query": "q"}, [UnauthenticatedError("missing bearer token")]),
    -32003: ("reasoning.execute", {"query": "q"}, [ForbiddenError("not allowed")]),
    -32012: ("reasoning.execute", {"query": "q"}, [RateLimitedError("slow down", {"retry_after_s": 2.0})]),
    -32001: (
        "reasoning.execute",
        {"query": "q", "strategy": "bounded_context", "strategy_config": {"max_iterations": 1}},
        ["<thinking>more</thinking>"],
    ),
    -32010: (
        "reasoning.execute",
        {"query": "q", "strategy": "self_consistency", "strategy_config": {"samples": 1}},
        ["<thinking>no answer</thinking>"],
    ),
    -32013: ("reasoning.execute", {"query": "q"}, [ProviderUnavailableError("down", attempts=3, status_code=503)]),
    -32014: ("reasoning.execute", {"query": "q"}, [asyncio.CancelledError()]),
}


@pytest.mark.parametrize("code", documented_codes())
async def test_every_documented_code_is_produced_through_the_dispatcher(code):
    if code == -32015:  # a model that never answers, a deadline

        async def hang(request):
            await asyncio.Event().wait()

        llm = FunctionLLM(lambda r: REPLY)
        llm.complete = hang
        response, _ = await call(dispatcher(llm), "reasoning.execute", {"query": "q", "budget": {"deadline_s": 0.05}})
    elif code == -32700:
        response, _ = await dispatcher(ScriptedLLM([])).handle(b"{not json")
    elif code == -32600:
        response, _ = await dispatcher(ScriptedLLM([])).handle_payload({"jsonrpc": "1.0", "method": "x", "id": 1})
    else:
        assert code in PRODUCERS, f"{code} is documented; add how to produce it to PRODUCERS"
        method, params, replies = PRODUCERS[code]
        response, _ = await call(dispatcher(ScriptedLLM(replies)), method, params)
    assert response["error"]["code"] == code, response
    if code != -32700:
        assert response["error"]["data"]["trace_id"]
    if code in RUN_FAILURES:  # "A failure of a run (...) also carries `partial` and `strategy`"
        assert {"partial", "strategy"} <= set(response["error"]["data"]), response


RUN_FAILURES = {-32001, -32004, -32006, -32010, -32013, -32014, -32015}


def test_the_run_failures_are_listed_as_tested():
    assert f"A failure of a run ({', '.join(str(c) for c in sorted(RUN_FAILURES, reverse=True))}) also carries" in PROSE


async def test_every_session_method_carries_its_trace_id(tmp_path):
    from reasonray.gateway.simulator.inprocess import SimulatedLLM
    from reasonray.reasoner.builtin_tools import builtin_toolbox
    from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
    from reasonray.stores.sessions import SqliteSessionStore

    llm = SimulatedLLM()
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    rpc = local_dispatcher(
        ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"), llm, sessions=sessions
    )
    response, (trace_id,) = await call(rpc, "session.create", {"server_tools": ["calculator"]})
    assert response["result"]["trace_id"] == trace_id
    sid = response["result"]["session_id"]
    for method, params in [
        ("session.turn", {"session_id": sid, "message": "What is 6 * 7?"}),
        ("session.get", {"session_id": sid}),
        ("session.resume", {"session_id": sid, "tool_results": []}),  # nothing pending: -32007
        ("session.close", {"session_id": sid}),
        ("session.turn", {"session_id": "missing-session"}),  # -32602
    ]:
        response, (trace_id,) = await call(rpc, method, params)
        assert carried_trace_id(response) == trace_id, (method, response)


def full_dispatcher(tmp_path: Path):
    """Every method the service can serve: the reasoning and agent methods, sessions, and a real memory bank
    (embedded Chroma in tmp_path) behind memory.*, stats.* and the ReasoningBank tool aliases."""
    from reasonray.gateway.simulator.inprocess import SimulatedLLM
    from reasonray.kernel.config import load_settings
    from reasonray.reasoner.builtin_tools import builtin_toolbox
    from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
    from reasonray.stores.sessions import SqliteSessionStore
    from tests.unit.memory_harness import local_memory, make_bank

    settings = load_settings()
    llm = SimulatedLLM()
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    bank = make_bank(tmp_path / "chroma")
    return local_dispatcher(
        settings.reasoning, llm, data_dir=tmp_path, memory=local_memory(bank), memory_settings=settings.memory, sessions=sessions
    )


ITEM = {"title": "Check units", "description": "Convert before you compare.", "content": "Write every quantity with its unit."}
CARD = {"id": "planner", "name": "Planner", "capabilities": ["reasoning.strategy.chain_of_thought"]}


def calls_with_results(session_id: str, memory_id: str) -> list[tuple[str, dict]]:
    """One call of every method that answers with a result, in an order that leaves what later ones need."""
    return [
        ("reasoning.strategies", {}),
        ("reasoning.execute", {"query": "What is 6 * 7?", "strategy": "chain_of_thought"}),
        ("reasoning.bounded_context", {"query": "What is 6 * 7?"}),
        ("agent.register", CARD),
        ("agent.get", {"agent_id": "planner"}),
        ("agent.list", {}),
        ("agent.discover", {"capabilities": []}),
        ("agent.unregister", {"agent_id": "planner"}),
        ("session.tools", {}),
        ("session.turn", {"session_id": session_id, "message": "What is 6 * 7?"}),
        ("session.get", {"session_id": session_id}),
        ("session.close", {"session_id": session_id}),
        ("memory.retrieve", {"query": "compare two lengths"}),
        ("memory.get", {"memory_id": memory_id}),
        ("memory.genealogy", {"memory_id": memory_id}),
        ("memory.descendants", {"memory_id": memory_id}),
        ("memory.errors", {}),
        ("memory.traces", {"task_id": "no-such-task"}),
        ("memory.list_workspaces", {}),
        ("retrieve_memories", {"query": "compare two lengths"}),
        ("get_memory_genealogy", {"memory_id": memory_id}),
        ("get_statistics", {}),
        ("stats.get", {}),
        ("solve_coding_task", {"task": "Write add(a, b) returning the sum.", "enable_matts": False, "store_result": False}),
        ("stats.reset", {}),
        ("memory.delete_workspace", {"workspace": "default", "confirm": True}),
    ]


async def test_every_method_of_the_method_tables_carries_its_trace_id_in_results_and_errors(tmp_path):
    """docs/api.md: every response to a call carries its trace id (results and errors), for every method the
    tables list (reasoning, agents, sessions, memory, statistics, the ReasoningBank tool aliases), each answered here."""
    rpc = full_dispatcher(tmp_path)
    served = set(rpc.methods) - VERBATIM_RESULTS
    documented = {m for m in re.findall(r"`([a-z_]+(?:\.[a-z_]+)*)`", API) if m in served}
    assert documented == served, sorted(served - documented)  # every method is in the docs' tables

    created, (trace_id,) = await call(rpc, "session.create", {"server_tools": ["calculator"]})
    assert created["result"]["trace_id"] == trace_id
    stored, (trace_id,) = await call(rpc, "memory.store", {"items": [ITEM]})
    assert stored["result"]["trace_id"] == trace_id
    answered = {"session.create", "memory.store"}
    for method, params in calls_with_results(created["result"]["session_id"], stored["result"]["stored"][0]["id"]):
        response, (trace_id,) = await call(rpc, method, params)
        assert "result" in response and response["result"]["trace_id"] == trace_id, (method, response)
        answered.add(method)
    # session.resume answers with a result only when client tools are pending; without, its error carries the id
    response, (trace_id,) = await call(rpc, "session.resume", {"session_id": created["result"]["session_id"], "tool_results": []})
    assert response["error"]["data"]["trace_id"] == trace_id
    assert answered | {"session.resume"} == served
    for method in sorted(served):  # and every method's error: an unknown parameter is -32602
        response, (trace_id,) = await call(rpc, method, {"not_a_parameter": 1})
        error = response["error"]
        assert error["code"] == -32602 and error["data"]["trace_id"] == trace_id, (method, response)
