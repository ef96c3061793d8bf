"""The simulated model when it disobeys as real models do, and when it enforces structured output: the engine's
replies, and the server's llama.cpp-like traits (tokenizer and tokenize endpoints, one request at a time, a
client that leaves) with the official openai client and plain HTTP."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import jsonschema
import openai
import pytest

from reasonray.gateway.protocol import LLMRequest, Message
from reasonray.gateway.simulator.disobedience import Disobedience
from reasonray.gateway.simulator.engine import SimulatedModel, SimulatorError
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.gateway.simulator.tokenizer import SimTokenizer
from reasonray.gateway.tokens import count_messages, counter_for_model
from reasonray.kernel.tags import extract_answer

CL100K = counter_for_model("simulated")
DIGITS = SimTokenizer("digits")
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "days", "unit"],
            "additionalProperties": False,
        },
    },
}


def ask(text: str, **kw) -> LLMRequest:
    return LLMRequest(messages=(Message(role="user", content=text),), **kw)


def disobedient(rate: float = 1.0, kinds: tuple[str, ...] = ("prose", "ramble", "tools")) -> SimulatedModel:
    return SimulatedModel(DIGITS, disobedience=Disobedience(rate, kinds), context_length=4096)


# -- replies ------------------------------------------------------------------------------------------


def test_prose_ignores_every_reply_format_yet_says_the_answer():
    model = disobedient(kinds=("prose",))
    texts = [model.respond(ask("What is 17 * 23?", seed=s)).choices[0].text for s in range(12)]
    assert all(("<" not in t and t.rstrip(".").endswith("391")) or "391. The answer is correct." in t for t in texts)
    assert {"The answer is: 391" in t for t in texts} == {True, False}  # several ways of saying it
    assert any("#### 391" in t for t in texts)
    assert [e.stated for e in model.exchanges] == [("391",)] * 12
    for purpose, tag in (("critique", "<score>"), ("choose", "<vote>"), ("propose", "<step>"), ("judge", "<status>")):
        text = model.respond(ask("What is 6 * 7?\nCandidate 1: 42\nCandidate 2: 41", purpose=purpose)).choices[0].text
        assert tag not in text and "<" not in text and text.strip()


def test_ramble_runs_to_max_tokens_or_the_end_of_the_context_without_an_answer():
    model = disobedient(kinds=("ramble",))
    cut = model.respond(ask("What is 17 * 23?", max_tokens=300)).choices[0]
    assert cut.finish_reason == "length" and DIGITS.count(cut.text) == 300 and extract_answer(cut.text) is None
    unbounded = model.respond(ask("What is 17 * 23?"))
    assert unbounded.choices[0].finish_reason == "length"
    assert unbounded.prompt_tokens + unbounded.completion_tokens == 4096  # the whole context window
    assert model.exchanges[-1].stated == (None,)


def test_tools_are_dropped_or_called_with_arguments_that_are_not_json():
    model = disobedient(kinds=("tools",))
    question = 'What is 2**10? [[sim call=calculator {"expression": "2**10"}]]'
    replies = [model.respond(ask(question, tools=(CALCULATOR,), seed=s)).choices[0] for s in range(16)]
    broken = [r.tool_calls[0].arguments for r in replies if r.tool_calls]
    dropped = [r.text for r in replies if not r.tool_calls]
    assert broken and dropped
    for arguments in broken:
        with pytest.raises(json.JSONDecodeError):
            json.loads(arguments)
    assert all("1024" in text and "<answer>" not in text for text in dropped)
    # without tools on offer, tools cannot be fumbled: the reply obeys
    assert model.respond(ask("What is 2 + 2?")).choices[0].text.endswith("<answer>4</answer>")


def test_the_rate_is_a_seeded_share_and_the_same_request_disobeys_the_same_way():
    model = disobedient(rate=0.3)
    kinds = [model.respond(ask(f"What is {i} + {i}?")).choices[0] for i in range(200)]
    share = sum(e.disobeyed != (None,) for e in model.exchanges) / 200
    assert 0.2 < share < 0.4
    again = [disobedient(rate=0.3).respond(ask(f"What is {i} + {i}?")).choices[0] for i in range(200)]
    assert [c.text for c in kinds] == [c.text for c in again]


@pytest.mark.parametrize(
    ("directive", "disobeys"),
    [("[[sim disobey=1]]", True), ("[[sim disobey=0]]", False), ("[[sim disobey=ramble]]", True), ("[[sim disobey=prose,tools]]", True)],
)
def test_a_directive_sets_the_rate_or_kinds_for_its_request(directive, disobeys):
    model = SimulatedModel(CL100K)  # obedient unless told
    text = model.respond(ask(f"What is 17 * 23? {directive}")).choices[0].text
    assert (extract_answer(text) != "391") == disobeys
    if "ramble" in directive:
        assert model.exchanges[-1].disobeyed == ("ramble",)


def test_a_bad_disobey_directive_names_what_is_wrong():
    model = SimulatedModel(CL100K)
    with pytest.raises(SimulatorError, match=r"disobey=1.5.*between 0 and 1"):
        model.respond(ask("[[sim disobey=1.5]] What is 1 + 1?"))
    with pytest.raises(SimulatorError, match=r"unknown disobey kinds \['shout'\]"):
        model.respond(ask("[[sim disobey=prose,shout]] What is 1 + 1?"))
    with pytest.raises(ValueError, match="between 0 and 1"):
        SimulatorSettings(disobey_rate=2.0)
    with pytest.raises(ValueError, match="unknown tokenizer"):
        SimulatorSettings(tokenizer="bpe")


def test_scripted_replies_stay_exact_even_when_disobeying():
    model = disobedient()
    model.add_script("s", [{"content": "<answer>exactly this</answer>"}])
    assert model.respond(ask("[[sim script=s]]")).choices[0].text == "<answer>exactly this</answer>"


# -- tokens --------------------------------------------------------------------------------------------


def test_the_digits_tokenizer_counts_every_digit_and_frames_chats_as_chatml():
    assert DIGITS.count("1234567") == 7 and CL100K.count("1234567") < 7
    assert DIGITS.decode(DIGITS.encode("What is 1234 * 5678?")) == "What is 1234 * 5678?"
    assert DIGITS.head("12345678", 3) == "123" and DIGITS.tail("12345678", 2) == "78"
    messages = (Message(role="user", content="What is 1234 * 5678?"),)
    # no system message: the template injects its own, as SmolLM2's does
    assert DIGITS.prompt_tokens(messages) > count_messages(CL100K, messages) + 10
    with_system = (Message(role="system", content="Be brief."), *messages)
    assert DIGITS.prompt_tokens(with_system) < DIGITS.prompt_tokens(messages)


def test_usage_is_counted_with_the_models_tokenizer():
    request = ask("What is 123456 * 789?")
    own, reasonray = SimulatedModel(DIGITS).respond(request), SimulatedModel(CL100K).respond(request)
    assert own.choices[0].text == reasonray.choices[0].text
    assert own.completion_tokens == DIGITS.count(own.choices[0].text) > reasonray.completion_tokens
    assert own.prompt_tokens == DIGITS.prompt_tokens(request.messages) != reasonray.prompt_tokens


# -- structured output -----------------------------------------------------------------------------------

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "answer": {"type": "integer"}},
    "required": ["reasoning", "answer"],
    "additionalProperties": False,
}


def test_json_schema_output_is_valid_and_carries_the_answer_where_the_schema_names_it():
    model = SimulatedModel(CL100K)
    fmt = {"type": "json_schema", "json_schema": {"name": "solution", "schema": ANSWER_SCHEMA, "strict": True}}
    reply = json.loads(model.respond(ask("What is 17 * 23?", response_format=fmt)).choices[0].text)
    jsonschema.validate(reply, ANSWER_SCHEMA)
    assert reply["answer"] == 391 and "17 * 23" in reply["reasoning"]
    score_schema = {
        "type": "object",
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}, "feedback": {"type": "string"}},
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "review", "schema": score_schema}}
    review = json.loads(model.respond(ask("What is 6 * 7?\nThe result is 42.", purpose="critique", response_format=fmt)).choices[0].text)
    jsonschema.validate(review, score_schema)
    assert review["score"] >= 0.9 and review["feedback"]


def test_json_schema_output_follows_refs_as_pydantic_writes_them():
    from pydantic import BaseModel

    class Step(BaseModel):
        thought: str

    class Solution(BaseModel):
        steps: list[Step]
        answer: int | None
        confidence: float

    schema = Solution.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "Solution", "schema": schema}}
    reply = SimulatedModel(CL100K).respond(ask("What is 17 * 23?", response_format=fmt)).choices[0].text
    assert Solution.model_validate_json(reply).answer == 391
    jsonschema.validate(json.loads(reply), schema)
    looped = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    with pytest.raises(SimulatorError, match="refers to itself"):
        SimulatedModel(CL100K).respond(ask("1+1?", response_format={"type": "json_schema", "json_schema": {"schema": looped}}))
    with pytest.raises(SimulatorError, match="points at nothing"):
        bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}
        SimulatedModel(CL100K).respond(ask("1+1?", response_format={"type": "json_schema", "json_schema": {"schema": bad}}))


def test_json_object_output_is_an_object_of_the_replys_parts():
    model = SimulatedModel(CL100K)
    reply = json.loads(model.respond(ask("What is 17 * 23?", response_format={"type": "json_object"})).choices[0].text)
    assert reply["answer"] == "391" and "reasoning" in reply
    vote = model.respond(ask("What is 6 * 7?\nCandidate 1: 42\nCandidate 2: 41", purpose="choose", response_format={"type": "json_object"}))
    assert json.loads(vote.choices[0].text)["vote"] == 1


def test_a_disobedient_reply_ignores_the_response_format():
    model = disobedient(kinds=("prose",))
    fmt = {"type": "json_schema", "json_schema": {"name": "solution", "schema": ANSWER_SCHEMA}}
    with pytest.raises(json.JSONDecodeError):
        json.loads(model.respond(ask("What is 17 * 23?", response_format=fmt)).choices[0].text)


def test_tool_choice_none_required_and_named():
    model = SimulatedModel(CL100K)
    question = 'What is 2**10? [[sim call=calculator {"expression": "2**10"}]]'
    none = model.respond(ask(question, tools=(CALCULATOR,), tool_choice="none")).choices[0]
    assert not none.tool_calls and extract_answer(none.text) == "1024"
    required = model.respond(ask("What is 3 * 7?", tools=(CALCULATOR,), tool_choice="required")).choices[0]
    assert required.finish_reason == "tool_calls" and required.tool_calls[0].name == "calculator"
    assert json.loads(required.tool_calls[0].arguments) == {"expression": "3 * 7"}
    named = {"type": "function", "function": {"name": "get_weather"}}
    call = model.respond(ask(question, tools=(CALCULATOR, WEATHER), tool_choice=named)).choices[0].tool_calls
    assert [c.name for c in call] == ["get_weather"]
    jsonschema.validate(json.loads(call[0].arguments), WEATHER["function"]["parameters"])
    # the call a directive asks for is kept when it is the one required
    directed = model.respond(ask(question, tools=(CALCULATOR, WEATHER), tool_choice="required")).choices[0].tool_calls
    assert json.loads(directed[0].arguments) == {"expression": "2**10"}


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        ((CALCULATOR,), {"type": "function", "function": {"name": "search"}}, "'search', which is not among the tools offered"),
        ((), "required", "'required' needs 'tools'"),
        ((CALCULATOR,), "always", "use one of none, auto, required"),
    ],
)
def test_a_tool_choice_that_names_nothing_offered_is_refused(tools, choice, message):
    with pytest.raises(SimulatorError, match=message):
        SimulatedModel(CL100K).respond(ask("What is 1 + 1?", tools=tools, tool_choice=choice))


def test_a_prompt_beyond_the_context_window_is_refused_and_replies_end_where_it_does():
    model = SimulatedModel(CL100K, context_length=100)
    with pytest.raises(SimulatorError, match=r"maximum context length is 100 tokens\. However, you requested 2"):
        model.respond(ask("What is 1 + 1? " + "word " * 200))
    long = model.respond(ask("[[sim think=500 answer=7]]", max_tokens=400))
    assert long.choices[0].finish_reason == "length" and long.prompt_tokens + long.completion_tokens == 100


# -- the server ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_like():
    """Disobeying half the time: so also a digit-splitting tokenizer, one request at a time, a 4096 context."""
    srv = SimulatorServer(SimulatorSettings(port=0, disobey_rate=0.5, ttft_ms=200)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def obedient():
    srv = SimulatorServer(SimulatorSettings(port=0)).start()
    yield srv
    srv.stop()


def root(server: SimulatorServer) -> str:
    return server.url.removesuffix("/v1")


async def test_tokenize_endpoints_count_as_the_usage_does(llama_like):
    client = openai.AsyncOpenAI(base_url=llama_like.url, api_key="x", max_retries=0)
    text = "What is 123456 * 789?"
    async with httpx.AsyncClient(base_url=root(llama_like)) as http:
        tokens = (await http.post("/extras/tokenize", json={"input": text, "model": "simulated"})).json()["tokens"]
        count = (await http.post("/extras/tokenize/count", json={"input": text})).json()["count"]
        back = (await http.post("/extras/detokenize", json={"tokens": tokens})).json()["text"]
        bad = await http.post("/extras/tokenize", json={"text": text})
        unknown = await http.post("/extras/detokenize", json={"tokens": [10**12]})
    assert len(tokens) == count == DIGITS.count(text) and back == text
    assert bad.status_code == 400 and "'input'" in bad.json()["error"]["message"]
    assert unknown.status_code == 400 and "not token ids of this model" in unknown.json()["error"]["message"]
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[sim disobey=0]] " + text}])
    assert reply.usage.completion_tokens == DIGITS.count(reply.choices[0].message.content)


async def test_models_advertise_what_the_server_supports_unless_it_disobeys(obedient, llama_like):
    async with httpx.AsyncClient() as http:
        card = (await http.get(f"{obedient.url}/models")).json()["data"][0]
        bare = (await http.get(f"{llama_like.url}/models")).json()["data"][0]
    assert card["capabilities"] == {
        "structured_output": True,
        "tool_choice": True,
        "tokenize": True,
        "context_length": 131072,
        "max_concurrency": None,
    }
    assert card["max_model_len"] == card["meta"]["n_ctx"] == 131072
    assert bare == {"id": "simulated", "object": "model", "owned_by": "me", "permissions": []}  # llama-cpp-python's card


async def test_one_request_at_a_time(llama_like):
    async def four_at_once(server: SimulatorServer) -> tuple[float, int]:
        """How long four concurrent requests take, and the most the server generated at once."""
        async with httpx.AsyncClient(base_url=root(server)) as http:
            await http.post("/v1/sim/reset")
            started = time.perf_counter()
            await asyncio.gather(
                *(
                    http.post(
                        "/v1/chat/completions",
                        json={"model": "m", "messages": [{"role": "user", "content": f"[[sim disobey=0]] What is {i} + 1?"}]},
                    )
                    for i in range(4)
                )
            )
            elapsed = time.perf_counter() - started
            return elapsed, (await http.get("/v1/sim/stats")).json()["most_generating"]

    elapsed, most = await four_at_once(llama_like)
    assert most == 1 and elapsed >= 4 * 0.2  # each waits for the one before: four times the 0.2 s to first token
    unlimited = SimulatorServer(SimulatorSettings(port=0, ttft_ms=200)).start()
    try:
        _, most = await four_at_once(unlimited)
    finally:
        unlimited.stop()
    assert most > 1  # no limit by default: they overlap


async def test_a_client_that_leaves_does_not_stop_a_plain_request_but_closing_a_stream_does(llama_like):
    base = root(llama_like)
    async with httpx.AsyncClient(base_url=base) as http:
        await http.post("/v1/sim/reset")
        slow_question = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "[[sim think=50 disobey=0]]"}]}
        # the model takes ttft 0.2 s; a client that gives up after 0.05 s leaves the generation running...
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/v1/chat/completions", json=slow_question, timeout=0.05)
        started = time.perf_counter()
        await http.post("/v1/chat/completions", json=slow_question)
        # ...so the next request waits for it: about two generations, not one
        assert time.perf_counter() - started >= 0.3
        deadline = time.monotonic() + 5
        while (await http.get("/v1/sim/stats")).json()["abandoned"] != 1:  # counted once its generation ends
            assert time.monotonic() < deadline, "the request whose client left was never counted as abandoned"
            await asyncio.sleep(0.02)
    stream_settings = SimulatorSettings(port=0, disobey_rate=0.5, ttft_ms=0, tokens_per_second=20)
    streaming = SimulatorServer(stream_settings).start()
    try:
        async with httpx.AsyncClient(base_url=root(streaming)) as http:
            long_stream = {**slow_question, "max_tokens": 400, "stream": True}
            long_stream["messages"] = [{"role": "user", "content": "[[sim think=400 disobey=0]]"}]
            async with http.stream("POST", "/v1/chat/completions", json=long_stream) as events:
                async for _ in events.aiter_lines():
                    break  # the client closes the stream after its first event (400 tokens would take 20 s)
            started = time.perf_counter()
            quick = {"model": "m", "messages": [{"role": "user", "content": "[[sim answer=1 disobey=0]]"}], "max_tokens": 5}
            await http.post("/v1/chat/completions", json=quick, timeout=10)
            assert time.perf_counter() - started < 2.0  # the closed stream freed the model
    finally:
        streaming.stop()


async def test_a_disobedient_server_streams_without_usage(llama_like, obedient):
    for server, has_usage in ((llama_like, False), (obedient, True)):
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "[[sim disobey=0]] What is 2 + 2?"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [chunk.usage async for chunk in stream if chunk.usage]
        assert bool(usage) == has_usage


async def test_the_server_honours_response_format_and_tool_choice_over_http(obedient):
    client = openai.AsyncOpenAI(base_url=obedient.url, api_key="x", max_retries=0)
    fmt = {"type": "json_schema", "json_schema": {"name": "solution", "schema": ANSWER_SCHEMA, "strict": True}}
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 17 * 23?"}], response_format=fmt)
    assert json.loads(reply.choices[0].message.content)["answer"] == 391
    forced = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "What is 3 * 7?"}],
        tools=[CALCULATOR],
        tool_choice={"type": "function", "function": {"name": "calculator"}},
    )
    assert forced.choices[0].finish_reason == "tool_calls"
    assert json.loads(forced.choices[0].message.tool_calls[0].function.arguments) == {"expression": "3 * 7"}
    with pytest.raises(openai.BadRequestError, match="not among the tools offered"):
        await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "What is 3 * 7?"}],
            tools=[CALCULATOR],
            tool_choice={"type": "function", "function": {"name": "search"}},
        )


async def test_disobedience_changes_at_run_time_and_reset_restores_the_setting(obedient):
    async with httpx.AsyncClient(base_url=root(obedient)) as http:
        assert (await http.post("/v1/sim/disobey", json={"rate": 1, "kinds": ["ramble"]})).json() == {"rate": 1.0, "kinds": ["ramble"]}
        reply = await http.post(
            "/v1/chat/completions", json={"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "1+1?"}]}
        )
        assert reply.json()["choices"][0]["finish_reason"] == "length"
        exchanges = (await http.get("/v1/sim/exchanges")).json()["exchanges"]
        assert exchanges[-1]["disobeyed"] == ["ramble"] and exchanges[-1]["stated"] == [None]
        assert (await http.post("/v1/sim/disobey", json={"rate": 3})).status_code == 400
        await http.post("/v1/sim/reset")
        reply = await http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "What is 1+1?"}]})
        assert extract_answer(reply.json()["choices"][0]["message"]["content"]) == "2"


async def test_a_prompt_beyond_the_context_is_refused_as_llama_cpp_python_refuses_it(llama_like):
    client = openai.AsyncOpenAI(base_url=llama_like.url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1 " * 5000}])
    assert refused.value.code == "context_length_exceeded" and "maximum context length is 4096 tokens" in refused.value.message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--disobey", "1.5"], "disobey rate must be between 0 and 1, got 1.5"),
        (["--disobey", "0.5", "--disobey-kinds", "prose,shout"], "unknown disobey kinds ['shout']"),
        (["--max-concurrency", "-1"], "max_concurrency must be 0 (no limit) or more"),
    ],
)
def test_the_sim_command_refuses_a_bad_disobedience_setting(args, message):
    from click.testing import CliRunner

    from reasonray.cli import main

    result = CliRunner().invoke(main, ["sim", "--port", "0", *args])
    assert result.exit_code != 0 and message in result.output
