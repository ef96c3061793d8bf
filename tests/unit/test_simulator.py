"""The simulated model: its behaviour (engine) and its HTTP surface with the official openai client."""

import json

import openai
import pytest

from reasonray.gateway.protocol import LLMRequest, Message
from reasonray.gateway.simulator.engine import (
    FaultPlan,
    SimulatedModel,
    SimulatorError,
    embed,
    evaluate_arithmetic,
)
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.tags import extract_answer

COUNTER = counter_for_model("simulated")


def ask(text, **kw):
    return LLMRequest(messages=(Message(role="user", content=text),), **kw)


@pytest.fixture
def model():
    return SimulatedModel(COUNTER)


@pytest.mark.parametrize(
    "question,answer",
    [("What is 17 * 23?", "391"), ("Compute (2 + 3) * 4.", "20"), ("What is 7 / 2?", "3.5"), ("What is 12 x 12?", "144")],
)
def test_answers_arithmetic_after_short_reasoning(model, question, answer):
    text = model.respond(ask(question)).choices[0].text
    assert text.startswith("<thinking>") and extract_answer(text) == answer


def test_non_arithmetic_questions_get_a_labelled_reply(model):
    assert "simulated model" in extract_answer(model.respond(ask("Who wrote Hamlet?")).choices[0].text)


def test_arithmetic_parser_ignores_plain_numbers():
    assert evaluate_arithmetic("In 2024 there were 3 cats") is None


def test_think_directive_reasons_for_n_tokens_in_one_call(model):
    response = model.respond(ask("[[sim think=2000 answer=7]] solve it"))
    text = response.choices[0].text
    assert extract_answer(text) == "7"
    assert 2000 <= response.completion_tokens <= 2040


def test_think_directive_resumes_from_progress_seen_in_the_prompt(model):
    """Chunked reasoning: each call continues from the last progress marker the prompt carries."""
    total, generated, carry, calls = 3000, 0, "", 0
    while True:
        calls += 1
        request = LLMRequest(
            messages=(Message(role="user", content=f"[[sim think={total} answer=9]]\n{carry}"),), max_tokens=800, stop=("<continue>",)
        )
        choice = model.respond(request).choices[0]
        generated += COUNTER.count(choice.text)
        if extract_answer(choice.text) is not None:
            break
        assert choice.stop_reason == "<continue>" and choice.finish_reason == "stop"  # a full chunk, not cut off
        carry = COUNTER.tail(choice.text, 200)
    assert extract_answer(choice.text) == "9"
    assert calls == 4 and total <= generated <= total + 4 * 40


def test_stop_sequences_end_the_text_and_are_reported(model):
    choice = model.respond(ask("What is 1+1?", stop=("<answer>",))).choices[0]
    assert "<answer>" not in choice.text and choice.stop_reason == "<answer>" and choice.finish_reason == "stop"


def test_max_tokens_truncates_with_finish_reason_length(model):
    choice = model.respond(ask("[[sim think=500]]", max_tokens=50)).choices[0]
    assert choice.finish_reason == "length" and COUNTER.count(choice.text) == 50


def test_seeded_replies_repeat_and_sampled_ones_vary(model):
    seeded = [model.respond(ask("[[sim answer=1]]", temperature=1.0, seed=5)).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]
    sampled = {model.respond(ask("[[sim think=300]]", temperature=1.0)).choices[0].text for _ in range(5)}
    assert len(sampled) > 1


def test_n_returns_that_many_choices_and_usage_adds_up(model):
    response = model.respond(ask("What is 3*3?", n=3, temperature=0.7, seed=1))
    assert len(response.choices) == 3
    assert response.completion_tokens == sum(COUNTER.count(c.text) for c in response.choices)


def test_scripted_replies_are_consumed_in_order(model):
    model.add_script("s1", [{"content": "first"}, {"tool_calls": [{"name": "calc", "arguments": {"x": 1}}]}])
    assert model.respond(ask("[[sim script=s1]]")).choices[0].text == "first"
    call = model.respond(ask("[[sim script=s1]]")).choices[0]
    assert call.finish_reason == "tool_calls" and call.tool_calls[0].name == "calc"
    with pytest.raises(SimulatorError, match="no replies left"):
        model.respond(ask("[[sim script=s1]]"))


def test_fault_directive_fails_the_same_request_n_times(model):
    request = ask("[[sim fault=500 times=2]] What is 1+1?")
    assert [model.fault_for(request) for _ in range(3)] == ["500", "500", None]


def test_random_faults_follow_the_rate_and_are_repeatable():
    runs = []
    for _ in range(2):
        model = SimulatedModel(COUNTER, seed=3, faults=FaultPlan(0.5, ("429",)))
        runs.append([model.fault_for(ask(f"q{i}")) is not None for i in range(200)])
    assert runs[0] == runs[1] and 70 < sum(runs[0]) < 130
    with pytest.raises(ValueError, match="unknown fault kinds"):
        FaultPlan(0.1, ("503",))


def test_slip_directive_makes_some_sampled_answers_wrong_and_never_greedy_ones(model):
    answers = [
        extract_answer(model.respond(ask("What is 17 * 23? [[sim slip=0.5]]", temperature=0.8, seed=s)).choices[0].text) for s in range(20)
    ]
    assert 3 <= sum(a != "391" for a in answers) <= 17
    assert all(a.lstrip("-").isdigit() for a in answers)
    greedy = [extract_answer(model.respond(ask("What is 17 * 23? [[sim slip=1]]", seed=s)).choices[0].text) for s in range(5)]
    assert greedy == ["391"] * 5
    with pytest.raises(SimulatorError, match="slip is a probability between 0 and 1"):
        model.respond(ask("What is 1+1? [[sim slip=2]]", temperature=1.0))


def test_tree_of_thought_purposes_get_steps_scores_and_votes(model):
    """propose / score / choose: the steps so far are the model's own step phrases shown back, whatever
    the prompt around them says; a solution's answer is its last line; candidates are a numbered list."""

    def chat(user_text, purpose, **kw):
        messages = (Message(role="system", content="Any instructions at all."), Message(role="user", content=user_text))
        return model.respond(LLMRequest(messages=messages, purpose=purpose, **kw)).choices[0].text

    problem = "Problem: What is 6 * 7? [[sim steps=1]]\n\nSteps so far:\n"
    step = "Step 1: verifying the intermediate quantity."
    assert "<step>Step 1:" in chat(problem + "(none)", "propose", temperature=0.7, seed=1)
    assert extract_answer(chat(problem + step, "propose", temperature=0.7, seed=1)) == "42"
    slipped = problem + "Step 1: rounding the intermediate result to keep the numbers simple."
    assert extract_answer(chat(slipped, "propose", temperature=0.7, seed=1)) != "42"
    score = lambda text: float(chat(text, "score").split("<score>")[1].split("</score>")[0])
    assert score(slipped) < 0.5 < score(problem + step) < score(problem + step + "\nAnswer: 42")
    assert score(problem + step + "\nAnswer: 41") < 0.5  # a wrong answer on its last line
    assert score(problem + step + "\nSo the result is 42.") > 0.9  # any wording of the answer line
    assert "<feedback>" not in chat(problem + step, "score") and "<feedback>" in chat(problem + step, "critique")
    ballot = chat(f"Candidate 1:\n{slipped}\n\nCandidate 2:\n{problem}{step}", "choose", temperature=0.7, seed=3)
    assert "<vote>2</vote>" in ballot
    ballot = chat(f"Option 1)\n{slipped}\n\nOption 2)\n{problem}{step}", "choose", temperature=0.7, seed=3)
    assert "<vote>2</vote>" in ballot
    # without a purpose the same prompt is just a question: answered, not scored
    assert extract_answer(chat(problem + step, None)) == "42"


def test_call_directives_call_tools_in_order_then_answer_with_the_last_result(model):
    question = 'Go [[sim call=calculator {"expression": "2+3"}]] [[sim call=get_weather {"city": "Paris"}]]'
    first = model.respond(ask(question)).choices[0]
    assert first.finish_reason == "tool_calls" and first.tool_calls[0].name == "calculator"
    assert json.loads(first.tool_calls[0].arguments) == {"expression": "2+3"}
    so_far = (
        Message(role="user", content=question),
        Message(role="assistant", tool_calls=first.tool_calls),
        Message(role="tool", tool_call_id=first.tool_calls[0].id, content="5"),
    )
    second = model.respond(LLMRequest(messages=so_far)).choices[0]
    assert second.tool_calls[0].name == "get_weather" and second.tool_calls[0].id != first.tool_calls[0].id
    done = (
        *so_far,
        Message(role="assistant", tool_calls=second.tool_calls),
        Message(role="tool", tool_call_id=second.tool_calls[0].id, content="Sunny"),
    )
    assert extract_answer(model.respond(LLMRequest(messages=done)).choices[0].text) == "Sunny"
    with pytest.raises(SimulatorError, match="the arguments are not a JSON object"):
        model.respond(ask("[[sim call=calculator {oops}]]"))


def test_embeddings_are_normalised_and_similar_texts_are_closer():
    a, b, c = embed("reset the password"), embed("how to reset a password"), embed("weather in Paris")
    dot = lambda x, y: sum(i * j for i, j in zip(x, y, strict=False))
    assert abs(dot(a, a) - 1) < 1e-9 and dot(a, b) > dot(a, c)


@pytest.fixture(scope="module")
def server():
    srv = SimulatorServer(SimulatorSettings(port=0, hang_s=3)).start()
    yield srv
    srv.stop()


async def test_the_official_client_talks_to_the_server(server):
    client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(
        model="gpt-4.1", messages=[{"role": "user", "content": "What is 17 * 23?"}], temperature=0
    )
    completion = raw.parse()
    assert raw.headers["x-reasonray-simulated"] == "true"
    assert completion.model == "simulated"
    assert extract_answer(completion.choices[0].message.content) == "391"
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    models = await client.models.list()
    assert [m.id for m in models.data] == ["simulated"]


async def test_the_purpose_travels_as_a_header_from_the_gateway_client_to_the_server(server):
    """OpenAILLM sends LLMRequest.purpose as X-ReasonRay-Purpose (never in the body, which strict endpoints
    check); the server answers by it, so a strategy over HTTP gets what it gets in-process."""
    from reasonray.gateway.openai_client import OpenAILLM
    from reasonray.gateway.simulator.inprocess import SimulatedLLM

    llm = OpenAILLM("simulated", base_url=server.url, api_key="x")
    request = LLMRequest(
        messages=(Message(role="system", content="Check it."), Message(role="user", content="What is 6 * 7?\nThe result is 42.")),
        temperature=0.0,
        purpose="critique",
    )
    assert "purpose" not in llm._params(request) and llm._params(request)["extra_headers"] == {"X-ReasonRay-Purpose": "critique"}
    over_http = await llm.complete(request)
    in_process = await SimulatedLLM().complete(request)
    assert over_http.text == in_process.text and "<score>" in over_http.text and "<feedback>" in over_http.text
    plain = await llm.complete(LLMRequest(messages=request.messages, temperature=0.0))  # no purpose: just a question
    assert "<score>" not in plain.text and extract_answer(plain.text) == "42"
    await llm.close()


async def test_streaming_yields_the_same_text_and_usage(server):
    client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
    plain = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 6*7?"}], temperature=0)
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "What is 6*7?"}],
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    assert "".join(parts) == plain.choices[0].message.content
    assert usage.completion_tokens == plain.usage.completion_tokens


async def test_embeddings_endpoint(server):
    client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
    result = await client.embeddings.create(model="any", input=["one", "two"])
    assert len(result.data) == 2 and len(result.data[0].embedding) == 384


async def test_faults_come_back_as_http_errors(server):
    client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[sim fault=429]] a"}])
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[sim fault=500]] b"}])
    with pytest.raises(openai.BadRequestError, match="messages"):
        await client.chat.completions.create(model="m", messages=[])


async def test_latency_model_adds_time_to_first_token_and_per_token_time():
    import time

    slow = SimulatorServer(SimulatorSettings(port=0, ttft_ms=150, tokens_per_second=400)).start()
    try:
        client = openai.AsyncOpenAI(base_url=slow.url, api_key="x", max_retries=0)
        started = time.perf_counter()
        completion = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "[[sim think=200 answer=1]]"}], temperature=0
        )
        elapsed = time.perf_counter() - started
        expected = 0.150 + completion.usage.completion_tokens / 400
        assert expected <= elapsed < expected + 1.5  # the model adds its latency, and not much else (slack for a loaded CI machine)
    finally:
        slow.stop()


QUESTIONS = {f"A farmer has {i} rows of {i + 4} trees in orchard {i}. How many trees are there?": str(i * (i + 4)) for i in range(1, 41)}


def test_an_answer_key_answers_dataset_questions_with_the_given_skill(model):
    assert model.add_answers(QUESTIONS, skill=0.6) == 40
    greedy = {q: extract_answer(model.respond(ask(f"Solve this.\n\n{q}")).choices[0].text) for q in QUESTIONS}
    right = sum(greedy[q] == a for q, a in QUESTIONS.items())
    assert 14 <= right <= 34  # about 60% of 40
    wrong = [q for q in QUESTIONS if greedy[q] != QUESTIONS[q]]
    assert all(greedy[q].lstrip("-").isdigit() for q in wrong)  # plausible wrong numbers, not refusals
    # greedy calls with one seed miss the same questions every time; another seed misses others
    assert {q: extract_answer(model.respond(ask(f"Solve this.\n\n{q}")).choices[0].text) for q in QUESTIONS} == greedy
    reseeded = {q: extract_answer(model.respond(ask(q, seed=7)).choices[0].text) for q in QUESTIONS}
    assert reseeded != greedy
    # the judge knows the key too
    question = next(iter(QUESTIONS))
    assert model._check(f"{question}\nAnswer: {QUESTIONS[question]}") is True
    assert model._check(f"{question}\nAnswer: 0") is False


def test_a_perfect_skill_is_always_right_and_reset_forgets_the_key(model):
    model.add_answers(QUESTIONS, skill=1.0)
    assert all(extract_answer(model.respond(ask(q, temperature=1.0)).choices[0].text) == a for q, a in QUESTIONS.items())
    model.reset()
    assert "simulated model" in extract_answer(model.respond(ask(next(iter(QUESTIONS)))).choices[0].text)
    with pytest.raises(ValueError, match="too short"):
        model.add_answers({"2+2?": "4"})
    with pytest.raises(ValueError, match="between 0 and 1"):
        model.add_answers(QUESTIONS, skill=1.5)


async def test_the_answer_key_endpoint(server):
    import httpx

    async with httpx.AsyncClient(base_url=server.url) as http:
        ok = await http.post("/sim/answers", json={"answers": dict(list(QUESTIONS.items())[:3]), "skill": 1.0})
        assert ok.status_code == 200 and ok.json() == {"known": 3, "skill": 1.0}
        bad = await http.post("/sim/answers", json={"answers": ["not", "a", "map"]})
        assert bad.status_code == 400 and "answers" in bad.json()["error"]["message"]
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x")
        question, answer = next(iter(QUESTIONS.items()))
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": question}])
        assert extract_answer(reply.choices[0].message.content) == answer


def test_every_purpose_is_documented_and_gets_its_own_kind_of_reply(model):
    from pathlib import Path

    from reasonray.gateway.protocol import PURPOSES

    docs = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
    text = "What is 6 * 7?\nThe result is 42."
    plain = model.respond(ask(text)).choices[0].text
    replies = {purpose: model.respond(ask(text, purpose=purpose)).choices[0].text for purpose in PURPOSES}
    for purpose, reply in replies.items():
        assert f"`{purpose}`" in docs, f"docs/simulator.md does not document the purpose {purpose}"
        assert reply != plain, f"the simulator answers purpose {purpose} like a plain question"
    assert replies["final_answer"] == "<answer>42</answer>"
    assert model.respond(ask(text, purpose="a_third_party_purpose")).choices[0].text == plain  # unknown: a plain question
