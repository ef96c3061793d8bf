"""The running service for the HTTP modules of tests/security: the Ray cluster and Serve instance of the
test session when tests/integration already started them (its session fixtures), else ones started here
for the module and stopped after it, so a later integration module starts its own as usual."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from reasonray.gateway.simulator.server import free_port
from reasonray.kernel.config import Settings


@pytest.fixture(scope="module")
def serve_url() -> Iterator[str]:
    import ray
    from ray import serve

    from reasonray.actors.ray_compat import serve_http
    from reasonray.serve_app import ray_environment

    started_ray = not ray.is_initialized()
    if started_ray:
        os.environ.update(ray_environment(Settings()))  # the ingress `reasonray serve` uses, as tests/integration does
        ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="reasonray-tests", log_to_driver=False)
    running = serve_http()
    started_serve = running is None
    if started_serve:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    else:
        port = running.port
    yield f"http://127.0.0.1:{port}"
    if started_serve:
        serve.shutdown()
    if started_ray:
        ray.shutdown()
