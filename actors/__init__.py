"""Ray actors (strategy registry, LLM cache) and the Ray side of fan-out. No reasoning logic lives here."""

from __future__ import annotations

from typing import Any

from ray.exceptions import RayTaskError, TaskCancelledError

from reasonray.kernel.errors import RunCancelledError

NAMESPACE = "reasonray"


async def unwrap(ref: Any) -> Any:
    """Await a Ray call; a failure comes back as the callee's own exception, not Ray's wrapper."""
    try:
        return await ref
    except RayTaskError as exc:
        raise (exc.cause if isinstance(exc.cause, BaseException) else exc) from None
    except TaskCancelledError:  # someone cancelled the task (ray.cancel): the caller's run was cancelled, -32014
        raise RunCancelledError("a Ray task of the run was cancelled before it finished; retry the request") from None
