"""The few things ReasonRay needs from Ray that Ray offers only through private names, in one place.

Ray does not promise to keep these (`ray.serve.context._get_global_client`, `ActorHandle._actor_id`), so nothing
else in the product imports them: code calls the functions here (the tests' own private names, Ray's cluster-file
validation and HAProxy template, are in `tests/ray_private.py`), and `tests/unit/test_ray_compat.py` fails when a
Ray upgrade renames or reshapes one of them, before a deployment finds out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ray
from ray.actor import ActorHandle

if TYPE_CHECKING:
    from ray.serve.config import HTTPOptions


def serve_http() -> HTTPOptions | None:
    """The HTTP options (where its proxies listen: `host`, `port`) of the Serve instance running on this process's
    cluster, or None when Ray is not initialised here or no Serve controller runs on it. Never starts Ray: Serve's
    own lookup would."""
    if not ray.is_initialized():
        return None
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    return client.http_config if client is not None else None


def actor_id_of(handle: ActorHandle) -> str:
    """The hex id of the actor behind a handle: the id `ray.get_runtime_context().get_actor_id()` gives
    inside that actor, read from the caller's side (Ray has no public accessor on the handle)."""
    return str(handle._actor_id.hex())
