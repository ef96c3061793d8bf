"""What ReasonRay returns and accepts for a model that thinks, on every surface: JSON-RPC results carry the thinking
behind the answer and the run's reasoning tokens; /v1 carries them as vLLM and DeepSeek do (`reasoning_content`,
`completion_tokens_details.reasoning_tokens`), its stream tells the model's thinking from ReasonRay's progress;
`reasoning_effort`, `thinking_budget` and (for trusted callers) `extra_body` reach every model call; thinking sent
back in a /v1 history never reaches the model. In process, with strict scripted models."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from reasonray.api.access.auth import CURRENT_PRINCIPAL, Principal
from reasonray.api.access.tenancy import install_guard
from reasonray.api.app import Backends, build_application, local_dispatcher, local_guard
from reasonray.api.service import MAX_REASONING_CHARS
from reasonray.api.surfaces.openai_compat import OpenAICompat, Reply, respond
from reasonray.api.surfaces.streaming import public_event
from reasonray.gateway.protocol import LLMRequest
from reasonray.gateway.testing import FunctionLLM, ScriptedLLM, Thinking
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.config import ReasoningSettings, Settings
from reasonray.kernel.events import LLMInvocation

THOUGHT = "The user asks for 17 * 23. 17 * 20 is 340, 17 * 3 is 51, so 391."
REASONING = ReasoningSettings(enabled_strategies=["chain_of_thought", "self_consistency"], default_strategy="chain_of_thought")


def thinker(thought: str = THOUGHT, answer: str = "391", reasoning_tokens: int | None = None) -> FunctionLLM:
    """Every call thinks `thought`, then answers."""
    return FunctionLLM(lambda request: Thinking(thought, f"<answer>{answer}</answer>", reasoning_tokens=reasoning_tokens))


async def execute(rpc, **params):
    payload, _ = await rpc.handle_payload({"jsonrpc": "2.0", "method": "reasoning.execute", "params": params, "id": 1}, None)
    return payload


def compat_over(llm) -> OpenAICompat:
    return OpenAICompat(local_dispatcher(REASONING, llm), counter_for_model("simulated"), "simulated")


def body(**request) -> bytes:
    return json.dumps({"model": "reasonray", "messages": [{"role": "user", "content": "What is 17 * 23?"}], **request}).encode()


# -- JSON-RPC ---------------------------------------------------------------------------------------------------


async def test_execute_returns_the_thinking_behind_the_answer_and_the_runs_reasoning_tokens():
    rpc = local_dispatcher(REASONING, thinker(reasoning_tokens=120))
    result = (await execute(rpc, query="What is 17 * 23?"))["result"]
    assert result["answer"] == "391" and result["reasoning"] == THOUGHT
    assert result["metrics"]["reasoning_tokens"] == 120 and result["metrics"]["completion_tokens"] > 120


async def test_bounded_context_returns_the_thinking_behind_its_answer_too():
    rpc = local_dispatcher(ReasoningSettings(enabled_strategies=["bounded_context"], default_strategy="bounded_context"), thinker())
    payload, _ = await rpc.handle_payload(
        {"jsonrpc": "2.0", "method": "reasoning.bounded_context", "params": {"query": "What is 17 * 23?"}, "id": 1}, None
    )
    assert payload["result"]["answer"] == "391" and payload["result"]["reasoning"] == THOUGHT


async def test_the_reasoning_is_that_of_the_last_reply_giving_the_answer_and_is_bounded():
    # three samples: the majority's last sample thought the second way; the stray one's thinking is not returned
    replies = [
        Thinking("first way " * 5, "<answer>391</answer>", reasoning_tokens=10),
        Thinking("stray " * 5, "<answer>390</answer>", reasoning_tokens=10),
        Thinking("x" * 50_000 + " second way", "<answer>391</answer>", reasoning_tokens=10),
    ]
    llm = ScriptedLLM(replies)
    rpc = local_dispatcher(REASONING, llm)
    result = (await execute(rpc, query="What is 17 * 23?", strategy="self_consistency", strategy_config={"samples": 3}))["result"]
    llm.assert_complete()
    assert result["answer"] == "391" and result["metrics"]["reasoning_tokens"] == 30
    assert len(result["reasoning"]) <= MAX_REASONING_CHARS and result["reasoning"].endswith("x second way")
    assert "characters of thinking omitted" in result["reasoning"]


async def test_reasoning_effort_and_thinking_budget_reach_every_call_and_a_strategy_config_wins():
    llm = thinker()
    rpc = local_dispatcher(REASONING, llm)
    ok = await execute(rpc, query="What is 17 * 23?", strategy="self_consistency", reasoning_effort="low", thinking_budget=300)
    assert "result" in ok, ok
    assert [(r.reasoning_effort, r.thinking_budget) for r in llm.requests] == [("low", 300)] * len(llm.requests) and llm.requests
    llm.requests.clear()
    await execute(rpc, query="What is 17 * 23?", reasoning_effort="low", strategy_config={"reasoning_effort": "high"})
    assert [r.reasoning_effort for r in llm.requests] == ["high"]
    refused = await execute(rpc, query="What is 17 * 23?", reasoning_effort="extreme")
    assert refused["error"]["code"] == -32602 and "reasoning_effort" in refused["error"]["message"]


async def test_the_requests_reasoning_effort_wins_over_the_systems_config():
    llm = thinker()
    reasoning = REASONING.model_copy(
        update={"strategies": {"chain_of_thought": {"default_reasoning_effort": "low", "default_thinking_budget": 64}}}
    )
    rpc = local_dispatcher(reasoning, llm)
    result = (await execute(rpc, query="What is 17 * 23?", reasoning_effort="high"))["result"]
    assert [(r.reasoning_effort, r.thinking_budget) for r in llm.requests] == [("high", 64)]
    assert result["resolution"]["config_sources"]["reasoning_effort"] == "request"
    assert result["resolution"]["config_sources"]["thinking_budget"] == "system"


async def test_extra_body_reaches_every_call_with_authentication_off_and_cannot_redirect_the_call():
    llm = thinker()
    rpc = local_dispatcher(REASONING, llm)
    passed = {"chat_template_kwargs": {"enable_thinking": False}}
    assert "result" in await execute(rpc, query="What is 17 * 23?", extra_body=passed)
    assert [r.extra_body for r in llm.requests] == [passed]
    refused = await execute(rpc, query="What is 17 * 23?", extra_body={"model": "another"})
    assert refused["error"]["code"] == -32602 and "extra_body may not set model" in refused["error"]["message"]


def guarded(llm) -> OpenAICompat:
    settings = Settings(reasoning=REASONING, auth={"jwt_secret": "u" * 40})  # the default roles
    application = build_application(settings, llm=llm, backends=Backends(cache=None, memory=None))
    install_guard(application.dispatcher, local_guard(settings, application))
    return OpenAICompat(application.dispatcher, counter_for_model("simulated"), "simulated")


async def test_extra_body_is_refused_to_a_reasoner_naming_the_field_and_accepted_from_an_operator():
    llm = thinker()
    compat = guarded(llm)
    passed = {"chat_template_kwargs": {"enable_thinking": False}}
    CURRENT_PRINCIPAL.set(Principal("alice", ("reasoner",)))
    refused = await execute(compat.rpc, query="What is 17 * 23?", extra_body=passed)
    assert refused["error"]["code"] == -32003 and "llm.extra_body" in refused["error"]["message"]
    v1 = await respond(compat, body(reasoning={"extra_body": passed}), "t-eb-1")
    assert isinstance(v1, Reply) and v1.status == 403, v1
    assert v1.body["error"]["param"] == "reasoning.extra_body" and "extra_body" in v1.body["error"]["message"]
    assert llm.requests == []
    plain = await respond(compat, body(), "t-eb-2")  # the reasoner may run, without extra_body
    assert isinstance(plain, Reply) and plain.status == 200
    CURRENT_PRINCIPAL.set(Principal("olga", ("operator",)))
    accepted = await respond(compat, body(reasoning={"extra_body": passed}), "t-eb-3")
    assert isinstance(accepted, Reply) and accepted.status == 200, accepted
    assert llm.requests[-1].extra_body == passed


# -- /v1 --------------------------------------------------------------------------------------------------------


async def test_a_v1_message_carries_the_thinking_as_reasoning_content_and_its_tokens_in_usage():
    compat = compat_over(thinker(reasoning_tokens=120))
    reply = await respond(compat, body(), "t-v1-1")
    assert isinstance(reply, Reply) and reply.status == 200
    message = reply.body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "391", "reasoning_content": THOUGHT}
    assert reply.body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 120
    assert reply.body["reasonray"]["metrics"]["reasoning_tokens"] == 120
    parsed = ChatCompletion.model_validate(reply.body)  # the openai SDK keeps the field in model_extra
    assert parsed.choices[0].message.model_extra["reasoning_content"] == THOUGHT
    assert parsed.usage is not None and parsed.usage.completion_tokens_details.reasoning_tokens >= 120


async def test_a_model_that_does_not_think_sends_no_reasoning_content():
    compat = compat_over(FunctionLLM(lambda request: "<answer>391</answer>"))
    reply = await respond(compat, body(), "t-v1-2")
    assert reply.body["choices"][0]["message"] == {"role": "assistant", "content": "391"}


async def stream_chunks(compat, **request) -> list[dict]:
    stream = await respond(compat, body(stream=True, stream_options={"include_usage": True}, **request), "t-v1-s")
    payloads = [p async for p in stream]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


async def test_a_stream_tells_the_models_thinking_from_reasonrays_progress():
    chunks = await stream_chunks(compat_over(thinker(reasoning_tokens=120)))
    reasoning = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content")]
    progress = [c for c in reasoning if c["reasonray"]["kind"] == "progress"]
    thinking = [c for c in reasoning if c["reasonray"]["kind"] == "thinking"]
    assert progress and all(c["reasonray"]["event"] for c in progress)
    assert any(c["choices"][0]["delta"]["reasoning_content"].startswith("[llm]") for c in progress)
    assert "".join(c["choices"][0]["delta"]["reasoning_content"] for c in thinking) == THOUGHT  # as the plain message's
    content = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert chunks.index(thinking[-1]) < content  # the thinking comes before the answer
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 120
    parsed = ChatCompletionChunk.model_validate(thinking[0])
    assert parsed.model_extra["reasonray"] == {"kind": "thinking"} and parsed.choices[0].delta.model_extra["reasoning_content"] == THOUGHT


async def test_a_stream_without_progress_carries_only_the_models_thinking():
    chunks = await stream_chunks(compat_over(thinker()), reasoning={"progress": False})
    reasoning = [
        c["choices"][0]["delta"]["reasoning_content"] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content")
    ]
    assert reasoning == [THOUGHT]


async def test_v1_reasoning_effort_and_thinking_budget_reach_the_model():
    llm = thinker()
    reply = await respond(compat_over(llm), body(reasoning_effort="high", thinking_budget=2048), "t-v1-3")
    assert reply.status == 200, reply
    assert [(r.reasoning_effort, r.thinking_budget) for r in llm.requests] == [("high", 2048)]


async def test_v1_refuses_reasoning_settings_it_cannot_pass_to_a_tool_turn():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    reply = await respond(compat_over(thinker()), body(tools=tools, reasoning_effort="low"), "t-v1-4")
    assert reply.status == 400 and reply.body["error"]["param"] == "reasoning_effort"


@pytest.mark.parametrize(
    "earlier",
    [
        {"role": "assistant", "content": "The answer is 391.", "reasoning_content": "SECRET: 17 * 20 is 340"},
        {"role": "assistant", "content": "<think>SECRET: 17 * 20 is 340</think>The answer is 391."},
        {"role": "assistant", "content": "SECRET: 17 * 20 is 340</think>The answer is 391."},  # R1 form: no opening tag
    ],
)
async def test_thinking_sent_back_in_the_history_never_reaches_the_model(earlier):
    llm = thinker()
    messages = [{"role": "user", "content": "What is 17 * 23?"}, earlier, {"role": "user", "content": "And 17 * 24?"}]
    reply = await respond(compat_over(llm), body(messages=messages), "t-v1-5")
    assert reply.status == 200, reply
    shown = " ".join(m.content or "" for r in llm.requests for m in r.messages)
    assert "SECRET" not in shown and "The answer is 391." in shown


# -- the JSON-RPC stream --------------------------------------------------------------------------------------


def test_a_streamed_event_shows_the_models_thinking_only_with_the_trace():
    event = LLMInvocation(
        trace_id="t",
        strategy="chain_of_thought",
        messages=[],
        responses=["<answer>391</answer>"],
        finish_reason="stop",
        prompt_tokens=5,
        completion_tokens=9,
        latency_ms=1.0,
        cached=False,
        attempts=1,
        model="m",
        simulated=False,
        reasoning=[THOUGHT],
        reasoning_tokens=4,
    )
    assert "reasoning" not in json.loads(public_event(event, full_text=False))
    assert json.loads(public_event(event, full_text=False))["reasoning_tokens"] == 4
    assert json.loads(public_event(event, full_text=True))["reasoning"] == [THOUGHT]


def test_requests_carry_the_runs_settings_as_the_gateway_sees_them():
    # the seam the gateway reads: the run's settings are fields of the LLMRequest
    request = LLMRequest(messages=(), reasoning_effort="low", thinking_budget=3, extra_body={"a": 1})
    assert (request.reasoning_effort, request.thinking_budget, request.extra_body) == ("low", 3, {"a": 1})


# -- sessions ---------------------------------------------------------------------------------------------------


async def test_a_session_keeps_the_answer_not_the_thinking_and_a_reply_cut_while_thinking_is_no_answer(tmp_path):
    from reasonray.reasoner.builtin_tools import builtin_toolbox
    from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
    from reasonray.stores.sessions import SqliteSessionStore

    llm = ScriptedLLM([Thinking("SECRET: the capital of France", "Paris"), Thinking("SECRET: Lyon? no, wait", unfinished=True)])
    sessions = LocalSessions(
        SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)
    )
    rpc = local_dispatcher(REASONING, llm, sessions=sessions)

    async def call(method, params):
        payload, _ = await rpc.handle_payload({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, None)
        return payload

    sid = (await call("session.create", {}))["result"]["session_id"]
    first = (await call("session.turn", {"session_id": sid, "message": "Capital of France?"}))["result"]
    assert first["answer"] == "Paris" and first["usage"]["reasoning_tokens"] > 0
    cut = (await call("session.turn", {"session_id": sid, "message": "And its second city?"}))["error"]
    llm.assert_complete()
    assert cut["code"] == -32010 and "inside its thinking" in cut["message"]
    second_prompt = " ".join(m.content or "" for m in llm.requests[1].messages)
    assert "Paris" in second_prompt and "SECRET" not in second_prompt
    assert (await call("session.get", {"session_id": sid}))["result"]["status"] == "idle"


# -- memory -----------------------------------------------------------------------------------------------------


async def test_the_memory_judge_and_extraction_see_the_answer_never_the_thinking(tmp_path):
    from reasonray.kernel.config import load_settings
    from tests.unit.memory_harness import local_memory, make_bank

    def reply(request: LLMRequest) -> Thinking:
        if request.purpose == "judge":
            return Thinking("SECRET judging", "<status>success</status>")
        if request.purpose == "extract_success":
            return Thinking("SECRET extracting", "<memory><title>Multiply</title><description>d</description><content>c</content></memory>")
        return Thinking("SECRET: 17 * 20 is 340", "<answer>391</answer>")

    llm = FunctionLLM(reply)
    settings = load_settings()
    rpc = local_dispatcher(
        REASONING, llm, data_dir=tmp_path, memory=local_memory(make_bank(tmp_path / "bank")), memory_settings=settings.memory
    )
    result = (await execute(rpc, query="What is 17 * 23?", memory={"learn": True, "workspace": "w"}))["result"]
    assert result["answer"] == "391" and result["memory"]["judged_by"] == "llm_judge"
    learning = [r for r in llm.requests if r.purpose in ("judge", "extract_success")]
    assert [r.purpose for r in learning] == ["judge", "extract_success"]
    shown = " ".join(m.content or "" for r in learning for m in r.messages)
    assert "391" in shown and "SECRET" not in shown
    assert result["reasoning"] == "SECRET: 17 * 20 is 340"  # the answer's own thinking, not the judge's


# -- the openai SDK, unchanged, over the /v1 mapping ---------------------------------------------------------------


def sdk_over(compat: OpenAICompat):
    """The official openai client, its HTTP answered by the /v1 mapping in this process."""
    import httpx
    from openai import AsyncOpenAI

    async def handle(request: httpx.Request) -> httpx.Response:
        reply = await respond(compat, request.content, "t-sdk")
        if isinstance(reply, Reply):
            return httpx.Response(reply.status, json=reply.body)
        events = b"".join([f"data: {payload}\n\n".encode() async for payload in reply])
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events)

    transport = httpx.MockTransport(handle)
    return AsyncOpenAI(base_url="http://reasonray.local/v1", api_key="unused", http_client=httpx.AsyncClient(transport=transport))


async def test_the_openai_sdk_sends_reasoning_effort_and_reads_the_thinking_plain_and_streamed():
    llm = thinker(reasoning_tokens=120)
    client = sdk_over(compat_over(llm))
    ask = {"model": "reasonray", "messages": [{"role": "user", "content": "What is 17 * 23?"}], "reasoning_effort": "medium"}
    completion = await client.chat.completions.create(**ask, extra_body={"thinking_budget": 500})
    assert completion.choices[0].message.content == "391"
    assert completion.choices[0].message.model_extra["reasoning_content"] == THOUGHT
    assert completion.usage.completion_tokens_details.reasoning_tokens >= 120
    assert (llm.requests[-1].reasoning_effort, llm.requests[-1].thinking_budget) == ("medium", 500)
    thinking, progress, answer = "", [], ""
    async for chunk in await client.chat.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            text = (choice.delta.model_extra or {}).get("reasoning_content")
            if text and chunk.model_extra["reasonray"]["kind"] == "thinking":
                thinking += text
            elif text:
                progress.append(text)
            answer += choice.delta.content or ""
    await client.close()
    assert (thinking, answer) == (THOUGHT, "391") and progress and THOUGHT not in "".join(progress)


# -- the simulated model in each form a server hands thinking over in -------------------------------------------


@pytest.mark.parametrize("form", ["field", "r1", "hidden"])
async def test_v1_over_the_simulated_thinking_model_in_each_form(form):
    from reasonray.gateway.simulator.inprocess import SimulatedLLM

    compat = compat_over(SimulatedLLM())
    question = [{"role": "user", "content": f"[[sim reasoning={form} thinking=200]] What is 17 * 23?"}]
    plain = (await respond(compat, body(messages=question), "t-sim-1")).body
    message, metrics = plain["choices"][0]["message"], plain["reasonray"]["metrics"]
    assert message["content"] == "391" and metrics["reasoning_tokens"] >= 200
    assert plain["usage"]["completion_tokens_details"]["reasoning_tokens"] >= metrics["reasoning_tokens"]
    if form == "hidden":  # OpenAI's reasoning models: only the count
        assert "reasoning_content" not in message
    else:
        assert message["reasoning_content"].startswith("Thought 0:") and "[thought 0/200]" in message["reasoning_content"]
    chunks = await stream_chunks(compat, messages=question)
    thinking = "".join(c["choices"][0]["delta"]["reasoning_content"] for c in chunks if c.get("reasonray", {}).get("kind") == "thinking")
    assert thinking == message.get("reasoning_content", "")


async def test_a_json_answer_keeps_the_thinking_behind_the_answer_it_restates():
    compat = compat_over(thinker(answer="42"))
    reply = await respond(compat, body(response_format={"type": "json_object"}), "t-json")
    message = reply.body["choices"][0]["message"]
    assert json.loads(message["content"]) in ({"answer": "42"}, {"answer": 42})
    assert message["reasoning_content"] == THOUGHT
