"""The strategy registry actor: one per application, the source of truth for the enabled catalogue."""

from __future__ import annotations

from typing import Any

import ray

from actors import NAMESPACE
from reasonray.config import ReasoningSettings
from strategies.registry import StrategyRegistry, build_catalogue


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class StrategyRegistryActor:
    def __init__(self, reasoning: dict[str, Any]) -> None:
        self.configure(reasoning)

    def configure(self, reasoning: dict[str, Any]) -> dict[str, Any]:
        """(Re)load the catalogue from `[reasoning]` settings; idempotent. Returns the snapshot."""
        self._settings = ReasoningSettings.model_validate(reasoning)
        self._registry = StrategyRegistry().discover()
        self._catalogue = build_catalogue(self._registry, self._settings)
        return self.snapshot()

    def snapshot(self) -> dict[str, Any]:
        """What replicas need to serve: the enabled names and the system default."""
        return {"enabled": list(self._catalogue.entries), "default": self._catalogue.default}

    def describe(self) -> dict[str, Any]:
        return {
            **self._catalogue.describe(),
            "plugin_failures": [f.__dict__ for f in self._registry.failures],
        }


def registry_actor(app_name: str, reasoning: ReasoningSettings):
    """The application's registry actor, created on first use; (re)configured with `reasoning`."""
    handle = StrategyRegistryActor.options(
        name=f"{app_name}-registry", namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote(reasoning.model_dump(mode="json"))
    return handle
