"""Property-based fuzzing of the JSON-RPC surface in-process: hypothesis builds envelopes (valid,
broken and hostile) and every method's params from its Pydantic schema, sends them through the HTTP
front door's body rules and the dispatcher with a scripted model, and checks each answer is a
well-formed JSON-RPC response that can be encoded, and never an internal error.

The default run tries a few hundred cases; the slow suite tries 10,000. Schemathesis fuzzes the
running service over HTTP from /openapi.json (tests/integration/test_security_http.py)."""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reasonray.api.app import local_dispatcher
from reasonray.api.surfaces.guard import GuardSettings, Refusal, check_body
from reasonray.gateway.testing import FunctionLLM
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
from reasonray.stores.sessions import SqliteSessionStore
from tests.unit.memory_harness import local_memory, make_bank

ENABLED = ["chain_of_thought", "self_consistency", "tree_of_thought", "refine", "matts", "bounded_context"]
# the whole method table: sessions and a real memory bank too, so session.*, memory.*, stats.* and
# solve_coding_task are fuzzed with the rest (the data lives in a directory removed at exit)
DATA = Path(tempfile.mkdtemp(prefix="reasonray-fuzz-"))
atexit.register(shutil.rmtree, DATA, True)
LLM = FunctionLLM(lambda request: "<thinking>short</thinking><answer>4</answer>")
RPC = local_dispatcher(
    ReasoningSettings(enabled_strategies=ENABLED, default_strategy="chain_of_thought"),
    LLM,
    sessions=LocalSessions(SessionPipeline(SqliteSessionStore(SessionState, DATA / "sessions"), LLM, builtin_toolbox(), data_dir=DATA)),
    memory=local_memory(make_bank(DATA / "chroma")),
)
METHODS = sorted(RPC.methods)
# one loop for every case: the sessions' locks and the bank's client outlive a single asyncio.run
LOOP = asyncio.new_event_loop()
GUARD = GuardSettings()

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20
)
hostile_text = st.sampled_from(["\ud800", "x" * 200_000, "", " ", "\x00", "<answer>", "9" * 5000]) | st.text(max_size=60)
ids = st.none() | st.integers() | st.text(max_size=300) | st.sampled_from([2**64, -(2**70), "\udfff", 1.5, True, [], {}])


def from_schema(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy:
    """A value for a JSON schema property: mostly valid, sometimes at or past its bounds."""
    if depth > 3:
        return json_values
    if "$ref" in schema:
        return from_schema(defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), defs, depth + 1)
    if "enum" in schema:
        return st.sampled_from(schema["enum"]) | hostile_text
    if "const" in schema:
        return st.just(schema["const"])
    if "anyOf" in schema:
        return st.one_of([from_schema(s, defs, depth + 1) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 80), 80)) | hostile_text
    if kind == "integer":
        low, high = schema.get("minimum", -(2**31)), schema.get("maximum", 2**31)
        return st.integers(low, high) | st.integers() | st.sampled_from([low - 1, high + 1, 10**30])
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers()
    if kind == "boolean":
        return st.booleans() | st.just("true")
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs, depth + 1), max_size=4)
    if kind == "object" or "properties" in schema:
        return object_of(schema, defs, depth + 1)
    return json_values


def object_of(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy:
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    fixed = {name: from_schema(prop, defs, depth) for name, prop in properties.items() if name in required}
    optional = {name: from_schema(prop, defs, depth) for name, prop in properties.items() if name not in required}
    extra = st.dictionaries(st.text(max_size=8), json_values, max_size=2)
    return st.fixed_dictionaries(fixed, optional=optional) | st.tuples(st.fixed_dictionaries(fixed, optional=optional), extra).map(
        lambda pair: {**pair[0], **pair[1]}
    )


def params_for(method: str) -> st.SearchStrategy:
    schema = RPC.methods[method].params.model_json_schema()
    return object_of(schema, schema.get("$defs", {}))


@st.composite
def envelopes(draw) -> Any:
    method = draw(st.sampled_from(METHODS) | st.text(max_size=20))
    call: dict[str, Any] = {"jsonrpc": draw(st.just("2.0") | st.sampled_from(["1.0", 2.0, None]))}
    call["method"] = method
    if draw(st.booleans()):
        call["params"] = draw(params_for(method) if method in RPC.methods else json_values)
    if draw(st.integers(0, 4)):
        call["id"] = draw(ids)
    return call


bodies = (
    envelopes().map(json.dumps)
    | st.lists(envelopes(), min_size=0, max_size=5).map(json.dumps)
    | json_values.map(json.dumps)
    | st.binary(max_size=100)
    | st.integers(1, 5000).map(lambda n: "[" * n)
)


def check(body: str | bytes) -> None:
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    try:
        check_body(raw, GUARD)
    except Refusal as refusal:
        assert 400 <= refusal.status < 500
        return
    response, _ = LOOP.run_until_complete(RPC.handle(raw))
    if response is None:  # notifications only
        return
    json.dumps(response, ensure_ascii=False).encode("utf-8")  # the answer can be sent
    for answer in response if isinstance(response, list) else [response]:
        assert answer["jsonrpc"] == "2.0" and "id" in answer
        assert ("result" in answer) != ("error" in answer), answer
        if "error" in answer:
            error = answer["error"]
            assert isinstance(error["code"], int) and isinstance(error["message"], str)
            assert error["code"] != -32603, error  # an internal error is a bug


FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@FAST
@given(bodies)
def test_every_body_gets_a_well_formed_answer_or_a_4xx(body):
    check(body)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(bodies)
def test_ten_thousand_bodies_get_well_formed_answers(body):
    check(body)


def test_every_method_of_the_table_is_fuzzed():
    families = {name.split(".")[0] for name in METHODS}
    assert {"session", "memory", "stats", "solve_coding_task"} <= families, METHODS


@pytest.mark.parametrize(
    ("method", "field"), [("reasoning.execute", "query"), ("reasoning.bounded_context", "query"), ("solve_coding_task", "task")]
)
def test_a_query_of_whitespace_is_invalid_params_in_every_method(method, field):
    # the first bug the fuzzer found: bounded_context accepted " " and ExecuteParams refused it as an internal error
    response, _ = LOOP.run_until_complete(RPC.handle(json.dumps({"jsonrpc": "2.0", "method": method, "params": {field: " "}, "id": 1})))
    assert response["error"]["code"] == -32602 and "query is empty" in response["error"]["message"]
