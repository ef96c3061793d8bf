"""The MCP server (docs/mcp.md): ReasonRay's JSON-RPC methods as MCP tools and resources.

Built with the official `mcp` SDK's low-level `Server` over a `Dispatcher`, so every tool is a
JSON-RPC method: its input schema is the method's Pydantic params model, its output schema the
model the handler returns (where it has one), and a failed call is a tool error carrying the
JSON-RPC error. Served two ways: Streamable HTTP at `/mcp` on the Serve application (stateless, so
any replica answers any request) and stdio (`reasonray mcp`, for desktop clients).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import mcp_types as types
from mcp import MCPError
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.version import SUPPORTED_PROTOCOL_VERSIONS
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from reasonray import __version__
from reasonray.api.access.auth import CURRENT_PRINCIPAL, Principal, TokenVerifier
from reasonray.api.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND, Dispatcher, RpcError, error_for, wire
from reasonray.api.openrpc import result_schema
from reasonray.kernel.config import Settings
from reasonray.kernel.errors import UnauthenticatedError

STRATEGIES_URI = "reasonray://strategies"
WORKSPACES_URI = "reasonray://memory/workspaces"
MEMORY_TEMPLATE = "reasonray://memory/{workspace}/{memory_id}"
SESSION_TEMPLATE = "reasonray://sessions/{session_id}"
TOKEN_ENV = "REASONRAY_TOKEN"  # the stdio server's bearer token (or `reasonray mcp --token`)


def build_server(rpc: Dispatcher, principal: Callable[[], Principal | None] | None = None) -> Server:
    """The MCP server over `rpc`. Calls run as the request's principal (`CURRENT_PRINCIPAL`, which the HTTP
    auth gate sets), or as `principal()` when given: the stdio server's own verified caller."""
    # a tool per method declared with `mcp_tool` (memory tools exist only where the server has a bank): its input schema
    # the params model, its output schema the result model
    tools = [
        types.Tool(
            name=m.mcp_tool, description=m.description, input_schema=fillable(m.params.model_json_schema()), output_schema=result_schema(m)
        )
        for m in rpc.methods.values()
        if m.mcp_tool is not None
    ]
    by_name = {m.mcp_tool: name for name, m in rpc.methods.items() if m.mcp_tool is not None}
    has_memory = "memory.get" in rpc.methods
    # resources: the strategies and, with a memory bank, its workspaces; templates: a session by id and, with a
    # memory bank, a memory item by workspace and id
    listed = [("strategies", STRATEGIES_URI, "The enabled strategies and their config schemas.")]
    listed += [("memory-workspaces", WORKSPACES_URI, "Memory workspaces and their sizes.")] if has_memory else []
    resources = [types.Resource(name=name, uri=uri, mime_type="application/json", description=about) for name, uri, about in listed]
    listed = [("session", SESSION_TEMPLATE, "A session's state and last trace.")]
    listed += [("memory", MEMORY_TEMPLATE, "One memory item of a workspace.")] if has_memory else []
    templates = [
        types.ResourceTemplate(name=name, uri_template=uri, mime_type="application/json", description=about) for name, uri, about in listed
    ]

    async def call(method: str, params: dict[str, Any]) -> Any:
        """The method's typed result, through the method table (the guard of an authenticated API included)."""
        try:
            caller = principal() if principal is not None else CURRENT_PRINCIPAL.get()
        except UnauthenticatedError as exc:
            raise error_for(exc) from None
        token = CURRENT_PRINCIPAL.set(caller)
        try:
            return await rpc.run(method, params)
        finally:
            CURRENT_PRINCIPAL.reset(token)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            if (method := by_name.get(params.name)) is None:
                raise RpcError(METHOD_NOT_FOUND, f"unknown tool {params.name!r}; tools: {', '.join(by_name)}")
            result = wire(await call(method, params.arguments or {}))
        except RpcError as error:  # a tool error carrying the JSON-RPC error (code, message, data)
            return types.CallToolResult(content=[types.TextContent(text=json.dumps(error.body()))], is_error=True)
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(result))], structured_content=result)

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=resources)

    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        method, args = _resource_call(uri, has_memory)
        try:
            text = json.dumps(wire(await call(method, args)))
        except RpcError as error:
            # an MCP error carrying the JSON-RPC one (a plain exception would reach the client as "Internal server error")
            raise MCPError(error.code, f"{uri}: {error.message}", error.data or None) from None
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)])

    return Server(
        "reasonray",
        version=__version__,
        instructions="LLM reasoning strategies, sessions with tools and a ReasoningBank memory (docs/mcp.md).",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


def fillable(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's input schema as form-filling clients (the MCP Inspector) can use: `$ref`s to `$defs` inlined
    (a recursive one stays a reference) and optional parameters, which Pydantic types `anyOf [T, null]`,
    typed `T` (leaving them out is how a caller says null)."""
    defs: dict[str, Any] = schema.get("$defs", {})
    kept: set[str] = set()

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in seen:
                kept.add(name)
                return node
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return walk({**defs[name], **rest}, (*seen, name))
        variants = node.get("anyOf")
        if isinstance(variants, list) and len(variants) == 2 and {"type": "null"} in variants:
            [other] = [v for v in variants if v != {"type": "null"}]
            rest = {k: v for k, v in node.items() if k != "anyOf" and not (k == "default" and v is None)}
            return walk({**other, **rest}, seen)
        return {k: walk(v, seen) for k, v in node.items() if k != "$defs"}

    result: dict[str, Any] = walk(schema, ())
    if kept:
        result["$defs"] = {name: walk(defs[name], (name,)) for name in kept}
    return result


def _resource_call(uri: str, has_memory: bool) -> tuple[str, dict[str, Any]]:
    """The JSON-RPC call that reads a resource URI."""
    if uri == STRATEGIES_URI:
        return "reasoning.strategies", {}
    if uri == WORKSPACES_URI and has_memory:
        return "memory.list_workspaces", {}
    if uri.startswith("reasonray://sessions/"):
        return "session.get", {"session_id": uri.removeprefix("reasonray://sessions/")}
    parts = uri.removeprefix("reasonray://memory/").split("/")
    if has_memory and uri.startswith("reasonray://memory/") and len(parts) == 2:
        return "memory.get", {"workspace": parts[0], "memory_id": parts[1]}
    raise MCPError(INVALID_PARAMS, f"unknown resource {uri!r}; list them with resources/list and resources/templates/list")


class StdioCaller:
    """Who the tool calls of a stdio server run as: the principal of its bearer token, verified again at
    every call (so an expired or revoked key stops working while the server runs). None when `[auth]`
    is not configured: the process then runs unguarded, as the user who started it."""

    def __init__(self, settings: Settings, token: str | None) -> None:
        self.verifier = TokenVerifier(settings.auth) if settings.auth.enabled else None
        self.token = (token or "").strip()
        if self.verifier is not None and not self.token:
            raise UnauthenticatedError(
                f"authentication is configured ([auth]) and no bearer token was given: pass one with --token or the "
                f"{TOKEN_ENV} environment variable (an operator mints one with `reasonray token create --sub NAME --role ROLE`)"
            )

    def principal(self) -> Principal | None:
        """The verified caller (raises UnauthenticatedError saying what is wrong with the token)."""
        return None if self.verifier is None else self.verifier.principal(self.token)


async def serve_stdio(rpc: Dispatcher, caller: StdioCaller | None = None, *, closing: Callable[[], Awaitable[None]] | None = None) -> None:
    """Serve MCP over this process's stdin and stdout until the client closes them, every call as `caller`;
    then `closing()` (the model client's HTTP session, which would otherwise leak at exit)."""
    from mcp.server.stdio import stdio_server

    server = build_server(rpc, principal=caller.principal if caller is not None else None)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        if closing is not None:
            await closing()


def unsupported_version(scope: Scope) -> JSONResponse | None:
    """A 400 naming the supported revisions when the request's MCP-Protocol-Version is none of them."""
    requested = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"mcp-protocol-version"), None)
    if requested is None or requested in SUPPORTED_PROTOCOL_VERSIONS:
        return None
    message = f"unsupported MCP-Protocol-Version {requested!r}; this server supports {', '.join(SUPPORTED_PROTOCOL_VERSIONS)}"
    data = {"supported": list(SUPPORTED_PROTOCOL_VERSIONS), "requested": requested}
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32602, "message": message, "data": data}}, status_code=400)


class _McpAsgi:
    """The route's endpoint: an ASGI object (not a function, so Starlette hands it the raw request) that finds the
    endpoint at call time: Serve ships the route table to its replicas by value, so a route holding the endpoint
    itself would hold a copy that `McpEndpoint.serve` never reaches."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = McpEndpoint.current
        if endpoint is None:
            await JSONResponse({"error": "the MCP endpoint is not ready"}, status_code=503)(scope, receive, send)
            return
        if (refusal := unsupported_version(scope)) is not None:
            await refusal(scope, receive, send)
            return
        await endpoint._started()
        await endpoint.manager.handle_request(scope, receive, send)


class McpEndpoint:
    """The ASGI app at `/mcp`: Streamable HTTP through the SDK's session manager, stateless and answering in
    JSON, so every replica serves any request. One per process (a Serve replica runs one ingress); the
    manager's task group starts with the first request, inside the replica's event loop."""

    current: ClassVar[McpEndpoint | None] = None
    asgi: ClassVar[_McpAsgi] = _McpAsgi()

    def __init__(self, rpc: Dispatcher) -> None:
        self.manager = StreamableHTTPSessionManager(build_server(rpc), stateless=True, json_response=True)
        self._ready: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None

    @classmethod
    def serve(cls, rpc: Dispatcher) -> None:
        cls.current = cls(rpc)

    async def _started(self) -> None:
        if self._ready is None:
            self._ready = asyncio.Event()
            self._runner = asyncio.create_task(self._run(self._ready))
        await self._ready.wait()

    async def _run(self, ready: asyncio.Event) -> None:
        async with self.manager.run():
            ready.set()
            await asyncio.Event().wait()  # for the life of the replica
