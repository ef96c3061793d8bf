"""The strategy registry actor: one per application, the source of truth for the enabled catalogue and
the AgentCards (`reasonray.registry.RegistryService`, served to every replica).

A sync actor: Ray runs its calls one at a time, so agent registrations never interleave their
writes to `<data_dir>/agents.json`. It restarts on failure and reloads the cards from that file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from actors import NAMESPACE, unwrap
from reasonray.config import ReasoningSettings
from reasonray.registry import RegistryService


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class StrategyRegistryActor:
    def __init__(self, reasoning: dict[str, Any], data_dir: str | None) -> None:
        self.configure(reasoning, data_dir)

    def configure(self, reasoning: dict[str, Any], data_dir: str | None) -> dict[str, Any]:
        """(Re)load the catalogue and the agent directory; idempotent. Returns the snapshot."""
        self._service = RegistryService(ReasoningSettings.model_validate(reasoning), Path(data_dir) if data_dir else None)
        return self._service.snapshot()

    def call(self, method: str, *args: Any) -> Any:
        """Any public RegistryService method by name (snapshot, describe, register_agent, ...)."""
        if method.startswith("_") or not callable(getattr(self._service, method, None)):
            raise AttributeError(f"the registry has no method {method!r}")
        return getattr(self._service, method)(*args)


class RayRegistry:
    """`reasonray.registry.Registry` over the application's registry actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def _call(self, method: str, *args: Any) -> Any:
        return await unwrap(self.handle.call.remote(method, *args))

    async def snapshot(self) -> dict[str, Any]:
        return await self._call("snapshot")

    async def describe(self) -> dict[str, Any]:
        return await self._call("describe")

    async def register_agent(self, registration: dict[str, Any], known_methods: list[str]) -> dict[str, Any]:
        return await self._call("register_agent", registration, known_methods)

    async def get_agent(self, agent_id: str) -> dict[str, Any]:
        return await self._call("get_agent", agent_id)

    async def list_agents(self) -> list[dict[str, Any]]:
        return await self._call("list_agents")

    async def discover_agents(self, capabilities: list[str]) -> list[dict[str, Any]]:
        return await self._call("discover_agents", capabilities)

    async def unregister_agent(self, agent_id: str) -> dict[str, Any]:
        return await self._call("unregister_agent", agent_id)


def registry_actor(app_name: str, reasoning: ReasoningSettings, data_dir: Path | None):
    """The application's registry actor, created on first use (callers then `configure` it)."""
    return StrategyRegistryActor.options(
        name=f"{app_name}-registry", namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote(reasoning.model_dump(mode="json"), str(data_dir) if data_dir else None)
