"""The OpenAI surface's contract through the clients its users run, over HTTP against the real stack:
every request parameter honoured or refused in OpenAI's error shape naming it (docs/openai.md), the
openai SDK's `chat.completions.parse` and LangChain's `with_structured_output` in its three methods."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

QUESTION = [{"role": "user", "content": "What is 17 + 25?"}]


class Sum(BaseModel):
    """The sum of two numbers."""

    value: int = Field(description="the sum")


@pytest.fixture(scope="module")
def sdk(api, serve_base):
    return openai.OpenAI(base_url=f"{serve_base}/v1", api_key="unused", max_retries=0, timeout=120)


def refused(call, param: str, status: int = 400) -> str:
    with pytest.raises(openai.APIStatusError) as error:
        call()
    body = error.value.body
    assert error.value.status_code == status and body["param"] == param and body["type"] == "invalid_request_error", body
    assert param.split(".")[0] in body["message"] or body["code"] == "unsupported_parameter", body
    return str(body["message"])


def test_the_completion_budget_covers_the_whole_run_and_ends_with_length(sdk):
    # bounded_context reasons over several calls: the budget holds for all of them together
    long = [{"role": "user", "content": "[[sim think=9000 answer=5]] go"}]
    capped = sdk.chat.completions.create(model="reasonray/bounded_context", messages=long, max_completion_tokens=300)
    assert capped.choices[0].finish_reason == "length" and capped.usage.completion_tokens <= 300
    assert capped.usage.completion_tokens_details.reasoning_tokens > 0
    short = sdk.chat.completions.create(model="reasonray", messages=QUESTION, max_tokens=5)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens <= 5
    enough = sdk.chat.completions.create(model="reasonray", messages=QUESTION, max_tokens=500)
    assert enough.choices[0].finish_reason == "stop" and enough.choices[0].message.content == "42"


def test_stop_applies_to_the_answer(sdk):
    answer = sdk.chat.completions.create(model="reasonray", messages=QUESTION, stop=["2"])
    assert answer.choices[0].message.content == "4" and answer.choices[0].finish_reason == "stop"
    streamed = sdk.chat.completions.create(model="reasonray", messages=QUESTION, stop="2", stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "4"


def test_response_format_json_object_and_json_schema_parse_and_validate(sdk):
    obj = sdk.chat.completions.create(model="reasonray", messages=QUESTION, response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    schema = Sum.model_json_schema() | {"additionalProperties": False}
    strict = sdk.chat.completions.create(
        model="reasonray",
        messages=QUESTION,
        response_format={"type": "json_schema", "json_schema": {"name": "Sum", "strict": True, "schema": schema}},
    )
    assert json.loads(strict.choices[0].message.content) == {"value": 42}
    # an answer the schema cannot hold is a clear error, not prose
    with pytest.raises(openai.APIStatusError) as error:
        sdk.chat.completions.create(
            model="reasonray",
            messages=[{"role": "user", "content": "hello"}],
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "Pair",
                    "schema": {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "required": ["a", "b"],
                    },
                },
            },
        )
    assert error.value.status_code == 502 and "response_format" in error.value.body["message"]


def test_the_sdks_parse_returns_the_parsed_object(sdk):
    parsed = sdk.chat.completions.parse(model="reasonray", messages=QUESTION, response_format=Sum)
    assert parsed.choices[0].message.parsed == Sum(value=42)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output_in_every_method(api, serve_base, method):
    llm = ChatOpenAI(base_url=f"{serve_base}/v1", api_key="unused", model="reasonray", max_retries=0)
    # json_mode sends no schema: the prompt says which keys, as LangChain's docs tell users to
    question = (
        '[[sim answer={"value":42}]] What is 17 + 25? Reply in JSON with the key "value".' if method == "json_mode" else "What is 17 + 25?"
    )
    assert llm.with_structured_output(Sum, method=method).invoke(question) == Sum(value=42)


def test_tool_choice_none_auto_required_and_named(sdk):
    answer = {"type": "function", "function": {"name": "Sum", "parameters": Sum.model_json_schema()}}
    weather = {
        "type": "function",
        "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }
    named = sdk.chat.completions.create(
        model="reasonray", messages=QUESTION, tools=[weather, answer], tool_choice={"type": "function", "function": {"name": "Sum"}}
    )
    [call] = named.choices[0].message.tool_calls
    assert call.function.name == "Sum" and json.loads(call.function.arguments) == {"value": 42}
    required = sdk.chat.completions.create(model="reasonray", messages=QUESTION, tools=[answer], tool_choice="required")
    assert required.choices[0].finish_reason == "tool_calls" and required.choices[0].message.tool_calls[0].function.name == "Sum"
    none = sdk.chat.completions.create(model="reasonray", messages=QUESTION, tools=[answer], tool_choice="none")
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content == "42"
    refused(lambda: sdk.chat.completions.create(model="reasonray", messages=QUESTION, tool_choice="required"), "tool_choice")
    refused(
        lambda: sdk.chat.completions.create(
            model="reasonray", messages=QUESTION, tools=[answer], tool_choice={"type": "function", "function": {"name": "nope"}}
        ),
        "tool_choice",
    )


def test_n_runs_independent_choices_and_seed_reaches_the_model(sdk):
    several = sdk.chat.completions.create(model="reasonray", messages=QUESTION, n=3, seed=7, temperature=1)
    assert [c.index for c in several.choices] == [0, 1, 2] and all(c.message.content == "42" for c in several.choices)
    one = sdk.chat.completions.create(model="reasonray", messages=QUESTION)
    assert several.usage.completion_tokens > one.usage.completion_tokens
    refused(lambda: sdk.chat.completions.create(model="reasonray", messages=QUESTION, n=2, stream=True), "n")
    refused(lambda: sdk.chat.completions.create(model="reasonray", messages=QUESTION, n=99), "n")


@pytest.mark.parametrize(
    ("param", "value"),
    [("temperature", 5), ("top_p", 3), ("presence_penalty", -3), ("frequency_penalty", 2.5), ("top_logprobs", 50)],
)
def test_sampling_ranges_are_validated(sdk, param, value):
    refused(lambda: sdk.chat.completions.create(model="reasonray", messages=QUESTION, **{param: value}), param)


def test_parameters_it_cannot_honour_are_refused_by_name(sdk):
    assert "logprobs" in refused(lambda: sdk.chat.completions.create(model="reasonray", messages=QUESTION, logprobs=True), "logprobs")
    refused(lambda: sdk.chat.completions.create(model="reasonray", messages=QUESTION, logit_bias={"50256": -100}), "logit_bias")
    refused(lambda: sdk.chat.completions.create(model="reasonray", messages=QUESTION, store=True), "store")
    # reasoning_effort is honoured (docs/reasoning-models.md); a value reasoning models do not know is refused by name
    refused(lambda: sdk.chat.completions.create(model="reasonray", messages=QUESTION, reasoning_effort="extreme"), "reasoning_effort")
    unknown = refused(lambda: sdk.chat.completions.create(model="reasonray", messages=QUESTION, extra_body={"bogus": 1}), "bogus")
    assert unknown == "Unrecognized request argument supplied: bogus"


def test_models_are_retrieved_by_id_and_every_v1_error_has_openais_shape(sdk, api):
    assert sdk.models.retrieve("reasonray/chain_of_thought").id == "reasonray/chain_of_thought"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.models.retrieve("gpt-9")
    assert missing.value.body["code"] == "model_not_found"
    for response, status in (
        (api.get("/v1/nothing/here"), 404),
        (api.delete("/v1/models"), 405),
        (api.post("/v1/reasoning/execute", json={"query": 3}), 400),
    ):
        error = response.json()["error"]
        assert response.status_code == status and set(error) >= {"message", "type", "param", "code"}, response.text
    assert httpx.Client(base_url=str(api.base_url)).get("/nothing").json() == {"detail": "Not Found"}  # outside /v1: FastAPI's own
