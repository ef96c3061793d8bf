"""The Ray Serve application: JSON-RPC 2.0 at POST /rpc, REST mirrors, GET /healthz, OpenAPI at /docs.

Transport only: validation, trace ids, error mapping and wiring. The reasoning lives in the pure
packages; `build_app` is the one typed builder that binds everything:

    serve run serve_app:build_app config_path=config.toml
"""


import asyncio
import time
from typing import Any

import ray
import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve
from ray.serve import Application

from actors.fanout import LLMSpec, RayFanout
from actors.llm_cache import RayCacheStore, cache_actor
from actors.memory import RayMemory
from actors.metrics import ray_metrics
from actors.registry import RayRegistry, registry_actor
from actors.session import RaySessions, session_pipeline
from gateway.simulator.server import free_port
from memory.service import check_memory
from gateway.tokens import counter_for_model
from reasonray import __version__
from reasonray.api import accept_trace_id, build_dispatcher
from reasonray.config import Settings, load_settings
from reasonray.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, MAX_ITERATIONS, NOT_FOUND, STRATEGY_UNAVAILABLE
from reasonray.llm import build_llm, client_for
from reasonray.logs import configure_logging
from reasonray.registry import RegistryService, agent_lookup
from reasonray.sandbox import SandboxLimits
from reasonray.service import ExecuteParams, ExecuteResult, ReasoningService
from strategies.registry import StrategyRegistry, build_catalogue

log = structlog.get_logger("reasonray.serve")

api = FastAPI(
    title="ReasonRay",
    version=__version__,
    description="LLM reasoning on Ray. JSON-RPC 2.0 at POST /rpc (methods: reasoning.execute, "
    "reasoning.bounded_context, reasoning.strategies, agent.register/get/list/discover/unregister, "
    "session.create/turn/resume/get/close/tools, memory.retrieve/store/get/genealogy/descendants/errors/traces/"
    "list_workspaces/delete_workspace, stats.get/reset, and the aliases solve_coding_task, retrieve_memories, "
    "get_memory_genealogy, get_statistics); "
    "REST mirrors under /v1. See docs/api.md.",
)

HTTP_STATUS = {INVALID_PARAMS: 422, STRATEGY_UNAVAILABLE: 400, MAX_ITERATIONS: 422, NOT_FOUND: 404, INTERNAL_ERROR: 503}  # REST mirrors
LLM_PROBE_TTL_S = 5.0
SESSION_GAUGE_S = 5.0


@serve.deployment
@serve.ingress(api)
class ReasonRayIngress:
    def __init__(self, settings: dict[str, Any], app_name: str) -> None:
        self.settings = Settings.model_validate(settings)
        configure_logging(self.settings.logging)
        data_dir = str(self.settings.data_dir)
        handle = registry_actor(app_name, self.settings.reasoning, self.settings.data_dir)
        snapshot = ray.get(handle.configure.remote(self.settings.reasoning.model_dump(mode="json"), data_dir))
        self.registry = RayRegistry(handle)
        reasoning = self.settings.reasoning.model_copy(
            update={"enabled_strategies": snapshot["enabled"], "default_strategy": snapshot["default"]}
        )
        catalogue = build_catalogue(StrategyRegistry().discover(), reasoning)
        self.client = client_for(self.settings)
        self.cache = cache_actor(app_name, self.settings.llm.cache)
        self.metrics = ray_metrics(self.settings.reasoning.performance.enable_metrics)
        llm, self.resilient = build_llm(self.settings, self.client, RayCacheStore(self.cache), self.metrics)
        spec = LLMSpec(self.settings.model_dump_json(), app_name)
        memory = RayMemory(app_name, self.settings) if self.settings.memory.enabled else None
        self.service = ReasoningService(
            catalogue,
            llm,
            counter_for_model(self.client.model),
            fanout=RayFanout(spec),
            agents=agent_lookup(self.registry),
            selection_budget_ms=self.settings.reasoning.performance.strategy_selection_timeout_ms,
            data_dir=self.settings.data_dir,
            log_queries=self.settings.logging.log_queries,
            memory=memory,
            memory_settings=self.settings.memory,
            budget=self.settings.budget,
            metrics=self.metrics,
        )
        sessions = RaySessions(app_name, spec, session_pipeline(self.settings, llm, app_name))
        s = self.settings.sessions
        self.rpc = build_dispatcher(
            self.service, self.registry, sessions, cache_stats=self.cache.stats.remote,
            sandbox=SandboxLimits(timeout_s=s.code_timeout_s, memory_mb=s.code_memory_mb, max_output_chars=s.code_max_output_chars),
            metrics=self.metrics,
        )
        self.sessions = sessions
        self._session_gauge: asyncio.Task | None = None
        self._llm_probe: tuple[float, dict[str, Any]] = (0.0, {})
        log.info("ingress.ready", strategies=snapshot["enabled"], default=snapshot["default"], model=self.client.model)

    @api.post("/rpc", summary="JSON-RPC 2.0 endpoint (single or batch)")
    async def rpc(self, request: Request) -> Response:
        if self._session_gauge is None:
            self._session_gauge = asyncio.create_task(self._count_sessions())
        body = await request.body()
        payload, trace_ids = await self.rpc.handle(body, accept_trace_id(request.headers.get("x-trace-id")))
        headers = {"X-Trace-Id": trace_ids[0]} if len(trace_ids) == 1 else {}
        if payload is None:
            return Response(status_code=204, headers=headers)
        return JSONResponse(payload, headers=headers)

    @api.post("/v1/reasoning/execute", response_model=ExecuteResult, summary="REST mirror of reasoning.execute")
    async def execute(self, params: ExecuteParams, request: Request) -> Response:
        return await self._rest("reasoning.execute", params.model_dump(exclude_none=True), request)

    @api.get("/v1/strategies", summary="REST mirror of reasoning.strategies")
    async def strategies(self, request: Request) -> Response:
        return await self._rest("reasoning.strategies", {}, request)

    async def _rest(self, method: str, params: dict[str, Any], request: Request) -> Response:
        call = {"jsonrpc": "2.0", "method": method, "params": params, "id": 0}
        payload, trace_ids = await self.rpc.handle_payload(call, accept_trace_id(request.headers.get("x-trace-id")))
        headers = {"X-Trace-Id": trace_ids[0]}
        if "error" in payload:
            error = payload["error"]
            return JSONResponse({"error": error}, status_code=HTTP_STATUS.get(error["code"], 500), headers=headers)
        return JSONResponse(payload["result"], headers=headers)

    @api.get("/healthz", summary="Health of Ray, the strategy registry and the LLM endpoint")
    async def healthz(self) -> Response:
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
        }
        return JSONResponse(body, status_code=503 if status == "unavailable" else 200)

    async def _count_sessions(self) -> None:
        """Publish how many sessions have a live actor, every SESSION_GAUGE_S seconds."""
        while True:
            try:
                live = await asyncio.to_thread(self.sessions.live_count)
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
            model=self.client.model,
            base_url=self.client.base_url,
            simulated=self.settings.resolved_provider() == "simulated",
        )
        self._llm_probe = (time.monotonic(), probe)
        return {**probe, "breaker": self.resilient.breaker.state}


def ray_environment(settings: Settings) -> dict[str, str]:
    """Environment a Ray cluster needs before it starts, for the configured ingress and fan-out.

    Fan-out branches are Ray tasks that ask for no CPU, so Ray would keep only as many idle worker
    processes as there are free CPUs and start new ones (about 1.2 s each) for every wide fan-out:
    `[server] warm_workers` raises that soft limit. The HAProxy ingress always opens a stats and a
    metrics listener; they get free ports here so that two clusters on one machine never collide.
    """
    env = {"RAY_num_workers_soft_limit": str(settings.server.warm_workers)}
    if not settings.server.fast_ingress:
        return env
    return {
        **env,
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
    }


class AppArgs(BaseModel):
    """Arguments of `build_app` (what `serve run serve_app:build_app key=value` passes)."""

    config_path: str | None = Field(None, description="config.toml to load; default: the repository's config.toml.")
    settings: dict[str, Any] | None = Field(None, description="Already-loaded settings (the CLI passes these).")
    app_name: str = Field("reasonray", pattern=r"^[a-z0-9-]+$", description="Names the application's actors.")


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Validate everything a replica needs before anything is deployed, then bind the ingress."""
    parsed = AppArgs.model_validate(args or {})
    settings = Settings.model_validate(parsed.settings) if parsed.settings else load_settings(parsed.config_path)
    # replicas run in other working directories: give them an absolute data directory
    settings = settings.model_copy(update={"data_dir": settings.data_dir.resolve()})
    RegistryService(settings.reasoning, settings.data_dir)  # raises ConfigError naming the key or the agents file
    client_for(settings)  # raises LLMConfigError naming the variable to set
    check_memory(settings)  # raises MemoryUnavailableError naming the model or server to fix
    scaling = settings.server.autoscaling
    replicas: dict[str, Any] = (
        {"autoscaling_config": scaling.serve_config()} if scaling.enabled else {"num_replicas": settings.server.num_replicas}
    )
    return ReasonRayIngress.options(
        **replicas,
        max_ongoing_requests=settings.reasoning.performance.max_concurrent_requests,
        ray_actor_options={"num_cpus": settings.server.replica_num_cpus},
    ).bind(settings.model_dump(mode="json"), parsed.app_name)
