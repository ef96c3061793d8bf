"""rpc.discover: the OpenRPC document of the method table validates against the OpenRPC meta-schema."""

from __future__ import annotations

import json

import jsonschema
from referencing import Registry
from referencing.jsonschema import DRAFT7

from reasonray.api.app import local_dispatcher
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import FileSessionRepository, LocalSessions, SessionPipeline
from tests.docs_examples import REPO

DATA = REPO / "tests" / "data"


def meta_validator() -> jsonschema.Draft7Validator:
    """The OpenRPC meta-schema, its JSON Schema references (https://meta.json-schema.tools) served from
    the vendored copy (tests/data/README.md), so nothing is fetched."""
    tools = DRAFT7.create_resource(json.loads((DATA / "json-schema-tools-meta-schema.json").read_text()))
    registry = Registry().with_resources([("https://meta.json-schema.tools", tools), ("https://meta.json-schema.tools/", tools)])
    return jsonschema.Draft7Validator(json.loads((DATA / "openrpc-meta-schema.json").read_text()), registry=registry)


async def test_rpc_discover_documents_every_method_with_params_result_and_errors(tmp_path):
    llm = SimulatedLLM()
    sessions = LocalSessions(SessionPipeline(FileSessionRepository(tmp_path), llm, builtin_toolbox(), data_dir=tmp_path))
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
    assert {-32700, -32602, -32603, -32002, -32004, -32005, -32009, -32010} <= codes
    assert all(e["$ref"].startswith("#/components/errors/") for e in execute["errors"])


def test_the_meta_schema_rejects_a_broken_document():
    errors = list(meta_validator().iter_errors({"openrpc": "1.3.2", "info": {"title": "x"}, "methods": [{"name": "m"}]}))
    assert errors  # info.version and the method's params are missing
