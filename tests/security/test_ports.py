"""Each instance's internal ports are its own: chosen free, and a held one stops the start naming its variable."""

from __future__ import annotations

import random

import pytest

from reasonray.kernel import ports
from reasonray.kernel.ports import PortCollisionError, check_instance_ports, free_block, instance_ports, port_free
from tests.serving import held_port


def test_two_instances_get_disjoint_free_ports_none_of_them_serves_defaults():
    first, second = instance_ports(), instance_ports()
    assert first[ports.FALLBACK_HTTP] != "8500" and first[ports.REPLICA_HTTP_RANGE[0]] != "30000"
    single = {first[n] for n in ports.SINGLE_PORTS} | {second[n] for n in ports.SINGLE_PORTS}
    assert len(single) == 2 * len(ports.SINGLE_PORTS)  # no listener shared
    for env in (first, second):
        low, high = int(env[ports.REPLICA_HTTP_RANGE[0]]), int(env[ports.REPLICA_HTTP_RANGE[1]])
        assert high - low == ports.REPLICA_PORTS and high <= ports.BLOCK_HIGH  # below the ephemeral range
        assert all(port_free(p) for p in range(low, high))
        check_instance_ports(env)  # nothing held: starts


def test_a_port_held_by_another_process_even_with_so_reuseport_stops_the_start_naming_the_variable():
    with held_port() as held:
        assert not port_free(held)
        with pytest.raises(PortCollisionError, match=rf"{ports.FALLBACK_HTTP}={held}.*answer this instance's callers"):
            check_instance_ports({**instance_ports(), ports.FALLBACK_HTTP: str(held)})
        # a range around it: its neighbours may belong to any other process on this machine (the other test worker's
        # Ray cluster took one once), so they are counted as they are found
        low, high = held - 3, held + 4
        around = [p for p in range(low, high) if not port_free(p)]
        with pytest.raises(PortCollisionError, match=rf"{len(around)} in use, first {around[0]}\)") as refused:
            check_instance_ports({ports.REPLICA_HTTP_RANGE[0]: str(low), ports.REPLICA_HTTP_RANGE[1]: str(high)})
        assert held in around and "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT..RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT" in str(refused.value)


def test_a_block_is_found_around_held_ports(monkeypatch):
    taken = set(range(ports.BLOCK_LOW, ports.BLOCK_HIGH, 50))  # one port in every 50 is held
    monkeypatch.setattr(ports, "port_free", lambda port: port not in taken)
    start = free_block(size=40, rng=random.Random(7))
    assert not taken & set(range(start, start + 40))
    with pytest.raises(PortCollisionError, match="no 64 consecutive free ports"):
        free_block(size=64, rng=random.Random(7))


def test_the_haproxy_ingress_gets_the_instances_own_ports_and_serves_proxy_keeps_its_port():
    from reasonray.actors.environment import ray_environment
    from reasonray.kernel.config import Settings

    secured = ray_environment(Settings(auth={"jwt_secret": "s" * 32}))
    assert secured["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert {*ports.SINGLE_PORTS, *ports.REPLICA_HTTP_RANGE, *ports.REPLICA_GRPC_RANGE} <= set(secured)
    assert secured[ports.FALLBACK_HTTP] != "8500" and int(secured[ports.REPLICA_HTTP_RANGE[0]]) != 30000
    check_instance_ports(secured)
    default = ray_environment(Settings())  # auth off on a loopback address: HAProxy too, on this instance's own ports
    assert default["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and default[ports.FALLBACK_HTTP] != "8500"
    check_instance_ports(default)
    plain = ray_environment(Settings(server={"fast_ingress": False}))  # Serve's own proxy, on [server] port; nothing of HAProxy's
    assert not {*ports.SINGLE_PORTS, *ports.REPLICA_HTTP_RANGE} & set(plain)


def test_a_starting_proxy_gets_time_to_report_ready_on_a_busy_node(monkeypatch):
    from reasonray.actors.environment import PROXY_READY_TIMEOUT_ENV, ray_environment
    from reasonray.kernel.config import Settings

    monkeypatch.delenv(PROXY_READY_TIMEOUT_ENV, raising=False)
    for settings in (Settings(), Settings(server={"fast_ingress": False})):  # HAProxy's manager and Serve's own proxy
        assert float(ray_environment(settings)[PROXY_READY_TIMEOUT_ENV]) >= 30  # Serve's 5 s killed them while starting
    monkeypatch.setenv(PROXY_READY_TIMEOUT_ENV, "12")  # an operator's own value is kept
    assert ray_environment(Settings())[PROXY_READY_TIMEOUT_ENV] == "12"
