"""Ray's private names only the tests use: the cluster-file validation `ray up` runs and the template Ray writes its
HAProxy config from. Kept in one place, as `reasonray.actors.ray_compat` keeps the product's, so
`tests/unit/test_ray_compat.py` is where a Ray upgrade that moves them shows."""

from __future__ import annotations

from typing import Any


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
