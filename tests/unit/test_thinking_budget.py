"""How long a model thinks, and how long a call on it may take: reasoning_effort sent where the model takes it and
turned into a thinking budget where not, budgets held by budget forcing through prefix continuation, caps that
leave room for the thinking, and streamed calls timed out when their tokens stop, not while they come."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

import reasonray.gateway.openai_client as oc
from reasonray.gateway.errors import TransientProviderError
from reasonray.gateway.families import EFFORT_BUDGET
from reasonray.gateway.protocol import LLMRequest, user
from reasonray.gateway.refusals import RefusalBook
from reasonray.gateway.simulator.reasoning import THOUGHT
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.kernel.tags import extract_answer

DEFAULTS = {"default": 1024, "score": 256}


@pytest.fixture(scope="module")
def server():
    srv = SimulatorServer(SimulatorSettings(port=0)).start()
    yield srv
    srv.stop()


def ask(form: str, thinking: int, **kw) -> LLMRequest:
    return LLMRequest(messages=(user(f"[[sim reasoning={form} thinking={thinking}]] What is 17 * 23?"),), **kw)


def simulated(server, model: str, **kw) -> oc.OpenAILLM:
    return oc.OpenAILLM(model, base_url=server.url, api_key="x", discover=False, refusals=RefusalBook(), tokenizer="tiktoken", **kw)


async def test_a_budget_cut_thinking_is_closed_and_continued_into_an_answer(server):
    llm = simulated(server, "Qwen/Qwen3-8B")
    completion = await llm.complete(ask("field", 600, thinking_budget=80))
    assert completion.thinking_control == "forced"
    assert extract_answer(completion.text) == "391" and not completion.thinking_unfinished
    # the thinking stopped at the budget: its markers go no further than what 80 tokens hold
    assert completion.reasoning and max(int(d) for d, _ in THOUGHT.findall(completion.reasoning)) < 80
    assert completion.usage.reasoning_tokens == 80 and completion.usage.completion_tokens > 80


async def test_thinking_within_the_budget_is_one_call(server):
    llm = simulated(server, "Qwen/Qwen3-8B")
    completion = await llm.complete(ask("field", 60, thinking_budget=400))
    assert completion.thinking_control == "forced" and extract_answer(completion.text) == "391"
    assert completion.usage.reasoning_tokens >= 60 and "So I am done thinking" in completion.reasoning


async def test_continued_thinking_carries_on_from_the_text_given(server):
    llm = simulated(server, "Qwen/Qwen3-8B")
    cut = await llm.complete(ask("field", 300, max_tokens=60))
    assert cut.thinking_unfinished
    resumed = await llm.complete(ask("field", 300, continue_thinking=cut.reasoning))
    marks = [int(d) for d, _ in THOUGHT.findall(resumed.reasoning)]
    assert marks and marks[0] >= max(int(d) for d, _ in THOUGHT.findall(cut.reasoning))
    assert extract_answer(resumed.text) == "391" and resumed.thinking_control == "continued"
    # a continuation cut again stays unfinished, for the next call to carry on: no budget asked for an answer
    again = await llm.complete(ask("field", 300, continue_thinking=cut.reasoning, max_tokens=40))
    assert again.thinking_unfinished and again.text == "" and again.reasoning and again.usage.completion_tokens == 40


def fake_server(handler) -> tuple[list[dict], httpx.MockTransport]:
    """An OpenAI-compatible endpoint scripted by `handler(body) -> httpx.Response`, recording every body it got."""
    bodies: list[dict] = []

    async def respond(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        return handler(body)

    return bodies, httpx.MockTransport(respond)


def answer(text: str, reasoning: str = "", reasoning_tokens: int = 0) -> httpx.Response:
    message = {"role": "assistant", "content": text, **({"reasoning_content": reasoning} if reasoning else {})}
    usage = {"prompt_tokens": 5, "completion_tokens": 2 + reasoning_tokens, "total_tokens": 7 + reasoning_tokens}
    usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    payload = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "usage": usage}
    payload["choices"] = [{"index": 0, "message": message, "finish_reason": "stop"}]
    return httpx.Response(200, json=payload)


def scripted(model: str, transport: httpx.MockTransport, **kw) -> oc.OpenAILLM:
    llm = oc.OpenAILLM(
        model, base_url="http://127.0.0.1:9/v1", api_key="x", discover=False, refusals=RefusalBook(), tokenizer="tiktoken", **kw
    )
    llm._new_client = lambda: openai.AsyncOpenAI(  # type: ignore[method-assign]
        base_url=llm.base_url, api_key="x", max_retries=0, http_client=httpx.AsyncClient(transport=transport)
    )
    return llm


async def test_reasoning_effort_is_sent_to_a_model_that_takes_it_and_a_budget_becomes_the_nearest_effort():
    bodies, transport = fake_server(lambda body: answer("ok", reasoning_tokens=30))
    llm = scripted("o4-mini", transport)
    await llm.complete(LLMRequest(messages=(user("Hi"),), reasoning_effort="high"))
    done = await llm.complete(LLMRequest(messages=(user("Hi"),), thinking_budget=500))
    assert [b["reasoning_effort"] for b in bodies] == ["high", "low"] and done.thinking_control == "native"
    assert "max_tokens" not in bodies[0] and "temperature" not in bodies[0]


async def test_reasoning_effort_becomes_a_thinking_budget_on_a_model_that_takes_none():
    bodies, transport = fake_server(lambda body: answer("ok", reasoning="brief thought", reasoning_tokens=3))
    llm = scripted("Qwen/Qwen3-8B", transport)
    done = await llm.complete(LLMRequest(messages=(user("Hi"),), reasoning_effort="low"))
    assert "reasoning_effort" not in bodies[0] and bodies[0]["max_tokens"] == EFFORT_BUDGET["low"]
    assert done.thinking_control == "forced" and done.text == "ok" and done.reasoning == "brief thought"


async def test_thinking_that_closes_before_the_minimum_is_extended_with_wait():
    replies = iter([answer("early", "short", 5), answer("settled", " and more", 300)])
    bodies, transport = fake_server(lambda body: next(replies))
    llm = scripted("Qwen/Qwen3-8B", transport)
    done = await llm.complete(LLMRequest(messages=(user("Hi"),), min_thinking=100, thinking_budget=2000))
    assert done.text == "settled" and done.reasoning == "short\nWait and more"
    continued = bodies[1]
    assert continued["messages"][-1] == {"role": "assistant", "content": "<think>\nshort\nWait"}
    assert continued["continue_final_message"] is True and continued["add_generation_prompt"] is False


async def test_an_endpoint_that_can_neither_says_so():
    bodies, transport = fake_server(lambda body: answer("ok"))
    done = await scripted("gpt-4.1", transport).complete(LLMRequest(messages=(user("Hi"),), thinking_budget=300, max_tokens=50))
    assert done.thinking_control == "unsupported" and done.text == "ok" and bodies[0]["max_tokens"] == 350


async def test_calls_on_a_thinking_model_leave_room_for_the_thinking():
    bodies, transport = fake_server(lambda body: answer("<score>0.9</score>"))
    await scripted("Qwen/Qwen3-8B", transport, default_max_tokens=DEFAULTS).complete(LLMRequest(messages=(user("Hi"),), purpose="score"))
    await scripted("Qwen/Qwen3-8B", transport, default_max_tokens=DEFAULTS, thinking_room=1000).complete(
        LLMRequest(messages=(user("Hi"),), purpose="score")
    )
    await scripted("gpt-4.1", transport, default_max_tokens=DEFAULTS).complete(LLMRequest(messages=(user("Hi"),), purpose="score"))
    await scripted("my-model", transport, default_max_tokens=DEFAULTS, thinks=True, thinking_room=500).complete(
        LLMRequest(messages=(user("Hi"),), purpose="score")
    )
    assert [b["max_tokens"] for b in bodies] == [256 + 4096, 256 + 1000, 256, 256 + 500]


def chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    payload = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    payload["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return f"data: {json.dumps(payload)}\n\n".encode()


def streaming(pieces) -> httpx.MockTransport:
    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=pieces())

    return httpx.MockTransport(respond)


async def test_a_stalled_stream_times_out_after_the_idle_timeout():
    never = asyncio.Event()

    async def stalled():
        yield chunk("thinking")
        await never.wait()  # the server went quiet: no token will come

    llm = scripted("m", streaming(stalled), stream=True, idle_timeout_s=0.2)
    with pytest.raises(TransientProviderError, match=r"sent no token for idle_timeout_s=0\.2"):
        await llm.complete(LLMRequest(messages=(user("Hi"),)))


async def test_a_slow_steady_stream_is_not_cut_by_its_total_time_only_by_the_overall_deadline():
    async def steady():
        for _ in range(8):
            yield chunk("tok ")
            await asyncio.sleep(0.05)
        yield chunk(None, "stop")
        yield b"data: [DONE]\n\n"

    # each token comes well within the idle timeout, and all of them take twice as long as it
    llm = scripted("m", streaming(steady), stream=True, idle_timeout_s=0.2, timeout_s=0.2)
    done = await llm.complete(LLMRequest(messages=(user("Hi"),)))
    assert done.text == "tok " * 8
    capped = scripted("m", streaming(steady), stream=True, idle_timeout_s=0.2, generation_deadline_s=0.15)
    with pytest.raises(TransientProviderError, match=r"generation_deadline_s=0\.15"):
        await capped.complete(LLMRequest(messages=(user("Hi"),)))


async def test_a_budget_of_zero_closes_the_thinking_given_and_answers_at_once(server):
    llm = simulated(server, "Qwen/Qwen3-8B")
    cut = await llm.complete(ask("field", 300, max_tokens=60))
    forced = await llm.complete(
        ask("field", 300, continue_thinking=cut.reasoning, thinking_budget=0, max_tokens=100, purpose="final_answer")
    )
    assert forced.thinking_control == "forced" and extract_answer(forced.text) == "391"
    assert forced.reasoning == "" and forced.usage.reasoning_tokens == 0


async def test_a_budget_the_endpoint_can_neither_take_nor_force_is_said_in_the_results_metrics():
    """Where an endpoint takes no effort and continues no reply, the run's result says its budget went unenforced."""
    from reasonray.api.app import local_dispatcher
    from reasonray.gateway.protocol import Choice, Completion, Usage
    from reasonray.kernel.config import ReasoningSettings

    class Unforced:
        model = "plain-model"

        async def complete(self, request):
            control = "unsupported" if request.thinking_budget is not None else ""
            choice = Choice(text="<answer>4</answer>")
            return Completion(choices=(choice,), usage=Usage(10, 5), model=self.model, thinking_control=control)

    rpc = local_dispatcher(ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"), Unforced())
    call = {"jsonrpc": "2.0", "id": 1, "method": "reasoning.execute", "params": {"query": "What is 2 + 2?"}}
    plain, _ = await rpc.handle_payload(call)
    assert plain["result"]["metrics"]["thinking_unenforced"] == 0
    budgeted, _ = await rpc.handle_payload({**call, "params": {**call["params"], "thinking_budget": 256, "include_trace": True}})
    result = budgeted["result"]
    assert result["answer"] == "4" and result["metrics"]["thinking_unenforced"] == 1
    assert any(e.get("code") == "thinking_budget_unenforced" for e in result["trace"])
