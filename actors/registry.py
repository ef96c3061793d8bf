"""The strategy registry actor: one per application, the source of truth for the enabled catalogue and
the AgentCards (`reasonray.api.registry_service.RegistryService`, served to every replica through `RayRegistry`).

A sync actor: Ray runs its calls one at a time, so agent registrations never interleave their
writes to `<data_dir>/agents.json`. It restarts on failure and reloads the cards from that file.
It is replaced when the application is deployed with another catalogue or data directory
(`actors.lifecycle`), so a restart never reloads the settings of an earlier deploy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from reasonray.actors import unwrap
from reasonray.actors.lifecycle import Fingerprinted, NamedActor, fingerprint, private_files
from reasonray.api.registry_service import Registry, RegistryService
from reasonray.kernel.config import ReasoningSettings


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class StrategyRegistryActor(RegistryService, Fingerprinted):
    """RegistryService run by Ray: its methods are the actor's."""

    def __init__(self, fp: str, reasoning: dict[str, Any], data_dir: str | None, store_url: str | None = None) -> None:
        private_files()
        self._fingerprint = fp
        super().__init__(ReasoningSettings.model_validate(reasoning), Path(data_dir) if data_dir else None, store_url=store_url)


class RayRegistry(Registry):
    """The typed `reasonray.api.registry_service.Registry` over the application's registry actor."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await unwrap(getattr(self.handle, method).remote(*args, **kwargs))


def registry_actor(app_name: str, reasoning: ReasoningSettings, data_dir: Path | None, store_url: str | None = None) -> NamedActor:
    """The application's registry actor for these settings (its `fp` is what it answers to `fingerprint()`); deploy time
    starts it with `.deploy()`, which blocks until it answers."""
    args = reasoning.model_dump(mode="json"), str(data_dir) if data_dir else None, store_url
    return NamedActor(StrategyRegistryActor, f"{app_name}-registry", fingerprint(*args), args)
