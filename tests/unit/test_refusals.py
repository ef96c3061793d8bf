"""Parameters a model refuses: learnt from its first 400 naming each, remembered per endpoint and model, and left
out (or sent in their accepted form) from then on; families known by name start with what they need."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

import reasonray.gateway.openai_client as oc
from reasonray.gateway.families import traits_for
from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.gateway.refusals import RefusalBook, refused_param
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.kernel.tags import extract_answer


@pytest.fixture(scope="module")
def server():
    srv = SimulatorServer(SimulatorSettings(port=0)).start()
    yield srv
    srv.stop()


async def stats(server) -> dict:
    async with httpx.AsyncClient(base_url=server.url) as http:
        return (await http.get("/sim/stats")).json()


def hidden(question: str = "What is 17 * 23?", **kw) -> LLMRequest:
    """A call to a model that thinks out of sight and refuses what OpenAI's reasoning models refuse."""
    return LLMRequest(messages=(user(f"[[sim reasoning=hidden thinking=50]] {question}"),), **kw)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unknown_reasoning_model_learns_each_refusal_once_and_later_calls_go_straight(server, stream):
    book = RefusalBook()
    # counted by tiktoken: no framing probes, so every call the server sees is this test's
    llm = oc.OpenAILLM(
        "acme-reasoner", base_url=server.url, api_key="x", discover=False, stream=stream, refusals=book, tokenizer="tiktoken"
    )
    request = hidden(max_tokens=400, stop=("</answer>",))
    before = await stats(server)
    first = await llm.complete(request)
    after_first = await stats(server)
    # max_tokens, temperature and stop were each refused once, then the call was answered
    assert after_first["rejected"] - before["rejected"] == 3
    assert after_first["requests"] - before["requests"] == 1  # the simulator counts the calls it answered
    assert book.refused(llm.base_url, "acme-reasoner") == {"max_tokens", "temperature", "stop"}
    assert extract_answer(first.text + "</answer>") == "391"
    second = await llm.complete(hidden("What is 6 * 7?", max_tokens=400, stop=("</answer>",)))
    after_second = await stats(server)
    assert after_second["requests"] - after_first["requests"] == 1 and after_second["rejected"] == after_first["rejected"]
    assert extract_answer(second.text + "</answer>") == "42"


async def test_a_refused_stop_is_enforced_on_the_reply_text(server):
    llm = oc.OpenAILLM("acme-reasoner", base_url=server.url, api_key="x", discover=False, refusals=RefusalBook())
    completion = await llm.complete(hidden(stop=("</answer>",), temperature=1.0, max_tokens=400))
    assert "</answer>" not in completion.text and completion.text.rstrip().endswith("391")
    assert completion.finish_reason == "stop" and completion.choices[0].stop_sequence == "</answer>"


async def test_every_client_sharing_a_book_learns_from_the_first(server):
    book = RefusalBook()
    shared: list[tuple[str, str, str]] = []
    book.sink = lambda *entry: shared.append(entry)
    first = oc.OpenAILLM("acme-reasoner", base_url=server.url, api_key="x", discover=False, refusals=book)
    await first.complete(hidden(max_tokens=400))
    assert sorted(p for _, _, p in shared) == ["max_tokens", "temperature"]
    before = await stats(server)
    other = oc.OpenAILLM("acme-reasoner", base_url=server.url, api_key="x", discover=False, refusals=book)
    await other.complete(hidden(max_tokens=400))
    assert (await stats(server))["rejected"] == before["rejected"]
    # a book that loads what another process learnt starts there too, and tells its sink nothing of it
    loaded = RefusalBook(sink=lambda *entry: shared.append(entry))
    loaded.load(list(shared))
    assert loaded.refused(first.base_url, "acme-reasoner") == {"max_tokens", "temperature"} and len(shared) == 2


@pytest.mark.parametrize("model", ["o3", "o4-mini", "gpt-5", "gpt-5-mini", "openai/o1"])
async def test_openais_reasoning_families_start_right_without_any_refusal(server, model):
    llm = oc.OpenAILLM(model, base_url=server.url, api_key="x", discover=False, refusals=RefusalBook())
    before = await stats(server)
    completion = await llm.complete(hidden(stop=("</answer>",), top_p=0.5, presence_penalty=0.2, purpose="final_answer"))
    after = await stats(server)
    assert after["rejected"] == before["rejected"] and after["requests"] - before["requests"] == 1
    assert "</answer>" not in completion.text and "391" in completion.text


def test_families_known_by_name():
    assert traits_for("gpt-5-chat-latest").family == ""  # gpt-5's chat model does not think
    assert traits_for("o1-mini").refuses >= {"system", "temperature"}
    assert traits_for("deepseek-reasoner").refuses == {"logprobs"} and traits_for("deepseek-reasoner").thinks
    assert traits_for("Qwen/Qwen3-8B").prefix_continuation == "continue_final_message"
    assert traits_for("Qwen/Qwen3-30B-A3B-Instruct-2507").family == ""
    assert traits_for("openai/gpt-oss-20b").takes_reasoning_effort
    assert traits_for("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B").family == "deepseek-r1"
    assert traits_for("gpt-4.1").family == "" and not traits_for("llama3").thinks


def fake_server(handler) -> tuple[list[dict], httpx.MockTransport]:
    """An OpenAI-compatible endpoint scripted by `handler(body) -> (status, json)`, recording every body it got."""
    bodies: list[dict] = []

    def respond(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        status, payload = handler(body)
        return httpx.Response(status, json=payload)

    return bodies, httpx.MockTransport(respond)


def answer(text: str) -> dict:
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }


def scripted(model: str, transport: httpx.MockTransport, **kw) -> oc.OpenAILLM:
    llm = oc.OpenAILLM(model, base_url="http://127.0.0.1:9/v1", api_key="x", discover=False, refusals=RefusalBook(), **kw)
    llm._new_client = lambda: openai.AsyncOpenAI(  # type: ignore[method-assign]
        base_url=llm.base_url, api_key="x", max_retries=0, http_client=httpx.AsyncClient(transport=transport)
    )
    return llm


async def test_a_refused_system_message_is_moved_into_the_first_user_message():
    def handler(body):
        if any(m["role"] == "system" for m in body["messages"]):
            error = {
                "message": "Unsupported value: 'messages[0].role' does not support 'system' with this model.",
                "param": "messages[0].role",
            }
            return 400, {"error": {**error, "type": "invalid_request_error", "code": "unsupported_value"}}
        return 200, answer("ok")

    bodies, transport = fake_server(handler)
    llm = scripted("acme-mini", transport)
    completion = await llm.complete(LLMRequest(messages=(system("Be brief."), user("Hi"))))
    assert completion.text == "ok" and len(bodies) == 2
    assert bodies[1]["messages"] == [{"role": "user", "content": "Be brief.\n\nHi"}]
    await llm.complete(LLMRequest(messages=(system("Be brief."), user("Again"))))
    assert len(bodies) == 3 and bodies[2]["messages"][0]["role"] == "user"


async def test_a_refused_call_is_not_a_provider_failure_for_the_breaker():
    from reasonray.gateway.resilience import CircuitBreaker, ResilientLLM, RetryPolicy

    def handler(body):
        if "logprobs" in body:
            return 400, {"error": {"message": "logprobs is not supported for this model", "type": "invalid_request_error"}}
        return 200, answer("ok")

    bodies, transport = fake_server(handler)
    breaker = CircuitBreaker(minimum_calls=1, reset_timeout_s=60)
    resilient = ResilientLLM(scripted("acme", transport), RetryPolicy(max_attempts=1), breaker)
    completion = await resilient.complete(LLMRequest(messages=(user("Hi"),), logprobs=2))
    assert completion.text == "ok" and completion.attempts == 1 and breaker.state == "closed" and breaker.failure_rate() == 0
    assert [("logprobs" in b, "top_logprobs" in b) for b in bodies] == [(True, True), (False, False)]


async def test_extra_body_is_merged_into_the_call_the_request_winning():
    bodies, transport = fake_server(lambda body: (200, answer("ok")))
    llm = scripted("Qwen/Qwen3-8B", transport, extra_body={"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20})
    await llm.complete(LLMRequest(messages=(user("Hi"),), extra_body={"top_k": 5}))
    assert bodies[0]["chat_template_kwargs"] == {"enable_thinking": False} and bodies[0]["top_k"] == 5


def test_a_refusal_is_read_from_the_param_member_or_the_names_the_message_quotes():
    sent = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stop": ["x"], "temperature": 0.0}
    assert (
        refused_param("Unsupported parameter: 'max_tokens' is not supported. Use 'max_completion_tokens' instead.", None, sent)
        == "max_tokens"
    )
    assert refused_param("Unsupported parameter.", "stop", sent) == "stop"
    assert refused_param("Unrecognized request argument supplied: temperature", None, sent) == "temperature"
    assert refused_param("Unsupported parameter: 'top_p'", None, sent) is None  # not sent: not what it refused
    assert refused_param("the prompt is too long", None, sent) is None
    # a value out of range is not a refusal: temperature stays for the next calls
    assert refused_param("'temperature' must be less than or equal to 2", "temperature", sent) is None
    assert refused_param("stop: Extra inputs are not permitted", None, sent) == "stop"  # vLLM's strict schema
    assert refused_param("`temperature` is deprecated for this model.", None, sent) == "temperature"  # Anthropic's newer models
