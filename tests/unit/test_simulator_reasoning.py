"""The simulated model's reasoning mode: thinking handed over as `reasoning_content`, as R1 raw text or hidden
(counted only, with OpenAI's refusals), running out of `max_tokens` while thinking, and continued from a prefix."""

from __future__ import annotations

import httpx
import pytest

import reasonray.gateway.openai_client as oc
from reasonray.gateway.protocol import LLMRequest, user
from reasonray.gateway.simulator.engine import SimulatedModel
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.simulator.reasoning import THOUGHT, ReasoningPlan
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.tags import extract_answer

COUNTER = counter_for_model("simulated")
# a name that says the model thinks in its text, as an R1 distill served without a reasoning parser
R1_MODEL = "deepseek-r1-distill-qwen-7b"


@pytest.fixture(scope="module")
def server():
    srv = SimulatorServer(SimulatorSettings(port=0)).start()
    yield srv
    srv.stop()


def ask(form: str, thinking: int = 120, **kw) -> LLMRequest:
    return LLMRequest(messages=(user(f"[[sim reasoning={form} thinking={thinking}]] What is 17 * 23?"),), **kw)


def client(server, form: str, *, stream: bool) -> oc.OpenAILLM:
    model = R1_MODEL if form == "r1" else "simulated"
    return oc.OpenAILLM(model, base_url=server.url, api_key="x", discover=False, stream=stream, max_tokens_param="max_completion_tokens")


# the hidden form refuses every temperature but its default, as OpenAI's reasoning models do
SAMPLING = {"field": {}, "r1": {}, "hidden": {"temperature": 1.0}}


@pytest.mark.parametrize("form", ["field", "r1", "hidden"])
async def test_each_form_gives_the_same_answer_thinking_and_counts_plain_streamed_and_in_process(server, form):
    request = ask(form, **SAMPLING[form])
    got = [await client(server, form, stream=stream).complete(request) for stream in (False, True)]
    got.append(await SimulatedLLM().complete(request))
    for completion in got:
        assert extract_answer(completion.text) == "391" and not completion.thinking_unfinished
        assert "[thought" not in completion.text
        assert (completion.reasoning == "") is (form == "hidden")
        assert 120 <= completion.usage.reasoning_tokens < completion.usage.completion_tokens
    assert got[0].choices == got[1].choices == got[2].choices
    assert got[0].usage == got[1].usage == got[2].usage


@pytest.mark.parametrize("form", ["field", "r1", "hidden"])
async def test_a_small_max_tokens_runs_out_while_thinking(server, form):
    request = ask(form, thinking=400, max_tokens=60, **SAMPLING[form])
    for stream in (False, True):
        completion = await client(server, form, stream=stream).complete(request)
        assert completion.text == "" and completion.thinking_unfinished and completion.finish_reason == "length"
        assert completion.usage.completion_tokens == completion.usage.reasoning_tokens == 60
        assert (completion.reasoning == "") is (form == "hidden")
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/sim/stats")).json()["usage"]["reasoning_tokens"] >= 120


async def test_the_r1_form_has_no_opening_tag_and_no_closing_one_when_cut(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "[[sim reasoning=r1 thinking=100]] What is 2 + 3?"}]}
        done = (await http.post("/chat/completions", json=body)).json()["choices"][0]
        cut = (await http.post("/chat/completions", json={**body, "max_tokens": 20})).json()["choices"][0]
    assert "<think>" not in done["message"]["content"] and "\n</think>\n\n" in done["message"]["content"]
    assert "think>" not in cut["message"]["content"] and cut["finish_reason"] == "length"


async def test_the_field_form_sends_null_content_when_the_budget_ran_out_while_thinking(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        body = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "[[sim reasoning=field]] What is 2 + 3?"}]}
        answer = (await http.post("/chat/completions", json=body)).json()
    message = answer["choices"][0]["message"]
    assert message["content"] is None and message["reasoning_content"] and answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens_details"]["reasoning_tokens"] == 20


@pytest.mark.parametrize(
    "param,value",
    [
        ("max_tokens", 100),
        ("temperature", 0.0),
        ("top_p", 0.5),
        ("stop", ["\n"]),
        ("logprobs", True),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.5),
    ],
)
async def test_the_hidden_form_refuses_what_openais_reasoning_models_refuse_naming_the_parameter(server, param, value):
    async with httpx.AsyncClient(base_url=server.url) as http:
        body = {"model": "o4-mini", "messages": [{"role": "user", "content": "[[sim reasoning=hidden]] What is 2 + 3?"}], param: value}
        answer = await http.post("/chat/completions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and param in error["message"]
    if param == "max_tokens":
        assert "max_completion_tokens" in error["message"]


async def test_the_hidden_form_takes_max_completion_tokens_and_reasoning_effort(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        thought = {}
        for effort in ("low", "high"):
            body = {
                "model": "o4-mini",
                "messages": [{"role": "user", "content": "[[sim reasoning=hidden thinking=200]] What is 2 + 3?"}],
                "max_completion_tokens": 4000,
                "temperature": 1,
                "reasoning_effort": effort,
            }
            answer = await http.post("/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            thought[effort] = answer.json()["usage"]["completion_tokens_details"]["reasoning_tokens"]
            assert "reasoning_content" not in answer.json()["choices"][0]["message"]
    assert 40 <= thought["low"] < 200 < thought["high"]


async def test_continuing_a_cut_thinking_resumes_it_vllm_and_deepseek_style(server):
    question = {"role": "user", "content": "[[sim reasoning=field thinking=300]] What is 2 + 3?"}
    async with httpx.AsyncClient(base_url=server.url) as http:
        first = (await http.post("/chat/completions", json={"model": "m", "messages": [question], "max_tokens": 120})).json()
        partial = first["choices"][0]["message"]["reasoning_content"]
        prefix = {"role": "assistant", "content": "<think>" + partial}
        vllm = {"model": "m", "messages": [question, prefix], "continue_final_message": True, "add_generation_prompt": False}
        deepseek = {"model": "m", "messages": [question, {**prefix, "prefix": True}]}
        for body in (vllm, deepseek):
            rest = (await http.post("/chat/completions", json=body)).json()
            assert rest["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"] + 100  # the prefix is prompt
            message = rest["choices"][0]["message"]
            resumed = [int(d) for d, _ in THOUGHT.findall(message["reasoning_content"])]
            assert resumed[0] >= max(int(d) for d, _ in THOUGHT.findall(partial))  # it went on, it did not start over
            assert extract_answer(message["content"]) == "5"
        # thinking closed by the client (budget forcing): the answer comes at once, without more thinking
        closed = {**vllm, "messages": [question, {"role": "assistant", "content": "<think>" + partial + "\n</think>\n\n"}]}
        message = (await http.post("/chat/completions", json=closed)).json()["choices"][0]["message"]
        assert "reasoning_content" not in message and extract_answer(message["content"]) == "5"
        both = await http.post("/chat/completions", json={**vllm, "add_generation_prompt": True})
        assert both.status_code == 400


async def test_thinking_switched_off_in_the_chat_template_answers_at_once(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "[[sim reasoning=field]] What is 2 + 3?"}]}
        off = (await http.post("/chat/completions", json={**body, "chat_template_kwargs": {"enable_thinking": False}})).json()
    assert "reasoning_content" not in off["choices"][0]["message"] and off["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert extract_answer(off["choices"][0]["message"]["content"]) == "5"


def test_a_reply_to_a_prompt_that_carries_thinking_resumes_it():
    """A tail or summary carryover shows the thinking so far in the prompt, not as a prefix: it resumes from there."""
    engine = SimulatedModel(COUNTER, reasoning=ReasoningPlan("field", 1000))
    first = engine.respond(LLMRequest(messages=(user("What is 6 * 7?"),), max_tokens=200)).choices[0]
    carried = user("What is 6 * 7?\n\nYour reasoning so far:\n" + COUNTER.tail(first.reasoning, 60))
    again = engine.respond(LLMRequest(messages=(carried,), max_tokens=200)).choices[0]
    assert int(THOUGHT.findall(again.reasoning)[0][0]) >= int(THOUGHT.findall(first.reasoning)[-1][0])


def test_chunks_that_carry_the_tail_of_the_thinking_make_progress_to_the_answer():
    """Delethink's loop against the engine: each chunk continues the raw tail of the thinking so far."""
    llm_engine = SimulatedModel(COUNTER, reasoning=ReasoningPlan("field", 1000))
    question = user("What is 6 * 7?")
    tail, calls, furthest = None, 0, -1
    while True:
        calls += 1
        response = llm_engine.respond(LLMRequest(messages=(question,), max_tokens=200, continue_thinking=tail))
        choice = response.choices[0]
        marks = [int(d) for d, _ in THOUGHT.findall(choice.reasoning)]
        assert marks and marks[-1] > furthest  # every chunk gets further than the last
        furthest = marks[-1]
        if not choice.thinking_unfinished:
            break
        tail = COUNTER.tail(choice.reasoning, 80)
    if choice.finish_reason == "length":  # the thinking closed with no room left to answer: close it and continue
        calls += 1
        closed = COUNTER.tail(choice.reasoning, 80) + "\n</think>\n\n"
        response = llm_engine.respond(LLMRequest(messages=(question,), max_tokens=200, continue_thinking=closed))
        choice = response.choices[0]
        assert choice.reasoning == "" and response.reasoning_tokens == 0
    assert extract_answer(choice.text) == "42" and 5 <= calls <= 8
