"""The one builder: a running ReasonRay application from `Settings`.

Every entry point assembles the same parts in the same order here: the model client and its LLM
stack (retries, breaker, cache, metrics), the strategy catalogue and agent directory, the memory
bank, the reasoning service, sessions and the JSON-RPC method table. What differs between one
process and a Ray cluster is only where shared state lives and how branches fan out; those come in
as `Backends` (the Ray side passes its actors' typed clients, everything else gets in-process parts).

    app = build_application(load_settings())                 # one process: CLI, evals, notebooks, tests
    app = build_application(settings, backends=ray_parts)    # serve_app: the same, with Ray's parts
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasonray.api.access.egress import Egress, SharedSlots
from reasonray.api.access.limits import LocalLimits, RateLimiter, TokenBudgets
from reasonray.api.access.tenancy import Guard, LocalOwners, build_guard, install_guard
from reasonray.api.context import Context
from reasonray.api.jsonrpc import Dispatcher
from reasonray.api.methods import build_dispatcher
from reasonray.api.registry_service import LocalRegistry, Registry, RegistryService
from reasonray.api.service import ReasoningService
from reasonray.gateway.cache import CacheStore, LRUTTLCache
from reasonray.gateway.factory import build_llm, client_for
from reasonray.gateway.openai_client import OpenAILLM
from reasonray.gateway.protocol import LLM
from reasonray.gateway.resilience import ResilientLLM
from reasonray.gateway.tokens import counter_of
from reasonray.kernel.config import MemorySettings, ReasoningSettings, Settings
from reasonray.kernel.sandbox import SandboxLimits
from reasonray.kernel.telemetry import Metrics, NoMetrics
from reasonray.memory.loop import MemoryLoop
from reasonray.memory.service import BankService, LocalMemory, MemoryClient, check_memory, open_bank
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import LocalSessions, SessionPipeline, Sessions, SessionState
from reasonray.stores.counters import open_counters
from reasonray.stores.ownership import open_ownership
from reasonray.stores.runs import open_runs
from reasonray.stores.sessions import open_sessions
from reasonray.strategies.base import Fanout, local_fanout
from reasonray.strategies.registry import Catalogue, StrategyRegistry, build_catalogue

UNSET: Any = object()


@dataclass
class Backends:
    """Where shared state lives and how branches run. Unset parts are built in this process."""

    registry: Registry | None = None
    catalogue: Catalogue | None = None
    cache: CacheStore | None = UNSET  # None: no response cache
    memory: MemoryClient | None = UNSET  # None: no memory bank
    fanout: Fanout | None = None  # None: asyncio.gather in this process
    sessions: Callable[[LLM], Sessions] | None = None  # built from the application's LLM stack
    metrics: Metrics = field(default_factory=NoMetrics)
    cache_stats: Callable[[], Any] | None = None
    egress_slots: SharedSlots | None = None  # None: outbound calls counted in this process only


@dataclass
class Application:
    """Everything a surface (HTTP, CLI, evaluation, notebook) needs to serve the API."""

    settings: Settings
    llm: LLM
    service: ReasoningService
    registry: Registry
    dispatcher: Dispatcher
    metrics: Metrics
    sessions: Sessions | None = None
    client: OpenAILLM | None = None  # the raw endpoint client (None when the caller passed its own LLM)
    resilient: ResilientLLM | None = None  # retries and breaker, for health reports

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()


def build_application(
    settings: Settings,
    *,
    llm: LLM | None = None,
    backends: Backends | None = None,
    data_dir: Path | None = UNSET,
    memory: bool | None = None,
    **service_options: Any,
) -> Application:
    """Assemble the application. `llm` replaces the configured endpoint (scripted or simulated models
    in tests); `data_dir=None` keeps nothing on disk; `memory` overrides `[memory] enabled`."""
    parts = backends or Backends()
    directory = settings.data_dir if data_dir is UNSET else data_dir
    registry: Registry
    if parts.registry is None:
        local = RegistryService(settings.reasoning, directory, store_url=settings.store.url)
        registry, catalogue = LocalRegistry(local), parts.catalogue or local.catalogue
    else:
        registry = parts.registry
        catalogue = parts.catalogue or build_catalogue(StrategyRegistry().discover(), settings.reasoning)

    client: OpenAILLM | None = None
    resilient: ResilientLLM | None = None
    if llm is None:
        client = client_for(settings)
        c = settings.llm.cache
        cache = parts.cache if parts.cache is not UNSET else (LRUTTLCache(c.max_entries, c.ttl_s) if c.enabled else None)
        llm, resilient = build_llm(settings, client, cache, parts.metrics)

    use_memory = settings.memory.enabled if memory is None else memory
    bank = parts.memory if parts.memory is not UNSET else (LocalMemory(BankService(open_bank(settings))) if use_memory else None)

    service = ReasoningService(
        catalogue,
        llm,
        counter_of(llm),
        fanout=parts.fanout or local_fanout,
        agents=registry.get_agent,
        data_dir=directory,
        memory=bank,
        memory_settings=settings.memory,
        budget=settings.budget,
        metrics=parts.metrics,
        runs=open_runs(settings.store.url, directory) if directory is not None else None,
        **{
            "selection_budget_ms": settings.reasoning.performance.strategy_selection_timeout_ms,
            "log_queries": settings.logging.log_queries,
            "degraded_answers": settings.reasoning.degraded_answers,
            "events": settings.events,
            "limits": settings.limits,
            **service_options,
        },
    )
    sessions = parts.sessions(llm) if parts.sessions is not None else None
    s = settings.sessions
    sandbox = SandboxLimits(timeout_s=s.code_timeout_s, memory_mb=s.code_memory_mb, max_output_chars=s.code_max_output_chars)
    egress = Egress(settings.egress, shared=parts.egress_slots)
    dispatcher = build_dispatcher(Context(service, registry, sessions, settings.limits, egress, sandbox, parts.cache_stats), parts.metrics)
    return Application(settings, llm, service, registry, dispatcher, parts.metrics, sessions, client, resilient)


def session_pipeline(settings: Settings, llm: LLM, memory: MemoryClient | None) -> SessionPipeline:
    """The pipeline every session runs through, from `[sessions]`: a Ray session host's (with the cluster's memory
    bank) and a process's own (`in_process_application`) alike."""
    s, data_dir = settings.sessions, Path(settings.data_dir)
    toolbox = builtin_toolbox(
        SandboxLimits(s.code_timeout_s, s.code_memory_mb, s.code_max_output_chars),
        memory,
        settings.memory.default_workspace,
        settings.limits.max_calculator_digits,
    )
    passive = MemoryLoop(memory, settings.memory) if memory is not None and settings.memory.passive_learning else None
    return SessionPipeline(
        open_sessions(SessionState, settings.store.url, data_dir, settings.limits.session_retention_days),
        llm,
        toolbox,
        data_dir=data_dir,
        default_max_llm_calls=s.max_llm_calls,
        passive=passive,
        runs=open_runs(settings.store.url, data_dir),
        record=settings.events.record,
        max_history=settings.limits.max_session_history,
    )


def in_process_application(settings: Settings) -> Application:
    """The whole API in this process, without Ray (what `reasonray mcp` serves over stdio). Fails at once,
    naming the fix, when the model endpoint's key is missing (LLMConfigError) or the memory bank cannot
    work (MemoryUnavailableError). With `[auth]` configured every method is behind the same guard as the
    Serve application's (roles, ownership, limits, budgets, audit), over the data directory's (or the
    store's) ownership records, token budgets and audit log."""
    client_for(settings)  # a missing key fails here, before anything else starts
    check_memory(settings)
    memory = LocalMemory(BankService(open_bank(settings))) if settings.memory.enabled else None
    backends = Backends(cache=None, memory=memory, sessions=lambda llm: LocalSessions(session_pipeline(settings, llm, memory)))
    application = build_application(settings, backends=backends, data_dir=Path(settings.data_dir))
    if settings.auth.enabled:
        install_guard(application.dispatcher, local_guard(settings, application))
    return application


def local_guard(settings: Settings, application: Application) -> Guard:
    """The tenancy guard of an application served by this one process: ownership, budgets and audit in
    the configured store (PostgreSQL with `[store] url`, else files under the data directory)."""
    store, data_dir = settings.store.url, Path(settings.data_dir)
    owners = LocalOwners(open_ownership(store, data_dir))
    limits = LocalLimits(RateLimiter(budgets=TokenBudgets(open_counters(store, data_dir))))
    return build_guard(settings, application.registry, application.service, owners, limits)


def local_dispatcher(
    reasoning: ReasoningSettings,
    llm: LLM,
    *,
    data_dir: Path | None = None,
    sessions: Sessions | None = None,
    memory: MemoryClient | None = None,
    memory_settings: MemorySettings | None = None,
    metrics: Metrics | None = None,
    **service_options: Any,
) -> Dispatcher:
    """The whole API in this process over a given model, without Ray: for unit tests, notebooks and scripts."""
    settings = Settings(reasoning=reasoning, memory=memory_settings) if memory_settings else Settings(reasoning=reasoning)
    backends = Backends(
        cache=None,
        memory=memory,
        sessions=(lambda _llm: sessions) if sessions is not None else None,
        metrics=metrics or NoMetrics(),
    )
    return build_application(settings, llm=llm, backends=backends, data_dir=data_dir, **service_options).dispatcher
