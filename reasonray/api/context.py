"""What the methods work with: one small typed object built once per application and handed to every
method function (`async def fn(ctx, params, call)`), instead of handlers closing over a builder's locals.

Transport-free and Ray-free.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reasonray.api.access.egress import Egress
from reasonray.api.jsonrpc import Params
from reasonray.api.registry_service import Registry
from reasonray.api.service import ReasoningService
from reasonray.kernel.config import CapSettings
from reasonray.kernel.sandbox import SandboxLimits
from reasonray.memory.loop import MemoryLoop
from reasonray.memory.service import MemoryClient
from reasonray.reasoner.session import Sessions

CacheStats = Callable[[], Awaitable[dict[str, Any]]]


class NoParams(Params):
    pass


@dataclass(frozen=True)
class Context:
    """The service and the stores and settings around it; `methods` is the dispatcher's table (agent.register
    checks a card's methods against it)."""

    service: ReasoningService
    registry: Registry
    sessions: Sessions | None = None
    limits: CapSettings = field(default_factory=CapSettings)
    egress: Egress = field(default_factory=Egress)  # no [egress] settings: remote agents are off
    sandbox: SandboxLimits = SandboxLimits()
    cache_stats: CacheStats | None = None
    methods: Mapping[str, Any] = field(default_factory=dict)

    @property
    def session_store(self) -> Sessions:
        if self.sessions is None:  # session.* are registered only where there are sessions
            raise RuntimeError("this application has no sessions")
        return self.sessions

    @property
    def memory_loop(self) -> MemoryLoop:
        if self.service.memory_loop is None:  # memory.* and stats.* are registered only where there is a bank
            raise RuntimeError("this application has no memory bank")
        return self.service.memory_loop

    @property
    def memory(self) -> MemoryClient:
        return self.memory_loop.client

    def workspace(self, name: str | None) -> str:
        """The workspace a call names, else the server's default one."""
        return name or self.memory_loop.settings.default_workspace
