"""Structured output as an enforcing server gives it: `response_format` (a JSON object, or JSON valid against
the schema asked for) and `tool_choice` ("none", "required", or one named tool called with arguments valid for
its parameters).

The simulated model first writes its usual tagged reply; this module recasts it: each tag becomes the field a
schema names for it (the `<answer>` goes to "answer", "result", "final_answer"..., a `<score>` to "score",
"rating"...), so the content stays what the model meant and only the shape follows the request.
"""

from __future__ import annotations

import json
import re
from typing import Any

TAG = re.compile(r"<(\w+)>(.*?)</\1>", re.DOTALL)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
TOOL_CHOICES = ("none", "auto", "required")
# Which of a reply's tags a schema field of this name carries (a field matches when its name contains one).
SYNONYMS = {
    "answer": ("answer", "result", "solution", "output", "value"),
    "score": ("score", "rating", "confidence", "grade"),
    "vote": ("vote", "choice", "best", "candidate", "selection", "index"),
    "step": ("step", "thought"),
    "thinking": ("reasoning", "thinking", "explanation", "rationale", "analysis"),
    "feedback": ("feedback", "critique", "comment", "suggestion"),
    "status": ("status", "verdict", "outcome"),
}


def tool_names(tools: tuple[dict[str, Any], ...]) -> list[str]:
    return [str((t.get("function") or {}).get("name")) for t in tools]


def forced_tool(tools: tuple[dict[str, Any], ...], tool_choice: str | dict[str, Any] | None) -> str | None:
    """What `tool_choice` asks for: "none", "auto" (or None: as the model likes), "required", or a tool's name.
    A choice that names nothing offered is a ValueError, as OpenAI's API rejects it."""
    if tool_choice is None or tool_choice == "auto":
        return None
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice {tool_choice!r}: use one of {', '.join(TOOL_CHOICES)} or a named function")
        if tool_choice == "required" and not tools:
            raise ValueError("tool_choice 'required' needs 'tools'")
        return tool_choice
    name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str):
        raise ValueError('a named tool_choice is {"type": "function", "function": {"name": ...}}')
    if name not in tool_names(tools):
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools offered ({', '.join(tool_names(tools)) or 'none'})")
    return name


def parameters_of(tools: tuple[dict[str, Any], ...], name: str) -> dict[str, Any]:
    parameters = next((t["function"].get("parameters") for t in tools if (t.get("function") or {}).get("name") == name), None)
    return parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}


def schema_of(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema a `response_format` asks for ({} for any JSON object); None for plain text."""
    if not response_format or (kind := response_format.get("type")) == "text":
        return None
    if kind == "json_object":  # llama-cpp-python also takes a schema here
        schema = response_format.get("schema")
        return schema if isinstance(schema, dict) else {}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise ValueError("response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}")
        return schema
    raise ValueError(f"response_format type {kind!r}: use text, json_object or json_schema")


def as_json(text: str, schema: dict[str, Any]) -> str:
    """The reply as a JSON object: valid against `schema`, or, for {}, its tags as keys (the untagged rest as "text")."""
    fields = {tag: body.strip() for tag, body in TAG.findall(text)}
    rest = TAG.sub(" ", text).strip()
    if rest or not fields:
        fields["text"] = rest
    value = instance(schema, fields) if schema else {("reasoning" if k == "thinking" else k): _typed(k, v) for k, v in fields.items()}
    return json.dumps(value, ensure_ascii=False)


def instance(schema: dict[str, Any], fields: dict[str, str], key: str = "", root: dict[str, Any] | None = None) -> Any:
    """A value valid against `schema` (object, array, string, number, integer, boolean, null, enum, const,
    anyOf/oneOf, `$ref` into `$defs` as Pydantic writes them, minimum/maximum, min/max items and length),
    carrying the reply's part that the field's name asks for."""
    root = schema if root is None else root
    if isinstance(ref := schema.get("$ref"), str):  # a local one ("#/$defs/Step"); a ref elsewhere is a ValueError
        if not ref.startswith("#"):
            raise ValueError(f"response_format schema: only local $ref ('#/...') is supported, not {ref!r}")
        target: Any = root
        for part in filter(None, ref.removeprefix("#").strip("/").split("/")):
            target = target.get(part) if isinstance(target, dict) else None
        if not isinstance(target, dict):
            raise ValueError(f"response_format schema: $ref {ref!r} points at nothing")
        return instance(target, fields, key, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        wanted = _field(key, fields)
        return next((v for v in schema["enum"] if str(v).lower() == wanted.lower()), schema["enum"][0])
    options = [o for o in [*(schema.get("anyOf") or []), *(schema.get("oneOf") or [])] if isinstance(o, dict) and o.get("type") != "null"]
    if options:  # anyOf's first, else oneOf's
        return instance(options[0], fields, key, root)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: instance(sub, fields, name, root) for name, sub in properties.items() if isinstance(sub, dict)}
    if kind == "array":
        items = schema["items"] if isinstance(schema.get("items"), dict) else {}
        size = min(max(int(schema.get("minItems", 1)), 1), int(schema.get("maxItems", 10**6)))
        return [instance(items, fields, key, root) for _ in range(size)]
    if kind in ("number", "integer"):
        found = NUMBER.findall(_field(key, fields))
        number = float(found[-1]) if found else 0.0
        number = min(max(number, float(schema.get("minimum", "-inf"))), float(schema.get("maximum", "inf")))
        return round(number) if kind == "integer" else number
    if kind == "boolean":
        if "status" in fields:
            return fields["status"] == "success"
        found = NUMBER.findall(fields.get("score", ""))
        return float(found[0]) >= 0.5 if found else True
    if kind == "null":
        return None
    text = _field(key, fields)[: int(schema["maxLength"]) if "maxLength" in schema else None]
    return text.ljust(int(schema.get("minLength", 0)), " ")


def _field(key: str, fields: dict[str, str]) -> str:
    name = key.lower()
    for tag, synonyms in SYNONYMS.items():
        if tag in fields and any(s in name for s in synonyms):
            return fields[tag]
    return fields.get("answer") or fields.get("text") or next(iter(fields.values()), "")


def _typed(tag: str, value: str) -> Any:
    try:
        return {"score": float, "vote": int}.get(tag, str)(value)
    except ValueError:
        return value
