"""Session hosts: a fixed set of named async actors, each serving many sessions from one event loop.

A session is a logical actor: its calls (turns, re-entries, close) go to the host its id hashes to
(rendezvous hashing over `[sessions] hosts`), where a per-session lock orders and serialises them
(`reasoner.hosting.LiveSessions`). The host keeps no state the repository does not: every call
loads the session and saves its outcome atomically, so a host that dies (it restarts, or the call
falls to another host) and a session dropped for idleness lose nothing.

Each turn and re-entry carries a request id, saved with its outcome; the retry of a call whose host
died after saving gets the saved outcome back instead of running the turn's LLM and tool calls
again. Hosts are created at deploy time (`session_hosts`) and replaced when the application is
deployed with other settings (`actors.lifecycle`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from typing import Any

import ray
import structlog
from ray.exceptions import ActorDiedError, ActorUnavailableError

from reasonray.actors.endpoint import warm
from reasonray.actors.fanout import LLMSpec
from reasonray.actors.lifecycle import Fingerprinted, NamedActor, fingerprint, lookup, private_files, retire_extra
from reasonray.actors.memory import RayMemory
from reasonray.api.app import session_pipeline as build_session_pipeline
from reasonray.gateway.cache import cache_scope, scope_cache
from reasonray.kernel.config import Settings
from reasonray.kernel.errors import OverloadedError
from reasonray.reasoner.hosting import LiveSessions
from reasonray.reasoner.session import SessionPipeline, Sessions, submitted

log = structlog.get_logger(__name__)

RETRIES = 6  # a killed host restarts in about a second; this rides that out
RETRY_AFTER_S = 1.0


def session_pipeline(settings: Settings, llm: Any, app_name: str) -> SessionPipeline:
    """The session pipeline of this application's hosts: the one every process builds, over the cluster's memory bank."""
    return build_session_pipeline(settings, llm, RayMemory(app_name, settings) if settings.memory.enabled else None)


# max_task_retries=0: a call in flight when the host dies fails to the caller (`RaySessions`), which
# retries it with the same request id, so a saved turn is answered from the repository, not run again.
@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class SessionHost(Fingerprinted):
    def __init__(self, fp: str, spec: LLMSpec) -> None:
        private_files()
        self._fingerprint = fp
        settings = Settings.model_validate_json(spec.settings_json)
        self.pipeline = session_pipeline(settings, spec.build(), spec.app_name)
        self.live = LiveSessions(settings.sessions.max_live_per_host, settings.sessions.idle_timeout_s, RETRY_AFTER_S)
        self._sweeper: asyncio.Task[None] | None = None

    async def warm(self) -> dict[str, Any]:
        """Discover the endpoint and open a connection on this host's loop before its first turn."""
        return await warm(self.pipeline.llm)

    async def turn(self, session_id: str, message: str, trace_id: str, request_id: str, cache_scope: str | None = None) -> dict[str, Any]:
        async with self._using(session_id, cache_scope):
            return (await self.pipeline.turn(session_id, message, trace_id, request_id)).model_dump(mode="json")

    async def resume(
        self, session_id: str, results: list[dict[str, Any]], trace_id: str, request_id: str, cache_scope: str | None = None
    ) -> dict[str, Any]:
        async with self._using(session_id, cache_scope):
            return (await self.pipeline.resume(session_id, submitted(results), trace_id, request_id)).model_dump(mode="json")

    async def close(self, session_id: str) -> dict[str, Any]:
        async with self._using(session_id):  # after the turns already queued for the session
            closed = await self.pipeline.close(session_id)
        self.live.drop(session_id)
        return closed

    async def stats(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "live": len(self.live), "busy": self.live.busy}

    async def is_live(self, session_id: str) -> bool:
        """Whether the session is in this host's memory now (operators and tests)."""
        return session_id in self.live

    def _using(self, session_id: str, cache_scope: str | None = None) -> Any:
        scope_cache(cache_scope)  # the caller's cache entries only, as in the replica (each call runs in its own task)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep())
        return self.live.use(session_id)

    async def _sweep(self) -> None:
        """Drop idle sessions from memory; their state stays in the repository."""
        while True:
            await asyncio.sleep(max(self.live.idle_timeout_s / 4, 0.05))
            if dropped := self.live.drop_idle():
                log.info("session.idle_dropped", sessions=dropped, live=len(self.live))


# spread over the nodes: a host's death then interrupts one node's share of the sessions, and the others
# keep serving (Ray would otherwise pack these zero-CPU actors onto the node that creates them)
HOST_OPTIONS: dict[str, Any] = {"scheduling_strategy": "SPREAD"}


def host_name(app_name: str, index: int) -> str:
    return f"{app_name}-session-host-{index}"


def session_hosts(app_name: str, settings: Settings, spec: LLMSpec) -> list[NamedActor]:
    """The application's session hosts, created now (deploy time) or kept when they run with these settings; with
    `[server] prestart` off, each is created at its first use (hosts with other settings are retired now)."""
    fp = fingerprint(spec.settings_json)
    names = [host_name(app_name, i) for i in range(settings.sessions.hosts)]
    hosts = [NamedActor(SessionHost, name, fp, (spec,), HOST_OPTIONS).deploy(settings.server.prestart) for name in names]
    if settings.server.prestart:
        ray.get([h.handle.warm.remote() for h in hosts], timeout=120)  # the first turn finds the endpoint known
    if retired := retire_extra(host_name(app_name, 0)[:-1], set(names)):
        log.info("session.hosts_retired", hosts=retired)
    return hosts


def host_index(session_id: str, hosts: int) -> int:
    """Rendezvous (highest random weight) hashing: every replica picks the same host for a session, and
    changing the number of hosts moves only the sessions of the hosts added or removed."""
    return max(range(hosts), key=lambda i: hashlib.blake2b(f"{i}:{session_id}".encode(), digest_size=8).digest())


class RaySessions(Sessions):
    """`reasoner.session.Sessions` over the session hosts. Creating and reading a session touch the
    repository only; turns, re-entries and close run on the session's host, under its lock."""

    def __init__(self, hosts: list[NamedActor], pipeline: SessionPipeline) -> None:
        super().__init__(pipeline)  # repository access only: its LLM is never called here
        self.hosts = hosts

    async def turn(self, session_id: str, message: str, trace_id: str) -> dict[str, Any]:
        # a request id the same for every retry of this call; the caller's cache scope (set where the request was
        # authenticated), which the host's LLM calls use
        return await self._on_host("turn", session_id, message, trace_id, uuid.uuid4().hex, cache_scope())

    async def resume(self, session_id: str, results: list[dict[str, Any]], trace_id: str) -> dict[str, Any]:
        return await self._on_host("resume", session_id, results, trace_id, uuid.uuid4().hex, cache_scope())

    async def close(self, session_id: str) -> dict[str, Any]:
        return await self._on_host("close", session_id)

    async def live_count(self) -> int:
        """Sessions live in the hosts' memory, all hosts together: none in a host that has not started (asking does not start it)."""
        running = [host for host in self.hosts if await host.running()]
        return sum(int(stats["live"]) for stats in await asyncio.gather(*(host.call("stats") for host in running)))

    async def _on_host(self, method: str, session_id: str, *args: Any) -> Any:
        await self.pipeline.require(session_id)  # an unknown session fails here, without a host call
        host = self.hosts[host_index(session_id, len(self.hosts))]
        for attempt in range(RETRIES):
            try:
                return await host.call(method, session_id, *args)
            except (ActorDiedError, ActorUnavailableError) as exc:
                # the host died or is restarting; the call is retried with the same request id: a turn it
                # saved before dying is answered from the repository, one it had not saved runs again
                log.info("session.host_retry", session_id=session_id, host=host.name, attempt=attempt + 1, error=type(exc).__name__)
                if isinstance(exc, ActorDiedError) and lookup(host.name) is None:
                    host.forget()
                await asyncio.sleep(0.2 * 2**attempt)
        raise OverloadedError(
            f"session {session_id!r}: its host {host.name} did not come back after {RETRIES} attempts; retry in {RETRY_AFTER_S:g} s",
            {"session_id": session_id, "retry_after_s": RETRY_AFTER_S},
        )
