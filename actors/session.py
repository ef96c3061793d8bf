"""One actor per live session: created on first use, named by the session id, evicted when idle.

The actor holds no state the repository does not: every request loads the session from
`<data_dir>/sessions/` and saves its outcome atomically, so after an eviction, a crash (the actor
restarts) or a service restart, the next request rehydrates it and continues exactly where it was,
a pending client hand-off included. Calls into one session are serialised by a lock, so two
requests never interleave their turns; different sessions never share an actor, hence never state.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import ray
import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError

from actors import NAMESPACE, unwrap
from actors.fanout import LLMSpec
from actors.memory import RayMemory
from reasonray.config import Settings
from reasonray.memory_loop import MemoryLoop
from reasonray.sandbox import SandboxLimits
from reasoner.builtin_tools import builtin_toolbox
from reasoner.session import FileSessionRepository, SessionPipeline, SessionSpec, created, submitted

log = structlog.get_logger(__name__)


def session_pipeline(settings: Settings, llm: Any, app_name: str) -> SessionPipeline:
    """The pipeline every session actor (and the in-process API) uses, from `[sessions]` settings."""
    s = settings.sessions
    memory = RayMemory(app_name, settings) if settings.memory.enabled else None
    toolbox = builtin_toolbox(SandboxLimits(s.code_timeout_s, s.code_memory_mb, s.code_max_output_chars),
                              memory, settings.memory.default_workspace)
    repository = FileSessionRepository(Path(settings.data_dir) / "sessions")
    passive = MemoryLoop(memory, settings.memory) if memory is not None and settings.memory.passive_learning else None
    return SessionPipeline(repository, llm, toolbox, data_dir=Path(settings.data_dir), default_max_llm_calls=s.max_llm_calls,
                           passive=passive)


@ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=16)
class SessionActor:
    def __init__(self, session_id: str, spec: LLMSpec) -> None:
        self.session_id = session_id
        settings = Settings.model_validate_json(spec.settings_json)
        self.pipeline = session_pipeline(settings, spec.build(), spec.app_name)
        self.idle_timeout_s = settings.sessions.idle_timeout_s
        self.lock = asyncio.Lock()
        self.last_used = time.monotonic()
        self.watchdog: asyncio.Task[None] | None = None

    async def turn(self, message: str, trace_id: str) -> dict[str, Any]:
        async with self._using():
            return (await self.pipeline.turn(self.session_id, message, trace_id)).model_dump(mode="json")

    async def resume(self, results: list[dict[str, Any]], trace_id: str) -> dict[str, Any]:
        async with self._using():
            return (await self.pipeline.resume(self.session_id, submitted(results), trace_id)).model_dump(mode="json")

    def _using(self) -> _Use:
        if self.watchdog is None:
            self.watchdog = asyncio.create_task(self._evict_when_idle())
        return _Use(self)

    async def _evict_when_idle(self) -> None:
        while True:
            await asyncio.sleep(max(self.idle_timeout_s / 4, 0.05))
            if not self.lock.locked() and time.monotonic() - self.last_used > self.idle_timeout_s:
                log.info("session.evicted", session_id=self.session_id, idle_s=self.idle_timeout_s)
                _exit()  # the state is in the repository; the next request starts a new actor


def _exit() -> None:
    """End this actor for good (no restart); its name is free for the next request's actor."""
    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


class _Use:
    """Serialises the session's turns and marks it used."""

    def __init__(self, actor: SessionActor) -> None:
        self.actor = actor

    async def __aenter__(self) -> None:
        await self.actor.lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.actor.last_used = time.monotonic()
        self.actor.lock.release()


class RaySessions:
    """`reasoner.session.Sessions` through one actor per session. Creating and reading a session need
    no actor (they touch the repository only); turns and re-entries run in the session's actor, found
    by name or started, and a session whose actor just went away (evicted, killed) gets a new one that
    rehydrates from the repository. A turn that was running when its actor died is run again from the
    session's last saved state."""

    def __init__(self, app_name: str, spec: LLMSpec, pipeline: SessionPipeline) -> None:
        self.app_name = app_name
        self.spec = spec
        self.pipeline = pipeline  # repository access only: its LLM is never called here

    async def create(self, spec: SessionSpec) -> dict[str, Any]:
        return created(self.pipeline.create(spec))

    async def turn(self, session_id: str, message: str, trace_id: str) -> dict[str, Any]:
        self.pipeline.require(session_id)  # an unknown session fails here, without starting an actor
        return await self.call(session_id, "turn", message, trace_id)

    async def resume(self, session_id: str, results: list[dict[str, Any]], trace_id: str) -> dict[str, Any]:
        self.pipeline.require(session_id)
        return await self.call(session_id, "resume", results, trace_id)

    async def get(self, session_id: str) -> dict[str, Any]:
        return self.pipeline.get(session_id)

    async def close(self, session_id: str) -> dict[str, Any]:
        closed = self.pipeline.close(session_id)
        try:
            ray.kill(ray.get_actor(self.actor_name(session_id), namespace=NAMESPACE), no_restart=True)
        except ValueError:
            pass  # no live actor: nothing to stop
        return closed

    def tools(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.pipeline.toolbox.tools.values()]

    def live_count(self) -> int:
        """Sessions of this application with a live actor (a call to Ray's GCS: blocking)."""
        prefix = self.actor_name("")
        return sum(1 for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["namespace"] == NAMESPACE and a["name"].startswith(prefix))

    def actor_name(self, session_id: str) -> str:
        return f"{self.app_name}-session-{session_id}"

    def _handle(self, session_id: str) -> Any:
        return SessionActor.options(
            name=self.actor_name(session_id), namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
        ).remote(session_id, self.spec)

    async def call(self, session_id: str, method: str, *args: Any) -> Any:
        for attempt in (1, 2):
            try:
                return await unwrap(getattr(self._handle(session_id), method).remote(*args))
            except (ActorDiedError, ActorUnavailableError):
                if attempt == 2:
                    raise
                log.info("session.actor_replaced", session_id=session_id, method=method)
                await asyncio.sleep(0.2)  # let Ray release the dead actor's name
        raise AssertionError("unreachable")
