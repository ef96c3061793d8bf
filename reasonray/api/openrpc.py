"""`rpc.discover`: the OpenRPC 1.x document of the API, generated from the method table.

Every method's params come from its Pydantic model (one `by-name` param per field, `required` as the
model says), its result from the result model it was declared with (`declare(..., result=...)`,
reasonray.api.results; `declare` refuses a method without one: generated clients get real types, not `object`),
and the errors from the error tree (`error_classes`) and the codes JSON-RPC reserves, so clients and tools can be
generated from the running server and never drift from it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaValue

from reasonray import __version__
from reasonray.api.context import NoParams
from reasonray.api.declarations import OPERATORS, Access
from reasonray.api.jsonrpc import CODE_NAMES, Call, Dispatcher, Method, declare, error_classes
from reasonray.api.results import OpenRpcDocument

OPENRPC_VERSION = "1.3.2"
DISCOVER = "rpc.discover"
STREAM_DOC = (
    "POST /rpc only: answer as Server-Sent Events, one per run event as it happens, then `event: response` "
    "with the JSON-RPC response (docs/api.md, Streaming)"
)


def result_schema(method: Method) -> JsonSchemaValue:
    """The JSON Schema of what the method returns (standalone, `$defs` inside)."""
    return method.result.model_json_schema(mode="serialization")


def discover_document(rpc: Dispatcher) -> OpenRpcDocument:
    components: dict[str, Any] = {}

    def schema_of(model: type[BaseModel], mode: Literal["validation", "serialization"]) -> JsonSchemaValue:
        """The model's schema, its `$defs` collected into components.schemas and every `$ref` pointing there."""
        schema = model.model_json_schema(mode=mode, ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        return schema

    # every code the API answers with: the protocol's (by their names) and the error tree's (by the first class's type)
    codes = dict(CODE_NAMES)
    for cls in error_classes():
        codes.setdefault(cls.code, cls.error_type.replace("_", " "))
    errors = [{"code": code, "message": message} for code, message in sorted(codes.items(), reverse=True)]
    methods = []
    for name in sorted(rpc.methods):
        method = rpc.methods[name]
        params_schema = schema_of(method.params, "validation")
        required = set(params_schema.get("required", []))
        params = [
            {
                "name": field,
                "required": field in required,
                "schema": schema,
                **({"description": schema["description"]} if "description" in schema else {}),
            }
            for field, schema in params_schema.get("properties", {}).items()
        ]
        if method.stream:  # a transport option, not a model field: POST /rpc answers it as SSE
            params.append({"name": "stream", "required": False, "schema": {"type": "boolean", "default": False}, "description": STREAM_DOC})
        methods.append(
            {
                "name": name,
                "summary": (method.description.splitlines() or [name])[0][:200],
                "description": method.description or name,
                "paramStructure": "by-name",
                "params": params,
                "result": {"name": f"{name}.result", "schema": schema_of(method.result, "serialization")},
                "errors": [{"$ref": f"#/components/errors/{e['code']}"} for e in errors],
            }
        )
    return OpenRpcDocument(
        openrpc=OPENRPC_VERSION,
        info={"title": "ReasonRay", "version": __version__, "description": "LLM reasoning served on Ray (docs/api.md)."},
        methods=methods,
        components={"schemas": components, "errors": {str(e["code"]): e for e in errors}},
    )


def add_discover(rpc: Dispatcher) -> None:
    """Register `rpc.discover` (OpenRPC's service discovery method) on the dispatcher."""

    @declare(rpc.methods, DISCOVER, access=Access(OPERATORS))
    async def discover(params: NoParams, call: Call) -> OpenRpcDocument:
        """The OpenRPC document of this API: every method with its params, result and errors."""
        return discover_document(rpc)
