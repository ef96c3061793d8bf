"""The HAProxy ReasonRay runs for Ray: Ray's config with the stats and metrics frontends bound on the API's
host and request bodies not spliced (a spliced body hides its caller's close from HAProxy, so a caller that
leaves would not cancel its call: tests/integration/test_untrusted_callers_http.py shows the whole path)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reasonray.actors.environment import haproxy_wrapper
from tests.ray_private import haproxy_config_template

# the lines of Ray's template the wrapper changes, as Ray writes them
RAY_CONFIG = """global
    maxconn 64
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option abortonclose
    option splice-request
    option splice-response
listen stats
  bind *:{stats}
  stats enable
frontend prometheus
    bind :{metrics}
    http-request use-service prometheus-exporter if {{ path /metrics }}
frontend http_frontend
    bind 127.0.0.1:{api}
    default_backend api
backend api
    server replica 127.0.0.1:{replica}
"""


def test_rays_template_still_has_what_the_wrapper_changes():
    template = haproxy_config_template()
    assert "    option splice-request\n" in template and "    option abortonclose\n" in template


@pytest.mark.parametrize(
    ("host", "stats", "metrics"),
    [
        ("127.0.0.1", "bind 127.0.0.1:22456", "bind 127.0.0.1:22457"),  # one IPv4 address: the side frontends follow it
        ("0.0.0.0", "bind *:22456", "bind :22457"),  # every interface: left as Ray wrote them
    ],
)
def test_the_wrapper_binds_the_side_frontends_on_the_apis_host_and_splices_no_request(tmp_path: Path, host: str, stats: str, metrics: str):
    wrapper = haproxy_wrapper(host)
    assert wrapper is not None  # ray[serve] bundles HAProxy
    config = tmp_path / "haproxy.cfg"
    ray_wrote = RAY_CONFIG.format(stats=22456, metrics=22457, api=22458, replica=22459)
    config.write_text(ray_wrote)
    checked = subprocess.run([wrapper, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr  # the real HAProxy accepts the copy
    copy = (tmp_path / "haproxy.cfg.reasonray").read_text()
    assert "    no option splice-request\n" in copy and "    option splice-response\n" in copy
    assert "option abortonclose" in copy
    assert stats in copy and metrics in copy
    assert config.read_text() == ray_wrote  # Ray's own file untouched
