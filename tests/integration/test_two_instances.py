"""Two services on one machine, each started by `reasonray serve` (as `make serve` does) with its own port
and secret and the HAProxy ingress: each answers only for itself, from the first moment it serves, and a
port of its own that another process holds stops the start."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from reasonray.api.access.auth import mint_token
from reasonray.gateway.simulator.server import free_port
from tests.integration.conftest import kill_tree
from tests.serving import held_port, start_serve, user_env
from tests.tarpit import CARD_PATH, Tarpit


def _bin() -> str:
    import shutil
    import sys

    found = shutil.which("reasonray", path=os.path.dirname(sys.executable))
    assert found, "the reasonray command is not installed next to this interpreter"
    return found


def _env(secret: str, **extra: str) -> dict[str, str]:
    return user_env(
        "REASONRAY_",
        REASONRAY_AUTH__JWT_SECRET=secret,
        REASONRAY_DATA_DIR=tempfile.mkdtemp(prefix="reasonray-two-"),
        REASONRAY_MEMORY__ENABLED="false",  # no embedding model to load twice on two cores
        REASONRAY_SESSIONS__HOSTS="1",
        REASONRAY_FANOUT__POOL_SIZE="1",
        **extra,
    )


def _start(port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    return start_serve("--port", str(port), "--no-dashboard", env=env)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _call(port: int, token: str) -> int:
    body = {"jsonrpc": "2.0", "method": "reasoning.strategies", "params": {}, "id": 1}
    try:
        return httpx.post(f"http://127.0.0.1:{port}/rpc", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code
    except httpx.HTTPError as exc:
        return -1 if "onnect" in type(exc).__name__ else -2


def test_a_port_of_this_instance_held_by_another_process_stops_the_start_naming_it():
    with held_port() as held:
        env = _env("collision-secret-" + "x" * 32, RAY_SERVE_FALLBACK_PROXY_HTTP_PORT=str(held))
        done = subprocess.run(
            [_bin(), "serve", "--port", str(free_port()), "--no-dashboard"], env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode != 0
    assert f"RAY_SERVE_FALLBACK_PROXY_HTTP_PORT={held}" in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.slow  # two services with Ray clusters and HAProxy of their own (several minutes on 2 busy cores)
@pytest.mark.timeout(900)
def test_two_instances_on_one_machine_each_answer_only_for_themselves():
    secrets = ["first-instance-secret-" + "a" * 32, "second-instance-secret-" + "b" * 32]
    ports = [free_port(), free_port()]
    tokens = [mint_token(s, "alice", ["reasoner"], 3600) for s in secrets]
    tarpit = Tarpit()
    egress = {"REASONRAY_EGRESS__ALLOW_HOSTS": f'["127.0.0.1:{tarpit.port}"]', "REASONRAY_EGRESS__CALL_TIMEOUT_S": "8"}
    first = _start(ports[0], _env(secrets[0], **egress))
    second = None
    try:
        deadline = time.monotonic() + 400
        while not _healthy(ports[0]):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate(timeout=30)[0][-4000:]
            time.sleep(1)
        # the second starts while the first serves; it is called from the moment its port answers at all
        second = _start(ports[1], _env(secrets[1]))
        wrong: list[tuple[float, int]] = []
        while True:
            status = _call(ports[1], tokens[1])
            if status == 401:  # its port answered with another secret: another instance answered
                wrong.append((time.monotonic(), status))
            if status == 200:
                break
            assert second.poll() is None and time.monotonic() < deadline, second.communicate(timeout=30)[0][-4000:]
            time.sleep(0.2)
        # both serving: 40 calls each, in parallel, with its own token; the other's token is refused
        with ThreadPoolExecutor(8) as pool:
            mine = list(pool.map(lambda i: _call(ports[i % 2], tokens[i % 2]), range(80)))
            theirs = list(pool.map(lambda i: _call(ports[i % 2], tokens[(i + 1) % 2]), range(20)))
        assert not wrong, wrong
        assert mine == [200] * 80, mine
        assert theirs == [401] * 20, theirs

        # behind this instance's own HAProxy a caller that goes away ends its call to a remote that never answers
        # at once, well before [egress] call_timeout_s (8 s) would (httpx sends the body after the headers: the
        # case HAProxy's request splicing hid)
        ops = mint_token(secrets[0], "ops", ["operator"], 3600)
        card = {"id": "tarpit", "name": "T", "capabilities": ["x"], "a2a_card_url": f"http://127.0.0.1:{tarpit.port}{CARD_PATH}"}
        headers = {"Authorization": f"Bearer {ops}"}
        registered = httpx.post(
            f"http://127.0.0.1:{ports[0]}/rpc",
            json={"jsonrpc": "2.0", "method": "agent.register", "params": card, "id": 1},
            headers=headers,
        ).json()
        assert "result" in registered, registered
        call = {"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "hold", "agent_id": "tarpit"}, "id": 2}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"http://127.0.0.1:{ports[0]}/rpc", json=call, headers=headers, timeout=5)
        gone = time.monotonic()
        while tarpit.open and time.monotonic() - gone < 15:
            time.sleep(0.1)
        released_s = time.monotonic() - gone
        print("HAPROXY_TARPIT_RELEASED_S", round(released_s, 2), "connections", tarpit.connections)
        assert tarpit.connections >= 1 and tarpit.open == 0 and released_s < 2.5, (tarpit.connections, tarpit.open, released_s)
    finally:
        tarpit.stop()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.communicate(timeout=90)
                except subprocess.TimeoutExpired:
                    kill_tree(proc)
