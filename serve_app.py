"""The Ray Serve application: JSON-RPC 2.0 at POST /rpc, REST mirrors, GET /healthz, OpenAPI at /docs.

The deployment and its route table only: each route calls one method of the replica's `Replica`
(reasonray/actors/replica.py), which starts the Ray parts and takes the application from the one builder,
`reasonray.api.app.build_application`. `build_app` validates the settings and binds the ingress:

    serve run reasonray.serve_app:build_app config_path=config.toml
"""

import math
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve
from ray.serve import Application
from ray.serve.config import BackpressureConfig
from starlette.exceptions import HTTPException as StarletteHTTPException

from reasonray import __version__
from reasonray.actors.ray_compat import serve_http
from reasonray.actors.replica import rest_response, start_replica
from reasonray.api.jsonrpc import INVALID_PARAMS, RpcError
from reasonray.api.methods import accept_trace_id, declared, new_trace_id
from reasonray.api.registry_service import RegistryService
from reasonray.api.service import ExecuteParams
from reasonray.api.surfaces.gate import AuthGate
from reasonray.api.surfaces.guard import GuardSettings, HttpGuard
from reasonray.api.surfaces.mcp_server import McpEndpoint
from reasonray.api.surfaces.openai_compat import http_error
from reasonray.gateway.factory import client_for
from reasonray.kernel import tracing
from reasonray.kernel.config import Settings, load_settings, require_auth_off_loopback
from reasonray.memory.service import check_memory

api = FastAPI(
    title="ReasonRay",
    version=__version__,
    description="LLM reasoning on Ray. JSON-RPC 2.0 at POST /rpc (`rpc.discover` lists its methods: reasoning.*, agent.*, "
    "session.*, memory.*, stats.* and the aliases, each with its parameters and result); "
    "REST mirrors under /v1. See docs/api.md.",
)

api.add_route("/mcp", McpEndpoint.asgi, methods=["GET", "POST", "DELETE"], include_in_schema=False)  # type: ignore[arg-type]  # MCP, Streamable HTTP
# Host allow-list, JSON-only bodies, body and nesting caps, CORS: before any route (reasonray/api/surfaces/guard.py)
api.add_middleware(HttpGuard)
api.add_middleware(AuthGate)  # configured through `api.state.gate` (reasonray/api/surfaces/gate.py)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """404 and 405 under /v1 in OpenAI's error shape (docs/openai.md); FastAPI's own elsewhere."""
    if not request.url.path.startswith("/v1/"):
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
    error = http_error(exc.status_code, request.url.path, request.method, exc.detail)
    return JSONResponse(error.body, status_code=error.status, headers=exc.headers)


@api.exception_handler(RequestValidationError)
async def invalid_body(request: Request, exc: RequestValidationError) -> Response:
    """A REST body FastAPI could not validate is invalid params (-32602), answered as the dispatcher answers it."""
    where = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
    errors = [{"loc": [str(p) for p in e["loc"][1:]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
    trace_id = accept_trace_id(request.headers.get("x-trace-id")) or new_trace_id()
    return rest_response(RpcError(INVALID_PARAMS, f"invalid params: {where}", {"errors": errors, "trace_id": trace_id}), trace_id)


@serve.deployment
@serve.ingress(api)
class ReasonRayIngress:
    """One replica of the HTTP entry of every surface; what each route answers is `reasonray.actors.replica.Replica`'s."""

    def __init__(self, settings: dict[str, Any], app_name: str) -> None:
        config = Settings.model_validate(settings)
        host = config.server.host  # the address it binds is a name clients use too (unless it is a wildcard)
        api.state.guard = GuardSettings(
            allowed_hosts=[*config.server.allowed_hosts] + ([host] if host not in ("0.0.0.0", "::") else []),
            cors_origins=config.server.cors_origins,
            max_body_bytes=config.limits.max_body_bytes,
            max_json_depth=config.limits.max_json_depth,
        )
        self.replica = start_replica(config, app_name)
        api.state.gate = self.replica.gate  # the gate's tokens, limits and audit (None: authentication off)

    @api.post("/rpc", summary="JSON-RPC 2.0 endpoint (single or batch)")
    async def rpc(self, request: Request) -> Response:
        return await self.replica.rpc(request)

    @api.post("/v1/reasoning/execute", response_model=declared("reasoning.execute").result, summary="REST mirror of reasoning.execute")
    async def execute(self, params: ExecuteParams, request: Request) -> Response:
        return await self.replica.rest("reasoning.execute", params.model_dump(exclude_none=True), request)

    @api.get("/v1/strategies", response_model=declared("reasoning.strategies").result, summary="REST mirror of reasoning.strategies")
    async def strategies(self, request: Request) -> Response:
        return await self.replica.rest("reasoning.strategies", {}, request)

    @api.post("/v1/chat/completions", summary="OpenAI-compatible chat completions, plain or streamed (docs/openai.md)")
    async def chat_completions(self, request: Request) -> Response:
        return await self.replica.chat_completions(request)

    @api.get("/v1/models", summary="OpenAI-compatible model list: one model per enabled strategy (docs/openai.md)")
    async def models(self) -> Response:
        return await self.replica.models()

    @api.get("/v1/models/{model_id:path}", summary="OpenAI-compatible model retrieval (docs/openai.md)")
    async def model(self, model_id: str) -> Response:
        return await self.replica.models(model_id)

    @api.get("/.well-known/agent-card.json", summary="The A2A agent card (docs/interop.md)")
    async def agent_card(self, request: Request) -> Response:
        return await self.replica.agent_card(request)

    @api.post("/a2a/", include_in_schema=False)  # the same endpoint with a trailing slash, answered here (no 307)
    @api.post("/a2a", summary="A2A JSON-RPC endpoint (a2a-sdk): SendMessage, SendStreamingMessage, GetTask, CancelTask...")
    async def a2a_rpc(self, request: Request) -> Response:
        return await self.replica.a2a_call(request)

    @api.api_route(
        "/a2a/{operation:path}",
        methods=["GET", "POST", "DELETE"],
        summary="A2A HTTP+JSON binding (a2a-sdk): /a2a/message:send, /a2a/tasks/{id}...",
    )
    async def a2a_rest(self, request: Request) -> Response:
        return await self.replica.a2a_call(request, request.path_params["operation"])

    @api.get("/metrics", summary="Prometheus metrics of every node of the cluster (docs/operations.md)")
    async def prometheus(self, request: Request) -> Response:
        return await self.replica.metrics_page(request)

    @api.get("/healthz", summary="Public health: ok, degraded or unavailable, nothing more")
    @api.get("/health", summary="Public liveness probe (alias of /healthz)")
    async def healthz(self) -> Response:
        return await self.replica.healthz()

    @api.get("/admin/health", summary="Operator health: Ray, the strategy registry and the LLM endpoint in detail")
    async def admin_health(self) -> Response:
        return await self.replica.admin_health()


class AppArgs(BaseModel):
    """Arguments of `build_app` (what `serve run reasonray.serve_app:build_app key=value` passes)."""

    config_path: str | None = Field(None, description="config.toml to load; default: the repository's config.toml.")
    settings: dict[str, Any] | None = Field(None, description="Already-loaded settings (the CLI passes these).")
    app_name: str = Field("reasonray", pattern=r"^[a-z0-9-]+$", description="Names the application's actors.")


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Validate everything a replica needs before anything is deployed, then bind the ingress."""
    parsed = AppArgs.model_validate(args or {})
    settings = Settings.model_validate(parsed.settings) if parsed.settings else load_settings(parsed.config_path)
    # replicas run in other working directories: give them an absolute data directory
    settings = settings.model_copy(update={"data_dir": settings.data_dir.resolve()})
    # the address Serve's proxies bind: under `serve deploy` / `serve run` the running controller's `http_options.host`
    # (what is exposed), else (`reasonray serve`, before its cluster starts) `[server] host`
    require_auth_off_loopback((serve_http() or settings.server).host, settings)
    # raises ConfigError naming the key, the agents file or the unreachable store (whose schema it creates or migrates)
    RegistryService(settings.reasoning, settings.data_dir, store_url=settings.store.url)
    client_for(settings)  # raises LLMConfigError naming the variable to set
    check_memory(settings)  # raises MemoryUnavailableError naming the model or server to fix
    scaling = settings.server.autoscaling
    replicas: dict[str, Any] = (
        {"autoscaling_config": scaling.serve_config()} if scaling.enabled else {"num_replicas": settings.server.num_replicas}
    )
    actor_options: dict[str, Any] = {"num_cpus": settings.server.replica_num_cpus}
    if otel := tracing.export_env():  # OTEL_* of the deploying process: replicas, their tasks and actors export too
        actor_options["runtime_env"] = {"env_vars": otel}
    return ReasonRayIngress.options(  # type: ignore[attr-defined,no-any-return]  # a Deployment once decorated
        **replicas,
        max_ongoing_requests=settings.reasoning.performance.max_concurrent_requests,
        # a stopping replica answers what it holds before it exits (it waits only while requests are in flight)
        graceful_shutdown_timeout_s=settings.server.shutdown_timeout_s,
        # a bounded queue: beyond it Serve's proxy answers 503 with Retry-After instead of queueing forever
        max_queued_requests=settings.fanout.max_queued_requests,
        backpressure_config=BackpressureConfig(status_code=503, retry_after_s=max(1, math.ceil(settings.fanout.retry_after_s))),
        ray_actor_options=actor_options,
    ).bind(settings.model_dump(mode="json"), parsed.app_name)
