"""Ports of one service instance: Serve's internal listeners chosen free per instance, and refused at
start-up when another process holds them (docs/security.md#one-instance-its-own-ports).

Ray Serve's HAProxy ingress lists a fallback proxy at a fixed port (8500) behind every HAProxy, and
gives replicas their own HTTP ports from a fixed range (30000-31000). Serve's proxies bind with
SO_REUSEPORT, so a second instance on the same machine does not fail on those ports: it shares them,
and the kernel hands its callers to the first instance's processes (another configuration, other
data, other tokens). Each instance therefore gets its own free ports, and a port named in the
environment that another process already holds stops the start with a message naming the variable.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Mapping

from reasonray.kernel.errors import ReasonRayError

FALLBACK_HTTP = "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"
FALLBACK_GRPC = "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"
REPLICA_HTTP_RANGE = ("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT")
REPLICA_GRPC_RANGE = ("RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT")
HAPROXY_STATS = "RAY_SERVE_HAPROXY_STATS_PORT"
HAPROXY_METRICS = "RAY_SERVE_HAPROXY_METRICS_PORT"
SINGLE_PORTS = (FALLBACK_HTTP, FALLBACK_GRPC, HAPROXY_STATS, HAPROXY_METRICS)

REPLICA_PORTS = 64  # a block per instance: replicas, and ports Serve quarantines while a replica restarts
# Every listener is chosen between Ray's worker ports (10002-19999 by default: its workers bind them) and
# Linux's ephemeral range (32768-60999: a port chosen free there can be taken by an outgoing connection,
# a database client's or Ray's own, before Serve binds it)
BLOCK_LOW, BLOCK_HIGH = 20_000, 32_000


class PortCollisionError(ReasonRayError):
    """A port this instance would listen on is held by another process (another instance, most likely)."""

    error_type = "config_error"


def port_free(port: int) -> bool:
    """Whether a plain bind (no SO_REUSEPORT: a holder that shares its port is found too) succeeds; the
    wildcard address also finds a holder bound to one address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections (TIME_WAIT) do not count
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_block(size: int = REPLICA_PORTS, rng: random.Random | None = None) -> int:
    """The first port of `size` consecutive ports that are all free now, at a random place in the block range."""
    rng = rng or random.SystemRandom()
    for _ in range(200):
        start = rng.randrange(BLOCK_LOW, BLOCK_HIGH - size)
        if all(port_free(p) for p in range(start, start + size)):
            return start
    raise PortCollisionError(f"no {size} consecutive free ports between {BLOCK_LOW} and {BLOCK_HIGH} for Serve's replicas")


def instance_ports() -> dict[str, str]:
    """Ray Serve's internal ports for a new instance, all free now (the environment Ray reads them from)."""
    singles = free_block(len(SINGLE_PORTS))
    env = {name: str(singles + i) for i, name in enumerate(SINGLE_PORTS)}
    for (low, high), block in ((REPLICA_HTTP_RANGE, free_block()), (REPLICA_GRPC_RANGE, free_block())):
        env |= {low: str(block), high: str(block + REPLICA_PORTS)}
    return env


def check_instance_ports(environ: Mapping[str, str]) -> None:
    """Refuse to start when a port of this instance (as the environment names them) is held by another process."""
    held = [f"{name}={environ[name]}" for name in SINGLE_PORTS if name in environ and not port_free(int(environ[name]))]
    for low, high in (REPLICA_HTTP_RANGE, REPLICA_GRPC_RANGE):
        if low in environ and high in environ:
            taken = [p for p in range(int(environ[low]), int(environ[high])) if not port_free(p)]
            if taken:
                held.append(f"{low}..{high} ({len(taken)} in use, first {taken[0]})")
    if held:
        raise PortCollisionError(
            "another process holds ports this instance would listen on: " + ", ".join(held) + ". Serve shares ports "
            "with SO_REUSEPORT, so starting anyway would let that process answer this instance's callers: stop it, "
            "or unset these variables so that free ports are chosen (docs/security.md#one-instance-its-own-ports)"
        )
