"""response_format: an answer made into the requested JSON (reasonray/api/structured.py), with strict scripted
models: the answer as it is when it conforms, one repair call (response_format sent where the endpoint
enforces it), the one-property fallback, or an error saying what did not validate."""

from __future__ import annotations

import json

import pytest

from reasonray.api.structured import conform, json_values, schema_of
from reasonray.gateway.capabilities import Capabilities
from reasonray.gateway.testing import ScriptedLLM
from reasonray.kernel.errors import InvalidParamsError, ModelBehaviorError

SUM = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"], "additionalProperties": False}
PAIR = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a", "b"]}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "S", "strict": True, "schema": schema}}


class EnforcingLLM(ScriptedLLM):
    capabilities = Capabilities(structured_output=True)


def test_json_is_found_whole_fenced_or_embedded():
    assert list(json_values('{"a": 1}')) == [{"a": 1}, {"a": 1}]
    assert {"a": 1} in json_values('Here:\n```json\n{"a": 1}\n```')
    assert {"b": [2]} in json_values('The result is {"b": [2]}, as asked.')
    assert list(json_values("no json here")) == []


async def test_an_answer_that_conforms_is_used_as_it_is_without_a_call():
    llm = ScriptedLLM([])
    done = await conform('Sure: {"value": 42}', schema_format(SUM), llm, "q")
    assert (json.loads(done.content), done.how) == ({"value": 42}, "answer")


async def test_one_repair_call_with_the_format_sent_only_where_the_endpoint_enforces_it():
    for llm, sent in ((ScriptedLLM(['{"a": 1, "b": "x"}']), None), (EnforcingLLM(['{"a": 1, "b": "x"}']), schema_format(PAIR))):
        done = await conform("a is one and b is x", schema_format(PAIR), llm, "what are a and b?")
        assert (json.loads(done.content), done.how) == ({"a": 1, "b": "x"}, "repair")
        [request] = llm.requests
        assert request.response_format == sent
        assert "a is one and b is x" in request.messages[-1].content and '"required":["a","b"]' in request.messages[-1].content
        llm.assert_complete()


async def test_a_bare_answer_fills_a_one_property_schema_and_json_object_wraps_it():
    assert json.loads((await conform("42", schema_format(SUM), ScriptedLLM(["I cannot"]), "q")).content) == {"value": 42}
    wrapped = await conform("forty-two", {"type": "json_object"}, ScriptedLLM(["still prose"]), "q")
    assert (json.loads(wrapped.content), wrapped.how) == ({"answer": "forty-two"}, "wrapped")
    assert json.loads((await conform("42", {"type": "json_object"}, ScriptedLLM(["nope"]), "q")).content) == {"answer": 42}


async def test_what_cannot_be_made_valid_is_an_error_naming_the_violation():
    with pytest.raises(ModelBehaviorError) as error:
        await conform("hello", schema_format(PAIR), ScriptedLLM(['{"a": "one", "b": "x"}']), "q")
    assert "response_format" in error.value.message and "'one' is not of type 'integer'" in error.value.message


def test_an_invalid_schema_is_the_callers_error():
    with pytest.raises(InvalidParamsError, match="not a valid JSON Schema"):
        schema_of(schema_format({"type": "no-such-type"}))
    assert schema_of({"type": "json_object"}) is None
