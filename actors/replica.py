"""One replica of the Serve ingress: its Ray parts started (`start_replica`: the application's named actors, the fan-out
pool, the cluster's response cache and, with `[auth]`, the tenancy actors behind the one guard), the application from
the one builder (`reasonray.api.app.build_application`), and what each of serve_app.py's routes answers (`Replica`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import ray
import structlog
from ray import serve
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reasonray import __version__
from reasonray.actors.a2a_board import task_board
from reasonray.actors.endpoint import share_endpoints, warm, warm_now
from reasonray.actors.fanout import BranchPool, LLMSpec, RayFanout
from reasonray.actors.lifecycle import private_files
from reasonray.actors.memory import RayMemory
from reasonray.actors.metrics import node_metric_pages, ray_metrics
from reasonray.actors.registry import RayRegistry, registry_actor
from reasonray.actors.session import RaySessions, session_hosts, session_pipeline
from reasonray.actors.tenancy import tenancy_clients
from reasonray.api.access.auth import CURRENT_PRINCIPAL, TokenVerifier
from reasonray.api.access.tenancy import build_guard, install_guard
from reasonray.api.app import Application, Backends, build_application
from reasonray.api.errors import error_headers, rest_error
from reasonray.api.jsonrpc import RpcError, error_for
from reasonray.api.methods import new_trace_id
from reasonray.api.surfaces import prometheus
from reasonray.api.surfaces.a2a import A2AServer
from reasonray.api.surfaces.gate import GateConfig
from reasonray.api.surfaces.mcp_server import McpEndpoint
from reasonray.api.surfaces.openai_compat import OpenAICompat, OpenAIError, Reply, respond
from reasonray.api.surfaces.streaming import rpc_sse, streaming_call
from reasonray.api.surfaces.tracing import in_request_trace, request_span
from reasonray.gateway.factory import shared_cache
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel import tracing
from reasonray.kernel.config import Settings
from reasonray.kernel.errors import ForbiddenError, RateLimitedError
from reasonray.kernel.logs import configure_logging
from reasonray.stores.a2a import open_a2a
from reasonray.stores.audit import audit_refusal
from reasonray.strategies.registry import StrategyRegistry, build_catalogue

log = structlog.get_logger("reasonray.serve")

LLM_PROBE_TTL_S = 5.0
SESSION_GAUGE_S = 5.0


def rate_limit_headers(error: dict[str, Any]) -> dict[str, str]:
    """Retry-After and X-RateLimit-* for a -32012 error; nothing for other errors (/rpc answers those with 200)."""
    return error_headers(error) if error.get("code") == RateLimitedError.code else {}


def openai_response(status: int, body: dict[str, Any], headers: dict[str, str]) -> JSONResponse:
    """An OpenAI-shaped answer; a rate-limited one carries Retry-After and X-RateLimit-* as /rpc's does."""
    rpc_error = body.get("error", {}).get("reasonray") or {}
    return JSONResponse(body, status_code=status, headers={**headers, **error_headers(rpc_error)})


def rest_response(error: RpcError, trace_id: str) -> JSONResponse:
    """A REST route's error: the status, body and headers of the one error table, and the trace id."""
    status, body, headers = rest_error(error.body())
    return JSONResponse(body, status_code=status, headers={"X-Trace-Id": trace_id, **headers})


@dataclass
class Replica:
    """What the routes of one ingress replica answer with: the application and its surfaces."""

    app: Application
    openai: OpenAICompat  # docs/openai.md
    a2a: A2AServer  # docs/interop.md
    pool: BranchPool
    gate: GateConfig | None  # the bearer token and request limit of every route; None: authentication off
    served_by: str = field(default_factory=lambda: serve.get_replica_context().replica_id.unique_id)
    card_modified: float = field(default_factory=time.time)  # the agent card's Last-Modified: new with each deployment
    _session_gauge: asyncio.Task[None] | None = field(default=None, init=False)
    _llm_probe: tuple[float, dict[str, Any]] = field(default=(0.0, {}), init=False)
    _warming: asyncio.Task[dict[str, Any]] | None = field(default=None, init=False)  # held, so the task is not collected

    async def rpc(self, request: Request) -> Response:
        if self._session_gauge is None:
            self._session_gauge = asyncio.create_task(self._count_sessions())
        rpc, body = self.app.dispatcher, await request.body()
        with request_span("/rpc", request.headers) as trace_id:  # the caller's traceparent names the run here too
            if (call := streaming_call(rpc, body)) is not None:  # reasoning.execute with "stream": true, as SSE
                trace_id = trace_id or new_trace_id()
                return EventSourceResponse(in_request_trace("/rpc stream", rpc_sse(rpc, call, trace_id)), headers={"X-Trace-Id": trace_id})
            payload, trace_ids = await rpc.handle(body, trace_id)
        headers = {"X-Trace-Id": trace_ids[0]} if len(trace_ids) == 1 else {}
        if payload is None:
            return Response(status_code=204, headers=headers)
        # JSON-RPC over HTTP answers its errors with 200, but for a rate limit (429 and when to come back)
        limited = rate_limit_headers(payload.get("error") or {}) if isinstance(payload, dict) else {}
        return JSONResponse(payload, headers={**headers, **limited}, status_code=RateLimitedError.http_status if limited else 200)

    async def rest(self, method: str, params: dict[str, Any], request: Request) -> Response:
        """A REST mirror of the JSON-RPC method `method`."""
        with request_span(request.url.path, request.headers) as span_trace_id:
            trace_id = span_trace_id or new_trace_id()
            try:
                result = await self.app.dispatcher.call(method, params, trace_id)
            except RpcError as error:
                return rest_response(error, trace_id)
        return JSONResponse(result, headers={"X-Trace-Id": trace_id})

    async def chat_completions(self, request: Request) -> Response:
        # the caller's traceparent decides the trace id, else a well-formed X-Trace-Id, else a new one
        with request_span("/v1/chat/completions", request.headers) as traced:
            trace_id = traced or new_trace_id()
            reply = await respond(self.openai, await request.body(), trace_id)
            if isinstance(reply, Reply):
                return openai_response(reply.status, reply.body, {"X-Trace-Id": trace_id})
            chunks = in_request_trace("/v1/chat/completions stream", reply)
        return EventSourceResponse(chunks, headers={"X-Trace-Id": trace_id})

    async def models(self, model_id: str | None = None) -> Response:
        """The model list, or one model; forbidden, rate limited...: OpenAI's error shape, not a 500."""
        try:
            return JSONResponse(await (self.openai.models() if model_id is None else self.openai.model(model_id)))
        except OpenAIError as exc:
            return openai_response(exc.status, exc.body, {})

    async def agent_card(self, request: Request) -> Response:
        return self.a2a.card_response(request, self.card_modified)

    async def a2a_call(self, request: Request, operation: str | None = None) -> Response:
        """An A2A call: the JSON-RPC binding, or with `operation` the HTTP+JSON one."""
        route = "/a2a" if operation is None else "/a2a/" + operation.split("/", 1)[0]
        with request_span(route, request.headers):
            response = await (self.a2a.handle(request) if operation is None else self.a2a.handle_rest(request))
        response.headers["X-Served-By"] = self.served_by  # which replica answered (a task may run on another)
        return response

    async def metrics_page(self, request: Request) -> Response:
        return prometheus.page(await node_metric_pages(), request.headers.get("accept"))

    async def healthz(self) -> Response:
        body, status_code = await self.health()
        return JSONResponse({"status": "ok" if body["status"] == "ok" else "degraded"}, status_code=status_code)

    async def admin_health(self) -> Response:
        """The operators' health report; with authentication, for the operator and admin roles only."""
        principal = CURRENT_PRINCIPAL.get()  # the gate checked the token
        if self.gate is not None and (principal is None or not {"operator", "admin"} & set(principal.roles)):
            error = error_for(ForbiddenError("forbidden: /admin/health is for the operator and admin roles"))
            trace_id = new_trace_id()
            await audit_refusal(
                self.gate.audit,
                method="GET /admin/health",
                outcome="forbidden",
                reason=error.message,
                trace_id=trace_id,
                principal=principal.sub if principal is not None else None,
            )
            error.data["trace_id"] = trace_id
            return rest_response(error, trace_id)
        body, status_code = await self.health()
        return JSONResponse(body, status_code=status_code)

    async def health(self) -> tuple[dict[str, Any], int]:
        """Ray, the strategy registry and the model endpoint in detail; 503 when the registry cannot answer."""
        try:
            registry = {"ok": True, **await self.app.registry.snapshot()}
        except Exception as exc:  # the actor is restarting or gone
            registry = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        llm = await self._llm_health()
        status = "ok" if registry["ok"] and llm["reachable"] and llm["breaker"] == "closed" else "degraded"
        status = status if registry["ok"] else "unavailable"
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
        sessions = self.app.sessions
        assert isinstance(sessions, RaySessions)
        while True:
            try:
                live = await sessions.live_count()
                self.app.metrics.record("reasonray_active_sessions", live)
            except Exception as exc:  # the GCS is briefly unreachable: try again next round
                log.warning("sessions.count_failed", error=f"{type(exc).__name__}: {exc}"[:200])
            await asyncio.sleep(SESSION_GAUGE_S)

    async def _llm_health(self) -> dict[str, Any]:
        client, resilient = self.app.client, self.app.resilient
        assert client is not None and resilient is not None
        checked_at, probe = self._llm_probe
        if time.monotonic() - checked_at >= LLM_PROBE_TTL_S:  # else the last probe's answer, with the breaker's state now
            started = time.perf_counter()
            try:
                await client.ping()
                probe = {"reachable": True, "latency_ms": round((time.perf_counter() - started) * 1000, 2)}
            except Exception as exc:
                probe = {"reachable": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
            probe.update(
                provider=self.app.settings.resolved_provider(),
                provider_reason=self.app.settings.provider_reason(),
                model=client.model,
                base_url=client.base_url,
                simulated=self.app.settings.resolved_provider() == "simulated",
            )
            self._llm_probe = (time.monotonic(), probe)
        return {**probe, "breaker": resilient.breaker.state}


def start_replica(settings: Settings, app_name: str) -> Replica:
    """Everything one ingress replica serves, its Ray parts started and answering (the constructor is its readiness)."""
    private_files()  # event logs, sessions, memory: readable by the service's user only
    configure_logging(settings.logging)
    tracing.set_content(settings.events.record == "full")  # prompt text in spans only with [events] record = "full"
    spec = LLMSpec(settings.model_dump_json(), app_name)
    share_endpoints(app_name)  # a small endpoint's slots and the refusals learnt are the cluster's, not this replica's
    pool = BranchPool(app_name, spec, settings.fanout)
    memory = RayMemory(app_name, settings)
    # the application's named actors follow these settings: kept when built from them, replaced when not.
    # Each start is a process importing the package (seconds on a small node): they start side by side
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="deploy") as starting:
        registry_started = starting.submit(registry_actor(app_name, settings.reasoning, settings.data_dir, settings.store.url).deploy)
        prestart = settings.server.prestart  # off: these three start at their first use
        board_started = starting.submit(task_board, app_name, prestart)  # running A2A tasks, shared by the replicas
        hosts_started = starting.submit(session_hosts, app_name, settings, spec)
        pool_started = starting.submit(pool.start if prestart else list)  # the first request finds the runners warm
        tenancy_started = (
            starting.submit(tenancy_clients, app_name, settings.store.url, settings.data_dir) if settings.auth.enabled else None
        )
        starting.submit(memory.bank.deploy, False).result()  # a memory bank built from other settings goes
        handle, board, hosts = registry_started.result().handle, board_started.result(), hosts_started.result()
        pool_started.result()
        tenancy = tenancy_started.result() if tenancy_started is not None else None
    cache = shared_cache(settings, app_name)
    snapshot = ray.get(handle.snapshot.remote())
    reasoning = settings.reasoning.model_copy(update={"enabled_strategies": snapshot["enabled"], "default_strategy": snapshot["default"]})
    backends = Backends(
        registry=RayRegistry(handle),
        catalogue=build_catalogue(StrategyRegistry().discover(), reasoning),
        cache=cache,
        memory=memory if settings.memory.enabled else None,
        fanout=RayFanout(pool),
        sessions=lambda llm: RaySessions(hosts, session_pipeline(settings, llm, app_name)),
        metrics=ray_metrics(settings.reasoning.performance.enable_metrics),
        cache_stats=cache.stats if cache is not None else None,
        # with [auth], a caller's (and a destination's) remote-agent calls are counted for the cluster
        egress_slots=tenancy[1] if tenancy is not None else None,
    )
    app = build_application(settings, backends=backends)
    assert app.client is not None and app.resilient is not None and app.sessions is not None
    McpEndpoint.serve(app.dispatcher)  # /mcp (docs/mcp.md)
    # A2A tasks run as reasoning.execute calls of this dispatcher (its guard, once installed below, included)
    # and are kept in the sessions' store
    a2a = A2AServer(
        app.dispatcher,
        app.service.catalogue,
        open_a2a(settings.store.url, settings.data_dir / "sessions"),
        __version__,
        bearer=settings.auth.enabled,
        board=board,  # running tasks, shared by the replicas: cancel and resubscribe from any
        refusal_headers=rate_limit_headers,  # a refused A2A call is answered like /rpc's: 401/403/429
        executor=settings.a2a.executor,  # an agent executor plugged in around ReasonRay's (unset: messages reason)
    )
    openai = OpenAICompat(app.dispatcher, counter_for_model(app.client.model), app.client.model)
    # authentication on: every method behind the one guard, and the gate's tokens and limits (one audit writer for both)
    gate: GateConfig | None = None
    if tenancy is not None:
        guard = build_guard(settings, app.registry, app.service, *tenancy)
        install_guard(app.dispatcher, guard)
        gate = GateConfig(TokenVerifier(settings.auth), guard.policy, guard.admit_request, guard.audit)
    replica = Replica(app, openai, a2a, pool, gate)
    # before the replica takes requests: the endpoint discovered and its tokenizer loaded here (blocking, the
    # constructor is the replica's readiness), the connection opened on the replica's loop right after
    warm_now(app.client)
    with contextlib.suppress(RuntimeError):  # no loop here (a test building the class directly): the first call opens it
        replica._warming = asyncio.get_running_loop().create_task(warm(app.client))
    log.info("ingress.ready", strategies=snapshot["enabled"], default=snapshot["default"], model=app.client.model)
    return replica
