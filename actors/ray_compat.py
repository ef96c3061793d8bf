"""The few things ReasonRay needs from Ray that Ray offers only through private names, in one place.

Ray does not promise to keep these (`ray.serve.context._get_global_client`, `ActorHandle._actor_id`,
`ray.autoscaler._private.util`, the HAProxy config template of `ray.serve._private.haproxy_templates`), so nothing else imports them: code and tests call the functions
here, and `tests/unit/test_ray_compat.py` fails when a Ray upgrade renames or reshapes one of them,
before a deployment finds out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def validate_cluster_config(config: dict[str, Any]) -> dict[str, Any]:
    """A cluster launcher file (`cluster.yaml`), filled in with Ray's defaults as `ray up` would and
    checked by the validation `ray up` runs; raises ValueError naming what is wrong. Plain JSON Schema
    against `ray-schema.json` wrongly rejects the on-premises layout, which `prepare_config` fills in."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(config)
    try:
        validate_config(prepared)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(part) for part in exc.absolute_path) or "the top level"
        raise ValueError(f"cluster config: {where}: {exc.message}") from None
    return prepared


def haproxy_config_template() -> str:
    """The template Ray writes its HAProxy config from (what ReasonRay's HAProxy wrapper changes must be in it)."""
    from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE

    return str(HAPROXY_CONFIG_TEMPLATE)
