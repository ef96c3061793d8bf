"""The README's main command: `reasonray serve` on its own local Ray cluster, then `reasonray ask`.

The subprocess gets a clean environment (no settings of the test session's own cluster), as a
user's shell would.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from reasonray.gateway.simulator.server import free_port
from tests.integration.conftest import wait_until_serving
from tests.serving import BIN, held_port, serving, user_env


def process_tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(pid))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def exposed_listeners(root: int) -> set[tuple[str, int]]:
    """(process name, port) of every TCP listener of the process tree not bound to a loopback address."""
    inodes: dict[str, int] = {}
    for pid in process_tree(root):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes[link[8:-1]] = pid
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw, port = fields[1].split(":")
            packed = b"".join(bytes.fromhex(raw[i : i + 8])[::-1] for i in range(0, len(raw), 8))
            address = ipaddress.ip_address(socket.inet_ntop(family, packed))
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            if not address.is_loopback:
                name = Path(f"/proc/{inodes[fields[9]]}/comm").read_text().strip()
                found.add((name, int(port, 16)))
    return found


def test_serve_with_a_real_provider_and_no_key_names_the_variable():
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    done = subprocess.run([BIN / "reasonray", "serve", "--llm", "openai"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "OPENAI_API_KEY is not set" in done.stderr and "export OPENAI_API_KEY" in done.stderr


def test_serve_with_a_bad_config_reports_the_key(tmp_path):
    bad = tmp_path / "config.toml"
    bad.write_text('[reasoning]\nenabled_strategies = ["chain_of_thought", "nope"]\n')
    done = subprocess.run([BIN / "reasonray", "serve", "--config", bad], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "strategy 'nope' is not installed" in done.stderr


def test_serve_refuses_a_port_another_service_listens_on():
    """HAProxy binds with SO_REUSEPORT: without this check a second service would share the first's port."""
    with held_port() as port:
        done = subprocess.run([BIN / "reasonray", "serve", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"the API port 127.0.0.1:{port} is in use" in done.stderr and "--port" in done.stderr


def test_serve_then_ask_returns_391_with_metrics_and_a_trace_id_and_the_dashboard_is_up():
    port, dashboard = free_port(), free_port()
    with serving("--port", str(port), "--dashboard-port", str(dashboard), env=user_env()) as proc:
        wait_until_serving(proc, port, 120, lambda: proc.communicate(timeout=30)[0])
        asked = subprocess.run(
            [BIN / "reasonray", "ask", "What is 17 * 23?", "--url", f"http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert asked.returncode == 0, asked.stderr
        lines = asked.stdout.splitlines()
        assert lines[0] == "391"
        assert any(line.startswith("metrics:") and '"simulated": true' in line for line in lines)
        assert any(line.startswith("trace_id: ") and len(line.split()[1]) == 32 for line in lines)
        # auth is off on 127.0.0.1: the HAProxy ingress, its listeners and the replica's HTTP port on loopback;
        # off loopback there is only the replica's own gRPC transport, which Ray binds on every interface
        # and which does not serve the HTTP API (docs/security.md#ports)
        exposed = exposed_listeners(proc.pid)
        assert {name for name, _ in exposed} <= {"ray::ServeRepli"}, exposed
        for _, other in exposed:
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{other}/healthz", timeout=5)
        # the dashboard answers (401: it wants the cluster's token, as Ray 2.60 does by default)
        assert httpx.get(f"http://127.0.0.1:{dashboard}/api/version", timeout=10).status_code in (200, 401)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, output
        assert f"POST http://127.0.0.1:{port}/rpc" in output and "stopping..." in output
        assert f"dashboard  http://127.0.0.1:{dashboard}" in output
        assert "metrics    http://" in output and "/metrics" in output


@pytest.mark.slow  # a service of its own with HAProxy (about a minute); the loopback check of the default ingress runs by default
def test_serve_with_auth_runs_haproxy_and_binds_its_stats_and_metrics_on_loopback():
    """With [auth] the ingress is HAProxy: Ray's template binds its stats and Prometheus frontends on every
    interface, and `ray_environment` hands Ray a wrapper binary that binds them on the API's host."""
    port = free_port()
    stats, metrics = free_port(), free_port()
    env = user_env(
        REASONRAY_AUTH__JWT_SECRET="listener-test-secret-" + "x" * 32,
        RAY_SERVE_HAPROXY_STATS_PORT=str(stats),
        RAY_SERVE_HAPROXY_METRICS_PORT=str(metrics),
    )
    with serving("--port", str(port), "--no-dashboard", env=env) as proc:
        wait_until_serving(proc, port, 300, lambda: proc.communicate(timeout=30)[0])  # a Ray node and HAProxy on 2 busy cores
        assert httpx.get(f"http://127.0.0.1:{port}/v1/strategies", timeout=10).status_code == 401
        names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in process_tree(proc.pid) if Path(f"/proc/{pid}").exists()}
        assert "haproxy" in names, names
        # HAProxy's stats and metrics answer on loopback, and nothing but the replica's gRPC transport is off it
        assert httpx.get(f"http://127.0.0.1:{stats}/stats", timeout=10).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).status_code == 200
        exposed = exposed_listeners(proc.pid)
        assert {name for name, _ in exposed} <= {"ray::ServeRepli"}, exposed
        for _, other in exposed:
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{other}/healthz", timeout=5)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, output
        assert "ingress    HAProxy" in output, output
