"""rpc.discover: the OpenRPC document of the method table validates against the OpenRPC meta-schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
from referencing import Registry
from referencing.jsonschema import DRAFT7

from reasonray.api.access.auth import CURRENT_PRINCIPAL, Policy, Principal
from reasonray.api.access.limits import LocalLimits
from reasonray.api.access.tenancy import Guard, LocalOwners, install_guard
from reasonray.api.app import local_dispatcher
from reasonray.api.context import NoParams
from reasonray.api.declarations import EVERYONE, Access
from reasonray.api.jsonrpc import declare
from reasonray.api.openrpc import discover_document
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.auth_settings import AuthSettings
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
from reasonray.stores.sessions import SqliteSessionStore
from tests.client_tools import WEATHER
from tests.docs_examples import REPO
from tests.unit.test_doc_promises import ITEM, call, calls_with_results, full_dispatcher

DATA = REPO / "tests" / "data"


def meta_validator() -> jsonschema.Draft7Validator:
    """The OpenRPC meta-schema, its JSON Schema references (https://meta.json-schema.tools) served from
    the vendored copy (tests/data/README.md), so nothing is fetched."""
    tools = DRAFT7.create_resource(json.loads((DATA / "json-schema-tools-meta-schema.json").read_text()))
    registry = Registry().with_resources([("https://meta.json-schema.tools", tools), ("https://meta.json-schema.tools/", tools)])
    return jsonschema.Draft7Validator(json.loads((DATA / "openrpc-meta-schema.json").read_text()), registry=registry)


async def test_rpc_discover_documents_every_method_with_params_result_and_errors(tmp_path):
    llm = SimulatedLLM()
    sessions = LocalSessions(SessionPipeline(SqliteSessionStore(SessionState, tmp_path), llm, builtin_toolbox(), data_dir=tmp_path))
    rpc = local_dispatcher(ReasoningSettings(), llm, sessions=sessions)
    response, _ = await rpc.handle_payload({"jsonrpc": "2.0", "method": "rpc.discover", "id": 1})
    document = response["result"]
    meta_validator().validate(document)
    methods = {m["name"]: m for m in document["methods"]}
    assert set(methods) == set(rpc.methods)
    execute = methods["reasoning.execute"]
    params = {p["name"]: p for p in execute["params"]}
    assert params["query"]["required"] and not params["strategy"]["required"] and not params["stream"]["required"]
    assert params["memory"]["schema"] == {
        "anyOf": [{"$ref": "#/components/schemas/MemoryParams"}, {"type": "null"}],
        "default": None,
        "description": params["memory"]["description"],
    }
    assert execute["result"]["schema"]["title"] == "ExecuteResult" and "MemoryParams" in document["components"]["schemas"]
    codes = {int(c) for c in document["components"]["errors"]}
    assert {-32700, -32602, -32603, -32002, -32004, -32005, -32001, -32010, -32016} <= codes
    # the specification's -32001 is max iterations; unauthenticated has its own code; -32009 is retired
    errors = document["components"]["errors"]
    assert (errors["-32001"]["message"], errors["-32016"]["message"]) == ("max iterations", "unauthenticated") and "-32009" not in errors
    assert all(e["$ref"].startswith("#/components/errors/") for e in execute["errors"])


def test_the_meta_schema_rejects_a_broken_document():
    errors = list(meta_validator().iter_errors({"openrpc": "1.3.2", "info": {"title": "x"}, "methods": [{"name": "m"}]}))
    assert errors  # info.version and the method's params are missing


def test_every_method_advertises_a_real_result_schema(tmp_path):
    """No method's result is a bare `{"type": "object"}`: each names its members (reasonray.api.results)."""
    rpc = full_dispatcher(tmp_path)
    install_guard(rpc, admin_guard())
    document = discover_document(rpc).model_dump(mode="json")
    meta_validator().validate(document)
    assert {m["name"] for m in document["methods"]} == set(rpc.methods) and "memory.share_workspace" in rpc.methods
    for method in document["methods"]:
        schema = resolved(document, method["result"]["schema"])
        assert schema.get("type") == "object" and schema.get("properties"), method["name"]
        assert schema.get("required"), method["name"]  # something is always there
        if method["name"] != "rpc.discover":  # the OpenRPC document is returned verbatim
            assert "trace_id" in schema["required"], method["name"]


def test_a_method_without_a_result_model_is_refused():
    rpc = local_dispatcher(ReasoningSettings(), SimulatedLLM())

    async def untyped(params: NoParams, call):
        return {}

    with pytest.raises(TypeError, match=r"test\.untyped"):
        declare(rpc.methods, "test.untyped", access=Access(EVERYONE))(untyped)
    assert "test.untyped" not in rpc.methods and "test.untyped" not in {m["name"] for m in discover_document(rpc).methods}


def resolved(document: dict, schema: dict) -> dict:
    ref = schema.get("$ref")
    return document["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema


def admin_guard() -> Guard:
    auth = AuthSettings.model_validate({"jwt_secret": "s" * 40})

    async def strategy_of(params):
        return params.strategy or "chain_of_thought"

    async def exists(agent_id):
        return False

    async def strategies(agent_id):
        return ["chain_of_thought"]

    return Guard(Policy(auth), LocalOwners(), LocalLimits(), agent_exists=exists, strategy_of=strategy_of, agent_strategies=strategies)


async def test_the_real_result_of_every_method_validates_against_its_advertised_schema(tmp_path):
    """Each method runs through the in-process dispatcher (memory bank, sessions, the guard for
    memory.share_workspace) and its result, as it goes on the wire, validates against the schema
    rpc.discover advertises for it, `$ref`s resolved in the document's components."""
    rpc = full_dispatcher(tmp_path)
    install_guard(rpc, admin_guard())
    # not an admin: the guard claims what the caller creates, and shares and filters for it
    token = CURRENT_PRINCIPAL.set(Principal(sub="alice", roles=("reasoner", "operator")))
    try:
        response, _ = await call(rpc, "rpc.discover", {})
        document = response["result"]
        by_name = {m["name"]: m["result"]["schema"] for m in document["methods"]}

        def check(method: str, result: dict) -> None:
            schema = {**by_name[method], "components": document["components"]}
            errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(result), key=str)
            assert not errors, (method, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]])

        answered = {"rpc.discover"}
        check("rpc.discover", document)
        created, _ = await call(rpc, "session.create", {"server_tools": ["calculator"], "client_tools": [WEATHER]})
        stored, _ = await call(rpc, "memory.store", {"items": [ITEM], "workspace": "shared-ws"})
        shared, _ = await call(rpc, "memory.share_workspace", {"workspace": "shared-ws", "readers": ["bob"]})
        session_id = created["result"]["session_id"]
        pending, _ = await call(
            rpc, "session.turn", {"session_id": session_id, "message": 'Oslo? [[sim call=get_weather {"city": "Oslo"}]]'}
        )
        [pending_call] = pending["result"]["pending_tool_calls"]
        resumed, _ = await call(
            rpc,
            "session.resume",
            {"session_id": session_id, "tool_results": [{"tool_call_id": pending_call["tool_call_id"], "content": "Snow"}]},
        )
        child = {**ITEM, "title": "Check units twice", "parent_memory_id": stored["result"]["stored"][0]["id"]}
        await call(rpc, "memory.store", {"items": [child], "workspace": "shared-ws"})
        for method, response in [
            ("session.create", created),
            ("memory.store", stored),
            ("memory.share_workspace", shared),
            ("session.turn", pending),
            ("session.resume", resumed),
        ]:
            check(method, response["result"])
            answered.add(method)
        memory_id = stored["result"]["stored"][0]["id"]
        for method, params in calls_with_results(session_id, memory_id):
            if "memory_id" in params or "workspace" in params or method in ("memory.retrieve", "retrieve_memories", "memory.errors"):
                params = {**params, "workspace": "shared-ws"}  # the memory with a descendant
            response, _ = await call(rpc, method, params)
            assert "result" in response, (method, response)
            check(method, response["result"])
            answered.add(method)
        assert answered == set(rpc.methods)
    finally:
        CURRENT_PRINCIPAL.reset(token)


def test_a_standard_dereferencer_resolves_the_document_and_every_result_is_a_real_schema(tmp_path):
    """jsonref inlines every `$ref`: a recursive type (GenealogyNode) is reached by `$ref` only, so the
    dereferenced document is finite, its recursion a cycle, not an unbounded expansion."""
    import jsonref

    document = discover_document(full_dispatcher(tmp_path)).model_dump(mode="json")
    dereferenced = jsonref.replace_refs(document, proxies=False, lazy_load=False)
    for method in dereferenced["methods"]:
        result = method["result"]["schema"]
        assert result.get("type") == "object" and result.get("properties"), method["name"]  # not a bare `object`
        assert "$ref" not in json.dumps(method["params"], default=lambda _: "<cycle>"), method["name"]
    genealogy = {m["name"]: m for m in dereferenced["methods"]}["memory.genealogy"]["result"]["schema"]
    node = genealogy["properties"]["descendants"]["items"]
    assert node["properties"]["children"]["items"] is node  # the recursion, as one shared object
