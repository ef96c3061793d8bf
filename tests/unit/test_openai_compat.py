"""The OpenAI surface in-process (reasonray/api/surfaces/openai_compat.py over local_dispatcher): model names, the
conversation, error shapes, the stream's order, cancellation and the tool round trip."""

from __future__ import annotations

import asyncio
import json

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.api.surfaces.openai_compat import (
    OpenAICompat,
    OpenAIError,
    Reply,
    conversation_query,
    http_error,
    parse_request,
    respond,
    strategy_of,
)
from reasonray.gateway.protocol import Completion, LLMRequest
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
from reasonray.stores.sessions import SqliteSessionStore
from tests.client_tools import WEATHER


class CountingLLM(SimulatedLLM):
    """The simulated model, counting calls and pausing on each, so a run can be cancelled part-way."""

    def __init__(self) -> None:
        super().__init__(ttft_ms=10)
        self.calls = 0

    async def complete(self, request: LLMRequest) -> Completion:
        self.calls += 1
        return await super().complete(request)


@pytest.fixture
def llm():
    return CountingLLM()


@pytest.fixture
def compat(tmp_path, llm):
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    settings = ReasoningSettings(enabled_strategies=["chain_of_thought", "bounded_context"], default_strategy="chain_of_thought")
    return OpenAICompat(local_dispatcher(settings, llm, sessions=sessions), counter_for_model("simulated"), "simulated")


def body(**request) -> bytes:
    return json.dumps({"model": "reasonray", **request}).encode()


def test_model_names_choose_strategies():
    assert strategy_of("reasonray", "gpt-x") is None and strategy_of("gpt-x", "gpt-x") is None
    assert strategy_of("reasonray/tree_of_thought", "m") == "tree_of_thought"
    assert strategy_of("bounded_context:gpt-4o", "m") == "bounded_context"
    for name in ("gpt-4o", "reasonray/Bad-Name", ":x"):
        with pytest.raises(OpenAIError) as error:
            strategy_of(name, "m")
        assert error.value.status == 404 and error.value.body["error"]["code"] == "model_not_found"


def test_the_conversation_becomes_the_query_with_instructions_and_context():
    request = parse_request(
        {
            "model": "reasonray",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": [{"type": "text", "text": "What is 2 + 2?"}]},
            ],
        }
    )
    query, system = conversation_query(request.messages)
    assert system == "Be brief."
    assert query == "Conversation so far:\nuser: Hi\nassistant: Hello\n\nCurrent message:\nWhat is 2 + 2?"


async def test_errors_come_back_in_openais_shape(compat):
    bad_json = await respond(compat, b"{", "trace-0001")
    unknown_strategy = await respond(
        compat, body(model="reasonray/tree_of_thought", messages=[{"role": "user", "content": "hi"}]), "trace-0002"
    )
    no_messages = await respond(compat, body(messages=[]), "trace-0003")
    assert isinstance(bad_json, Reply) and bad_json.status == 400 and bad_json.body["error"]["code"] == "invalid_json"
    assert unknown_strategy.status == 404 and unknown_strategy.body["error"]["code"] == "model_not_found"
    assert unknown_strategy.body["error"]["reasonray"]["code"] == -32002
    assert no_messages.status == 400 and no_messages.body["error"]["param"] == "messages"


async def test_a_stream_that_cannot_start_is_an_http_error_not_an_error_chunk(compat, llm):
    # it was an error payload inside a 200 stream: the SDK raised nothing until it read the chunks
    unknown = await respond(
        compat, body(model="reasonray/tree_of_thought", stream=True, messages=[{"role": "user", "content": "hi"}]), "trace-s1"
    )
    assert isinstance(unknown, Reply) and unknown.status == 404
    assert unknown.body["error"]["code"] == "model_not_found" and unknown.body["error"]["reasonray"]["code"] == -32002
    assert "chain_of_thought" in unknown.body["error"]["message"]
    blank = await respond(compat, body(stream=True, messages=[{"role": "user", "content": "   "}]), "trace-s2")
    assert isinstance(blank, Reply) and blank.status == 400 and blank.body["error"]["code"] == "invalid_params"
    assert llm.calls == 0


async def test_a_stream_sends_role_progress_answer_finish_usage_then_done(compat):
    request = body(
        model="reasonray/bounded_context",
        messages=[{"role": "user", "content": "[[sim think=9000 answer=5]] go"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    stream = await respond(compat, request, "trace-stream-1")
    payloads = [p async for p in stream]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    progress = [c["choices"][0]["delta"]["reasoning_content"] for c in chunks[1:-3]]
    assert any(p.startswith("[iteration 2]") for p in progress) and any(p.startswith("[carryover]") for p in progress)
    answer, finish, usage = chunks[-3:]
    assert answer["choices"][0]["delta"] == {"content": "5"}
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["reasonray"]["trace_id"] == "trace-stream-1"
    metrics = finish["reasonray"]["metrics"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == metrics["completion_tokens"]
    assert usage["usage"]["total_tokens"] == metrics["total_tokens"]
    assert {c["id"] for c in chunks} == {"chatcmpl-trace-stream-1"}


async def test_stopping_the_stream_cancels_the_run(compat, llm):
    request = body(
        model="reasonray/bounded_context",
        messages=[{"role": "user", "content": "[[sim think=60000 answer=5]] go"}],
        stream=True,
        reasoning={"strategy_config": {"chunk_size": 1024, "carryover_size": 512, "max_iterations": 30}},
    )
    stream = await respond(compat, request, "trace-cancel-1")
    async for payload in stream:
        if "[iteration 2]" in payload:
            break
    await stream.aclose()  # what the server does when the client goes away
    at_close = llm.calls
    await asyncio.sleep(0.2)  # about 20 more calls if the run went on
    assert llm.calls - at_close <= 1 and at_close < 10


async def test_tools_run_as_a_session_turn_and_tool_messages_resume_it(compat):
    messages = [{"role": "user", "content": 'Weather? [[sim call=get_weather {"city": "Oslo"}]]'}]
    first = await respond(compat, body(messages=messages, tools=[WEATHER]), "trace-tools-1")
    choice = first.body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith(first.body["reasonray"]["session_id"] + "-")
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    messages += [choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "Snow"}]
    second = await respond(compat, body(messages=messages, tools=[WEATHER]), "trace-tools-2")
    assert second.body["choices"][0]["message"]["content"] == "Snow"
    assert second.body["usage"]["prompt_tokens"] > 0 and second.body["reasonray"]["llm_calls"] == 2
    # results of calls no session waits for (another server's ids) are the context of a run of their own
    stranger = await respond(
        compat,
        body(
            messages=[
                {"role": "user", "content": "What is 6 * 7?"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "Snow"},
            ]
        ),
        "t-000003",
    )
    assert stranger.status == 200 and stranger.body["choices"][0]["message"]["content"] == "42"


# -- with the tenancy guard: refusals are OpenAI errors, streamed requests included ---------------------------

AUTH_ROLES = {
    "reasoner": {"methods": ["*"], "strategies": ["*"]},
    "cot_only": {"methods": ["*"], "strategies": ["chain_of_thought"]},
    "runner": {"methods": ["reasoning.execute"], "strategies": ["*"]},
}


@pytest.fixture
def guarded_compat(tmp_path, llm):
    from reasonray.api.access.tenancy import install_guard
    from reasonray.api.app import Backends, build_application, local_guard
    from reasonray.kernel.config import Settings

    reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought", "bounded_context"], default_strategy="chain_of_thought")
    settings = Settings(data_dir=tmp_path, reasoning=reasoning, auth={"jwt_secret": "u" * 40, "roles": AUTH_ROLES})
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    application = build_application(
        settings, llm=llm, backends=Backends(cache=None, memory=None, sessions=lambda _: sessions), data_dir=tmp_path
    )
    install_guard(application.dispatcher, local_guard(settings, application))
    return OpenAICompat(application.dispatcher, counter_for_model("simulated"), "simulated")


def principal(sub: str | None, *roles: str) -> None:
    """Be this caller for the rest of the test (an async test runs in a context of its own: nothing leaks)."""
    from reasonray.api.access.auth import CURRENT_PRINCIPAL, Principal

    CURRENT_PRINCIPAL.set(Principal(sub, roles) if sub else None)


@pytest.mark.parametrize("stream", [False, True])
async def test_guarded_refusals_are_openai_errors_before_any_chunk(guarded_compat, llm, stream):
    ask = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "stream": stream}
    principal(None)  # nobody (the HTTP gate refuses earlier; the guard refuses too)
    anonymous = await respond(guarded_compat, body(**ask), "trace-a1")
    assert isinstance(anonymous, Reply) and anonymous.status == 401
    assert anonymous.body["error"]["type"] == "authentication_error" and anonymous.body["error"]["reasonray"]["code"] == -32016
    principal("carol", "cot_only")
    forbidden = await respond(guarded_compat, body(model="reasonray/bounded_context", **ask), "trace-a2")
    assert isinstance(forbidden, Reply) and forbidden.status == 403, forbidden
    assert (
        forbidden.body["error"]["type"] == "permission_error"
        and forbidden.body["error"]["reasonray"]["data"]["strategy"] == "bounded_context"
    )
    principal("carol", "reasoner")
    unknown = await respond(guarded_compat, body(model="reasonray/tree_of_thought", **ask), "trace-a3")
    assert isinstance(unknown, Reply) and unknown.status == 404 and unknown.body["error"]["code"] == "model_not_found"
    assert llm.calls == 0
    # a role that may only run reasoning.execute runs a named strategy, streamed or not (no other method is called for it)
    principal("runner-user", "runner")
    allowed = await respond(guarded_compat, body(model="reasonray/chain_of_thought", **ask), "trace-a4")
    if stream:
        payloads = [p async for p in allowed]
        assert payloads[-1] == "[DONE]" and '"content": "4"' in "".join(payloads)
    else:
        assert allowed.status == 200 and allowed.body["choices"][0]["message"]["content"] == "4"


async def test_guarded_tool_round_trips_resume_only_the_callers_own_session(guarded_compat):
    principal("alice", "reasoner")
    messages = [{"role": "user", "content": 'Weather? [[sim call=get_weather {"city": "Oslo"}]]'}]
    first = await respond(guarded_compat, body(messages=messages, tools=[WEATHER]), "trace-t1")
    [call] = first.body["choices"][0]["message"]["tool_calls"]
    answered = [*messages, first.body["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "Snow"}]
    principal("bob", "reasoner")
    stolen = await respond(guarded_compat, body(messages=answered, tools=[WEATHER]), "trace-t2")
    assert stolen.status == 403 and stolen.body["error"]["reasonray"]["code"] == -32003
    principal("alice", "reasoner")
    resumed = await respond(guarded_compat, body(messages=answered, tools=[WEATHER]), "trace-t3")
    assert resumed.status == 200 and resumed.body["choices"][0]["finish_reason"] == "stop"


# -- every request parameter honoured or refused (docs/openai.md, Request parameters) --------------------------


async def test_parameters_out_of_range_unknown_or_not_honourable_are_400s_naming_them(compat, llm):
    question = [{"role": "user", "content": "What is 17 + 25?"}]
    cases = {
        "temperature": {"temperature": 2.5},
        "top_p": {"top_p": -0.1},
        "presence_penalty": {"presence_penalty": 3},
        "logprobs": {"logprobs": True},
        "logit_bias": {"logit_bias": {"1": 5}},
        "store": {"store": True},
        "reasoning_effort": {"reasoning_effort": "extreme"},
        "thinking_budget": {"thinking_budget": -1},
        "verbosity": {"verbosity": "low"},
        "functions": {"functions": [{"name": "f"}]},
        "tool_choice": {"tool_choice": "required"},
        "n": {"n": 2, "stream": True},
        "stop": {"stop": ["a", "b", "c", "d", "e"]},
        "surprise": {"surprise": 1},
    }
    for param, extra in cases.items():
        reply = await respond(compat, body(messages=question, **extra), "t-000010")
        assert isinstance(reply, Reply) and reply.status == 400, (param, reply)
        assert reply.body["error"]["param"] == param and reply.body["error"]["type"] == "invalid_request_error", reply.body
    assert llm.calls == 0


async def test_completion_budget_stop_n_and_the_model_lookup(compat):
    question = [{"role": "user", "content": "What is 17 + 25?"}]
    cut = (await respond(compat, body(messages=question, max_tokens=5), "t-000011")).body
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] <= 5
    stopped = (await respond(compat, body(messages=question, stop="2"), "t-000012")).body
    assert stopped["choices"][0]["message"]["content"] == "4"
    several = (await respond(compat, body(messages=question, n=2, seed=1), "t-000013")).body
    assert [c["message"]["content"] for c in several["choices"]] == ["42", "42"]
    assert [c["trace_id"] for c in several["reasonray"]["choices"]] == ["t-000013", "t-000013-1"]
    assert (await compat.model("reasonray/bounded_context"))["id"] == "reasonray/bounded_context"
    with pytest.raises(OpenAIError) as missing:
        await compat.model("reasonray/tree_of_thought")
    assert missing.value.status == 404 and missing.value.body["error"]["code"] == "model_not_found"


async def test_a_forced_call_returns_the_functions_arguments_and_none_offers_no_tools(compat):
    question = [{"role": "user", "content": "What is 17 + 25?"}]
    answer = {
        "type": "function",
        "function": {"name": "answer", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    }
    forced = (
        await respond(
            compat,
            body(messages=question, tools=[answer, WEATHER], tool_choice={"type": "function", "function": {"name": "answer"}}),
            "t-14",
        )
    ).body
    [call] = forced["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "answer" and json.loads(call["function"]["arguments"]) == {"n": 42}
    plain = (await respond(compat, body(messages=question, tools=[answer], tool_choice="none"), "t-000015")).body
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": "42"}


def test_framework_errors_under_v1_have_openais_shape():
    assert http_error(404, "/v1/nope", "GET").body["error"]["code"] == "unknown_url"
    assert http_error(405, "/v1/models", "DELETE").status == 405


async def test_content_parts_other_than_text_are_refused_by_name(compat):
    image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]}]
    reply = await respond(compat, body(messages=image), "t-000016")
    assert reply.status == 400 and reply.body["error"]["param"] == "messages.0.content" and "image_url" in reply.body["error"]["message"]


async def test_parallel_tool_calls_false_is_honoured_when_forced_and_refused_with_auto(compat):
    question = [{"role": "user", "content": "What is 17 + 25?"}]
    auto = await respond(compat, body(messages=question, tools=[WEATHER], parallel_tool_calls=False), "t-000017")
    assert auto.status == 400 and auto.body["error"]["param"] == "parallel_tool_calls"
    forced = await respond(compat, body(messages=question, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False), "t-18")
    assert forced.status == 200 and len(forced.body["choices"][0]["message"]["tool_calls"]) == 1
