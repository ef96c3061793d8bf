"""Answers in the shape a caller asked for (OpenAI's `response_format`): a JSON object, or JSON that
validates against a JSON Schema.

The run answers as its strategy does; `conform` then turns that answer into the requested JSON in
the cheapest way that holds: the answer itself when it already parses and validates (as a whole, in
a code fence, or as the first JSON value in it); else one repair call to the model, sent with
`response_format` where the endpoint enforces it (`capabilities_of(llm).structured_output`) and
asked in the prompt where it does not; else, for a schema of one property, the bare answer as that
property; else `ModelBehaviorError` saying what did not validate. `how` in the result says which way
the JSON was found.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Literal

import jsonschema
import msgspec
from jsonschema.exceptions import SchemaError, best_match

from reasonray.gateway.capabilities import capabilities_of
from reasonray.gateway.protocol import LLM, LLMRequest, Message
from reasonray.kernel.errors import InvalidParamsError, ModelBehaviorError
from reasonray.kernel.extraction import json_values

How = Literal["answer", "repair", "single_field", "wrapped"]
REPAIR_PROMPT = (
    "Rewrite the answer below as JSON and nothing else: no prose, no code fence. {shape}\n\nQuestion:\n{query}\n\nAnswer:\n{answer}"
)


class Conformed(msgspec.Struct, frozen=True):
    """The JSON text of an answer, and how it was found."""

    content: str
    how: How


def schema_of(response_format: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema a `response_format` of type json_object or json_schema (as ResponseFormatParams has
    checked) asks for (None: any JSON object); checked to be a valid schema."""
    if response_format.get("type") == "json_object":
        return None
    schema = (response_format.get("json_schema") or {}).get("schema") or {"type": "object"}
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise InvalidParamsError(
            f"response_format.json_schema.schema is not a valid JSON Schema: {exc.message}", {"param": "response_format"}
        ) from None
    return dict(schema)


def problem(value: Any, schema: dict[str, Any] | None) -> str | None:
    """What is wrong with `value` for the format (None: it conforms)."""
    if schema is None:
        return None if isinstance(value, dict) else f"a JSON object is required, not {type(value).__name__}"
    error = best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(map(str, error.absolute_path)) or "(root)"
    return f"{error.message} at {where}"


def _first_valid(text: str, schema: dict[str, Any] | None) -> Any | None:
    return next((v for v in json_values(text) if problem(v, schema) is None), None)


def _single_field(answer: str, schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """A schema of one property filled with the bare answer (`42` for `{"value": integer}`), if that validates."""
    if schema is None or schema.get("type") != "object" or len(schema.get("properties") or {}) != 1:
        return None
    (name,) = schema["properties"]
    bare = answer.strip()
    return next(({name: value} for value in [*json_values(bare), bare] if problem({name: value}, schema) is None), None)


async def conform(answer: str, response_format: dict[str, Any], llm: LLM, query: str) -> Conformed:
    """`answer` as JSON in the requested format, or ModelBehaviorError naming what did not validate."""
    schema = schema_of(response_format)
    if (value := _first_valid(answer, schema)) is not None:
        return Conformed(json.dumps(value), "answer")
    shape = (
        "It must be one JSON object."
        if schema is None
        else f"It must validate against this JSON Schema:\n{json.dumps(schema, separators=(',', ':'))}"
    )
    enforced = capabilities_of(llm).structured_output
    repair = await llm.complete(
        LLMRequest(
            messages=(Message(role="user", content=REPAIR_PROMPT.format(shape=shape, query=query, answer=answer)),),
            response_format=response_format if enforced else None,
        )
    )
    if (value := _first_valid(repair.text, schema)) is not None:
        return Conformed(json.dumps(value), "repair")
    if (single := _single_field(answer, schema)) is not None:
        return Conformed(json.dumps(single), "single_field")
    if schema is None:  # any object will do: the answer as its one field, a JSON scalar when it is exactly one
        bare = answer.strip()
        scalar = next((v for v in itertools.islice(json_values(bare), 1) if json.dumps(v) == bare), bare)
        return Conformed(json.dumps({"answer": scalar}), "wrapped")
    values = [*json_values(repair.text)] or [*json_values(answer)]
    why = problem(values[0], schema) if values else "the model's reply holds no JSON"
    raise ModelBehaviorError(
        f"the model's answer does not satisfy response_format, even after one repair: {why}",
        {"response_format": response_format.get("type"), "answer": answer[:500], "repair": repair.text[:500]},
    )
