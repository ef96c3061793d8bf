"""`reasoning.execute` streamed as Server-Sent Events: the run's events, then the JSON-RPC response, through
the same method table (and guard) as every other call."""

from __future__ import annotations

import json

from reasonray.api.access.auth import CURRENT_PRINCIPAL, Policy, Principal
from reasonray.api.access.limits import LocalLimits
from reasonray.api.access.tenancy import Guard, LocalOwners, install_guard
from reasonray.api.app import local_dispatcher
from reasonray.api.surfaces.streaming import StreamingCall, rpc_sse, streaming_call
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.auth_settings import AuthSettings
from reasonray.kernel.config import ReasoningSettings

REASONING = ReasoningSettings(enabled_strategies=["chain_of_thought", "bounded_context"], default_strategy="chain_of_thought")


def call(params: dict, id: object = 7) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": id, "method": "reasoning.execute", "params": {**params, "stream": True}}).encode()


async def sent(rpc, body: bytes) -> list[dict]:
    streamed = streaming_call(rpc, body)
    assert streamed is not None
    return [item async for item in rpc_sse(rpc, streamed, "trace-sse-1")]


def test_only_well_formed_single_calls_asking_for_a_stream_are_streamed():
    rpc = local_dispatcher(REASONING, SimulatedLLM())
    assert streaming_call(rpc, call({"query": "q"})) == StreamingCall("reasoning.execute", {"query": "q"}, 7)
    not_streamed = [
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "reasoning.execute", "params": {"query": "q", "stream": False}}),
        json.dumps({"jsonrpc": "1.0", "id": 1, "method": "reasoning.execute", "params": {"query": "q", "stream": True}}),
        json.dumps({"jsonrpc": "2.0", "id": {"no": 1}, "method": "reasoning.execute", "params": {"query": "q", "stream": True}}),
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "stats.get", "params": {"stream": True}}),
        json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "reasoning.execute", "params": {"query": "q", "stream": True}}]),
    ]
    for body in not_streamed:  # the dispatcher answers these (a -32600 for the malformed ones)
        assert streaming_call(rpc, body.encode()) is None, body


async def test_the_events_then_the_response_with_the_calls_id():
    rpc = local_dispatcher(REASONING, SimulatedLLM())
    items = await sent(rpc, call({"query": "[[sim think=9000 answer=5]] go", "strategy": "bounded_context"}))
    kinds = [i["event"] for i in items]
    assert kinds[-1] == "response" and "ITERATION_END" in kinds and "CARRYOVER" in kinds
    response = json.loads(items[-1]["data"])
    assert response["id"] == 7 and response["result"]["answer"] == "5" and response["result"]["trace_id"] == "trace-sse-1"


async def test_an_error_is_the_response_event_with_its_code():
    rpc = local_dispatcher(REASONING, SimulatedLLM())
    items = await sent(rpc, call({"query": "q", "strategy": "tree_of_thought"}, id="abc"))
    [only] = items
    response = json.loads(only["data"])
    assert only["event"] == "response" and response["id"] == "abc" and response["error"]["code"] == -32002


async def test_a_guarded_stream_runs_as_the_caller_and_is_refused_without_one(tmp_path):
    rpc = local_dispatcher(REASONING, SimulatedLLM())
    roles = {"cot": {"methods": ["reasoning.execute"], "strategies": ["chain_of_thought"]}}
    auth = AuthSettings(jwt_secret="s" * 40, roles=roles)

    async def strategy_of(params):
        return params.strategy or "chain_of_thought"

    async def no_agent(agent_id):
        return False

    async def no_strategies(agent_id):
        return []

    guard = Guard(
        Policy(auth), LocalOwners(), LocalLimits(), agent_exists=no_agent, strategy_of=strategy_of, agent_strategies=no_strategies
    )
    install_guard(rpc, guard)
    anonymous = json.loads((await sent(rpc, call({"query": "What is 2 + 2?"})))[-1]["data"])
    assert anonymous["error"]["code"] == -32016
    token = CURRENT_PRINCIPAL.set(Principal("alice", ("cot",)))
    try:
        forbidden = json.loads((await sent(rpc, call({"query": "go", "strategy": "bounded_context"})))[-1]["data"])
        allowed = json.loads((await sent(rpc, call({"query": "What is 2 + 2?"})))[-1]["data"])
    finally:
        CURRENT_PRINCIPAL.reset(token)
    assert forbidden["error"]["code"] == -32003 and forbidden["error"]["data"]["strategy"] == "bounded_context"
    assert allowed["result"]["answer"] == "4"
