"""The JSON-RPC layer and the reasoning service in-process, with strict scripted models."""

import json
import re

import pytest
import structlog

from reasonray.api import jsonrpc
from reasonray.api.app import local_dispatcher
from reasonray.api.errors import error_table, view_of
from reasonray.api.methods import accept_trace_id
from reasonray.gateway.errors import (
    CircuitOpenError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from reasonray.gateway.testing import FunctionLLM, ScriptedLLM
from reasonray.kernel.config import ReasoningSettings
from reasonray.kernel.errors import (
    BudgetExceededError,
    MaxIterationsError,
    MaxLLMCallsError,
    ModelBehaviorError,
    UnauthenticatedError,
)
from tests.docs_examples import REPO


def dispatcher(llm, enabled=("chain_of_thought",)):
    reasoning = ReasoningSettings(
        enabled_strategies=list(enabled),
        default_strategy=enabled[0] if enabled else None,
        strategies={"chain_of_thought": {"default_max_tokens": 512}} if enabled else {},
    )
    return local_dispatcher(reasoning, llm)


def answer_llm():
    return FunctionLLM(lambda req: "<thinking>easy</thinking><answer>4</answer>")


async def call(rpc, payload):
    body = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
    response, _ = await rpc.handle(body)
    return response


def execute(params, id=1):
    return {"jsonrpc": "2.0", "method": "reasoning.execute", "params": params, "id": id}


async def test_execute_returns_answer_metrics_resolution_and_trace_id():
    rpc = dispatcher(answer_llm())
    response = await call(rpc, execute({"query": "What is 2+2?"}))
    result = response["result"]
    assert response["id"] == 1 and result["answer"] == "4"
    assert result["strategy_used"] == "chain_of_thought" and len(result["trace_id"]) == 32
    assert result["resolution"]["strategy_decided_by"] == "system"
    assert result["resolution"]["config"]["max_tokens"] == 512
    assert result["metrics"]["llm_calls"] == 1 and result["trace"] is None


async def test_include_trace_returns_the_events_with_full_text():
    response = await call(dispatcher(answer_llm()), execute({"query": "q", "include_trace": True}))
    trace = response["result"]["trace"]
    assert [e["type"] for e in trace] == ["LLM_INVOCATION", "RUN_END"]
    assert "<thinking>easy</thinking>" in trace[0]["responses"][0]
    assert {e["trace_id"] for e in trace} == {response["result"]["trace_id"]}


async def test_parse_error():
    response = await call(dispatcher(answer_llm()), b"{not json")
    assert response["error"]["code"] == -32700 and response["id"] is None


@pytest.mark.parametrize(
    "payload,fragment",
    [
        ({"method": "reasoning.execute", "id": 1}, '"jsonrpc" must be exactly "2.0"'),
        ({"jsonrpc": "2.0", "id": 1}, '"method" must be a non-empty string'),
        ({"jsonrpc": "2.0", "method": "x", "params": "q", "id": 1}, '"params" must be an object or an array'),
        ({"jsonrpc": "2.0", "method": "x", "id": {"a": 1}}, '"id" must be a string, an integer or null'),
        ({"jsonrpc": "2.0", "method": "x", "id": 1, "extra": 1}, "unknown members ['extra']"),
        ([], "an empty batch"),
        (5, "must be a JSON object"),
    ],
)
async def test_invalid_requests(payload, fragment):
    response = await call(dispatcher(answer_llm()), payload)
    response = response[0] if isinstance(response, list) else response
    assert response["error"]["code"] == -32600 and fragment in response["error"]["message"]


async def test_method_not_found_lists_the_methods():
    response = await call(dispatcher(answer_llm()), {"jsonrpc": "2.0", "method": "reasoning.nope", "id": "a"})
    assert response["error"]["code"] == -32601 and response["id"] == "a"
    assert "reasoning.execute, reasoning.strategies" in response["error"]["message"]


@pytest.mark.parametrize(
    "params,fragment",
    [
        ({"query": ""}, "query: String should have at least 1 character"),
        ({"query": "x" * 100_001}, "query length is 100001; the cap is 100000 ([limits] max_query_chars"),
        ({"query": " \x00\x07 "}, "query is empty once whitespace and control characters are removed"),
        ({"query": "q", "strategy": "Bad-Name"}, "strategy: String should match pattern"),
        ({"query": "q", "colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"query": "q", "strategy_config": {"max_tokens": 0}}, "max_tokens: Input should be greater than or equal to 1"),
        ({}, "query: Field required"),
    ],
)
async def test_invalid_params_say_what_to_fix(params, fragment):
    response = await call(dispatcher(ScriptedLLM([])), execute(params))
    error = response["error"]
    assert error["code"] == -32602 and fragment in error["message"]
    assert error["data"]["trace_id"]


async def test_positional_params_are_refused():
    response = await call(dispatcher(ScriptedLLM([])), {"jsonrpc": "2.0", "method": "reasoning.execute", "params": ["q"], "id": 1})
    assert response["error"]["code"] == -32602 and "named parameters" in response["error"]["message"]


async def test_query_is_sanitised_before_the_model_sees_it():
    llm = ScriptedLLM(["<answer>ok</answer>"])
    await call(dispatcher(llm), execute({"query": "  What\x00 is 1+1?\x1b  "}))
    assert llm.requests[0].messages[-1].content == "What is 1+1?"


async def test_unknown_strategy_and_zero_enabled():
    response = await call(dispatcher(ScriptedLLM([])), execute({"query": "q", "strategy": "tree_of_light"}))
    assert response["error"]["code"] == -32002 and response["error"]["data"]["available"] == ["chain_of_thought"]
    response = await call(dispatcher(ScriptedLLM([]), enabled=()), execute({"query": "q"}))
    assert response["error"]["code"] == -32002
    assert "no strategies are enabled" in response["error"]["message"]


@pytest.mark.parametrize(
    "exc,code,error_type",
    [
        (
            ProviderUnavailableError("HTTP 503 from http://10.0.0.7/v1", attempts=3, cause="503", status_code=503),
            -32013,
            "provider_unavailable",
        ),
        (CircuitOpenError("open", retry_after_s=12.5), -32013, "circuit_open"),
        (ProviderRejectedError("HTTP 401 bad key from http://10.0.0.7/v1", status_code=401), -32013, "provider_rejected"),
        (MaxIterationsError("no answer in 5 iterations", {"iterations": [1, 2]}), -32001, "max_iterations"),
        (ModelBehaviorError("unusable"), -32010, "model_behavior"),
        (BudgetExceededError("spent"), -32004, "budget_exceeded"),
    ],
)
async def test_errors_map_to_one_code_each(exc, code, error_type):
    response = await call(dispatcher(ScriptedLLM([exc])), execute({"query": "q"}))
    error = response["error"]
    assert error["code"] == code and error["data"]["error_type"] == error_type
    if error_type == "circuit_open":
        assert error["data"]["retry_after_s"] == 12.5 and "fail fast for another 12.5s" in error["message"]
    if error_type == "max_iterations":
        assert error["data"]["iterations"] == [1, 2]
    if error_type == "provider_unavailable":
        assert error["data"]["attempts"] == 3 and error["message"] == "the model provider failed after 3 attempt(s) (HTTP 503); retry later"
    assert "10.0.0.7" not in json.dumps(error)  # the provider's URL stays in the log


@pytest.mark.parametrize(
    "exc,code,status",
    [
        (MaxIterationsError("no answer in 3 iterations"), -32001, 422),
        (MaxLLMCallsError("no answer in 8 calls"), -32001, 422),
        (UnauthenticatedError("missing credentials"), -32016, 401),
    ],
)
async def test_max_iterations_is_the_specifications_32001_and_unauthenticated_has_its_own_code(exc, code, status):
    error = (await call(dispatcher(ScriptedLLM([exc])), execute({"query": "q"})))["error"]
    assert error["code"] == code and error["data"]["error_type"] == exc.error_type
    assert view_of(code).http_status == status
    # the retired code is answered by nothing, so a client written for the old table cannot misread it
    assert -32009 not in error_table()  # max iterations until 2026-11-28: never answered again


async def test_a_bug_is_an_internal_error_without_details():
    response = await call(dispatcher(ScriptedLLM([KeyError("secret detail")])), execute({"query": "q"}))
    error = response["error"]
    assert error["code"] == -32603 and "secret" not in json.dumps(error)
    assert error["data"]["error_type"] == "internal" and error["data"]["trace_id"]


async def test_notifications_get_no_response_and_batches_answer_in_order():
    llm = answer_llm()
    rpc = dispatcher(llm)
    assert await call(rpc, {"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "q"}}) is None
    assert len(llm.requests) == 1  # the notification still ran
    batch = [
        execute({"query": "a"}, id=1),
        {"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "b"}},
        {"jsonrpc": "2.0", "method": "nope", "id": 3},
        execute({"query": ""}, id=4),
    ]
    responses = await call(rpc, batch)
    assert [r["id"] for r in responses] == [1, 3, 4]
    assert [("result" in r, r.get("error", {}).get("code")) for r in responses] == [(True, None), (False, -32601), (False, -32602)]
    assert await call(rpc, [{"jsonrpc": "2.0", "method": "nope"}]) is None


async def test_batch_calls_get_distinct_trace_ids():
    response, trace_ids = await dispatcher(answer_llm()).handle(json.dumps([execute({"query": "a"}, 1), execute({"query": "b"}, 2)]))
    assert len(set(trace_ids)) == 2
    assert {r["result"]["trace_id"] for r in response} == set(trace_ids)


async def test_logs_carry_the_trace_id_and_never_the_query():
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        response = await call(dispatcher(answer_llm()), execute({"query": "my secret question"}))
    trace_id = response["result"]["trace_id"]
    assert logs and all(e.get("trace_id") == trace_id for e in logs)
    assert "my secret question" not in json.dumps(logs, default=str)


async def test_strategies_method_describes_the_catalogue():
    response = await call(dispatcher(answer_llm()), {"jsonrpc": "2.0", "method": "reasoning.strategies", "id": 1})
    result = response["result"]
    assert result["default_strategy"] == "chain_of_thought"
    assert result["strategies"][0]["system_defaults"] == {"max_tokens": 512}


def test_caller_trace_ids_are_accepted_only_when_well_formed():
    assert accept_trace_id("abc12345-trace") == "abc12345-trace"
    assert accept_trace_id("short") is None and accept_trace_id("bad id with spaces") is None
    assert accept_trace_id(None) is None


def test_every_documented_code_is_raised_by_a_class_of_the_error_tree_and_every_class_is_documented():
    page = (REPO / "docs" / "api.md").read_text()
    documented = {int(c) for c in re.findall(r"^\| (-32\d\d\d) \|", page, re.MULTILINE)}
    protocol = {jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST, jsonrpc.METHOD_NOT_FOUND}
    raised = {cls.code for cls in jsonrpc.error_classes()}
    assert documented - protocol == raised
    for cls in jsonrpc.error_classes():  # each error type answers the REST mirrors with its own status
        error = jsonrpc.error_for(cls("x"))
        assert (error.code, error.http_status) == (cls.code, cls.http_status), cls


def bounded_dispatcher():
    from reasonray.gateway.simulator.inprocess import SimulatedLLM

    return dispatcher(SimulatedLLM(), enabled=("chain_of_thought", "bounded_context"))


@pytest.mark.parametrize(
    "params,fragment",
    [
        ({"query": ""}, "query: String should have at least 1 character"),
        ({"query": "x" * 100_001}, "query length is 100001; the cap is 100000 ([limits] max_query_chars"),  # the same cap
        ({"query": "q", "chunk_size": 4096, "carryover_size": 8192}, "carryover_size must be less than chunk_size"),
        ({"query": "q", "max_iterations": 0}, "max_iterations: Input should be greater than or equal to 1"),
    ],
)
async def test_bounded_context_method_edge_cases_are_invalid_params(params, fragment):
    response = await call(bounded_dispatcher(), {"jsonrpc": "2.0", "method": "reasoning.bounded_context", "params": params, "id": 1})
    assert response["error"]["code"] == -32602 and fragment in response["error"]["message"]


async def test_bounded_context_method_answers_in_the_seeds_shape():
    params = {"query": "[[sim think=20000 answer=11]] go", "max_iterations": 10}
    result = (await call(bounded_dispatcher(), {"jsonrpc": "2.0", "method": "reasoning.bounded_context", "params": params, "id": 1}))[
        "result"
    ]
    assert result["answer"] == "11" and result["total_iterations"] == len(result["iterations"]) >= 3
    assert {"answer", "iterations", "total_tokens", "compute_savings_pct"} <= set(result)


async def test_max_iterations_over_rpc_carries_the_partial_trace():
    params = {"query": "[[sim think=30000 answer=7]] go", "max_iterations": 2}
    error = (await call(bounded_dispatcher(), {"jsonrpc": "2.0", "method": "reasoning.bounded_context", "params": params, "id": 1}))[
        "error"
    ]
    assert error["code"] == -32001 and error["data"]["error_type"] == "max_iterations"
    assert len(error["data"]["iterations"]) == 2 and error["data"]["suggested_max_iterations"] == 4
