"""One error view: every failure has one HTTP status, whichever surface answers it (reasonray/api/errors.py).

The same failures are provoked through the REST mirror's path (`Dispatcher.call`, rendered by `rest_error`)
and through the OpenAI surface (`respond`), on one application over the simulated model, and their statuses
compared."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reasonray.api.app import Backends, build_application
from reasonray.api.errors import a2a_refused, error_headers, error_table, openai_error, rest_error, view_of
from reasonray.api.jsonrpc import RpcError, error_classes
from reasonray.api.surfaces.openai_compat import OpenAICompat, Reply, respond
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.config import BudgetSettings, ReasoningSettings, Settings
from reasonray.kernel.errors import (
    BudgetExceededError,
    ForbiddenError,
    OverloadedError,
    RateLimitedError,
    StrategyUnavailableError,
)
from reasonray.kernel.telemetry import NoMetrics


def test_classes_that_share_a_code_share_their_whole_view():
    seen: dict[int, tuple[int, str, str]] = {}
    for cls in error_classes():
        shown = (cls.http_status, cls.openai_type, cls.a2a_state)
        assert seen.setdefault(cls.code, shown) == shown, (cls.__name__, cls.code, shown, seen[cls.code])
    assert set(seen) <= set(error_table())


def test_only_refusals_before_a_run_reject_an_a2a_task_and_they_keep_their_status():
    rejected = {code for code, view in error_table().items() if view.a2a_state == "rejected"}
    assert rejected == {-32016, -32003, -32012}
    assert {code: view_of(code).http_status for code in rejected} == {-32016: 401, -32003: 403, -32012: 429}
    assert a2a_refused({"code": ForbiddenError.code}) and not a2a_refused({"code": BudgetExceededError.code})


def test_an_unknown_code_is_shown_as_an_internal_error():
    assert (view_of(-1).http_status, view_of(-1).openai_type) == (500, "server_error")


def test_the_openai_shape_names_the_error_type_and_carries_the_json_rpc_error():
    status, body = openai_error({"code": -32004, "message": "budget spent", "data": {"error_type": "budget_exceeded"}})
    assert status == 422 and body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "budget_exceeded"
    assert body["error"]["reasonray"] == {"code": -32004, "data": {"error_type": "budget_exceeded"}}
    assert openai_error({"code": StrategyUnavailableError.code, "message": "no"})[1]["error"]["code"] == "model_not_found"


def test_headers_say_when_to_come_back_for_overload_and_rate_limits_only():
    overloaded = RpcError(OverloadedError.code, "busy", {"retry_after_s": 1.2})
    limited = RpcError(RateLimitedError.code, "slow down", {"retry_after_s": 2.5, "limit": 10})
    assert error_headers(overloaded.body()) == {"Retry-After": "2"}
    assert error_headers(limited.body()) == {
        "Retry-After": "3",
        "X-RateLimit-Limit": "10",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "3",
    }
    assert error_headers({"code": -32004, "message": "x"}) == {}


@pytest.fixture
def application():
    settings = Settings(
        reasoning=ReasoningSettings(enabled_strategies=["chain_of_thought", "bounded_context"], default_strategy="chain_of_thought"),
        budget=BudgetSettings(max_total_tokens=5),  # every run spends more
    )
    return build_application(settings, llm=SimulatedLLM(), backends=Backends(cache=None, memory=None, metrics=NoMetrics()), data_dir=None)


# (failure, its JSON-RPC code, the REST mirror's params of reasoning.execute, the OpenAI request that provokes it)
CASES: list[tuple[str, int, dict[str, Any], dict[str, Any]]] = [
    ("unknown strategy", -32002, {"query": "What is 2 + 2?", "strategy": "telepathy"}, {"model": "reasonray/telepathy"}),
    ("invalid params", -32602, {"query": "   "}, {"messages": [{"role": "user", "content": "   "}]}),
    (
        "invalid strategy config",
        -32602,
        {"query": "What is 2 + 2?", "strategy_config": {"temperature": "hot"}},
        {"reasoning": {"strategy_config": {"temperature": "hot"}}},
    ),
    ("budget exceeded", -32004, {"query": "What is 2 + 2?"}, {}),
    ("unknown agent", -32005, {"query": "What is 2 + 2?", "agent_id": "nobody"}, {"reasoning": {"agent_id": "nobody"}}),
]


@pytest.mark.parametrize(("failure", "code", "params", "request_"), CASES, ids=[c[0] for c in CASES])
async def test_rest_and_openai_answer_the_same_failure_with_the_same_status(application, failure, code, params, request_):
    with pytest.raises(RpcError) as raised:
        await application.dispatcher.call("reasoning.execute", params, "trace-rest-1")
    assert raised.value.code == code, (failure, raised.value.body())
    rest_status, rest_body, _ = rest_error(raised.value.body())
    openai = OpenAICompat(application.dispatcher, counter_for_model("simulated"), "simulated")
    request = {"model": "reasonray", "messages": [{"role": "user", "content": "What is 2 + 2?"}], **request_}
    reply = await respond(openai, json.dumps(request).encode(), "trace-openai-1")
    assert isinstance(reply, Reply), failure
    assert reply.status == rest_status, (failure, reply.status, rest_status, reply.body, rest_body)
    assert reply.status >= 400 and reply.body["error"]["type"] == view_of(rest_body["error"]["code"]).openai_type
    if "reasonray" in reply.body["error"]:  # the run's own error (not the surface's parsing): the same code
        assert reply.body["error"]["reasonray"]["code"] == rest_body["error"]["code"]
