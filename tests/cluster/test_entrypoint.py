"""The container entrypoint run directly: `deploy/entrypoint.sh serve` starts the service, and SIGTERM
while a session turn is in flight lets the turn finish, answer and save before the process exits 0.

The model is the simulator behind a gate this test holds: the turn's model call arrives, SIGTERM is
sent, the service says it is stopping, and only then is the call let through."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from reasonray.gateway.simulator.server import SimulatorSettings, create_app, free_port
from reasonray.reasoner.session import SessionState
from reasonray.stores.postgres import PgStore
from reasonray.stores.sessions import PgSessionStore
from tests.integration.conftest import result_of, rpc, wait_until_serving

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


class Gate:
    """ASGI middleware: chat completions wait until `release` is set; `arrived` says one is waiting."""

    def __init__(self, app) -> None:
        self.app = app
        self.arrived = threading.Event()
        self.release = threading.Event()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            self.arrived.set()
            await asyncio.to_thread(self.release.wait, 120)
        await self.app(scope, receive, send)


@pytest.fixture
def gated_model():
    gate = Gate(create_app(SimulatorSettings()))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(gate, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield gate, f"http://127.0.0.1:{port}/v1"
    gate.release.set()
    server.should_exit = True
    thread.join(10)


@pytest.mark.timeout(600)  # starts Ray once; a loaded machine takes minutes
def test_sigterm_drains_the_in_flight_turn_and_saves_the_session(pg_url, gated_model, tmp_path):
    gate, model_url = gated_model
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "RAY_ADDRESS") and not k.startswith("RAY_SERVE_")},
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "REASONRAY_DATA_DIR": str(tmp_path),
        "REASONRAY_STORE__URL": pg_url,
        "REASONRAY_MEMORY__ENABLED": "false",
        "REASONRAY_SESSIONS__HOSTS": "1",  # the drain is what this test follows: one host, one branch runner
        "REASONRAY_FANOUT__POOL_SIZE": "1",
        "REASONRAY_LLM__PROVIDER": "simulated",
        "OPENAI_BASE_URL": model_url,
        "REASONRAY_SERVER__HOST": "127.0.0.1",
        "REASONRAY_SERVER__PORT": str(port),
        "REASONRAY_LOGGING__LEVEL": "warning",
        "REASONRAY_SERVER__FAST_INGRESS": "false",  # Serve's own proxy: never a port shared with another test's HAProxy
        "RAY_raylet_start_wait_time_s": "120",
    }
    proc = subprocess.Popen(
        ["sh", str(REPO / "deploy" / "entrypoint.sh"), "serve", "--num-cpus", "2", "--no-dashboard"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output: list[str] = []
    stopping = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            output.append(line)
            if line.startswith("stopping..."):
                stopping.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until_serving(proc, port, 300, lambda: "".join(output), "the entrypoint's service")  # a loaded machine starts Ray slowly
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
        sid = result_of(rpc(client, "session.create", {}))["session_id"]
        answer: dict = {}
        turn = threading.Thread(target=lambda: answer.update(rpc(client, "session.turn", {"session_id": sid, "message": "Hello"}).json()))
        turn.start()
        assert gate.arrived.wait(60), "the turn's model call never arrived"
        proc.send_signal(signal.SIGTERM)  # the entrypoint exec'd reasonray serve: the signal reaches it
        assert stopping.wait(60), "SIGTERM did not stop the service:\n" + "".join(output)
        time.sleep(5)  # the service is well into stopping (a proxy killed at once would have dropped the turn by now)
        gate.release.set()
        turn.join(120)
        assert answer.get("result", {}).get("status") == "completed", answer
        assert proc.wait(120) == 0, "".join(output)
    finally:
        gate.release.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    store = PgStore(pg_url)
    try:
        text, _ = store.blocking(PgSessionStore(SessionState, store).row(sid))
        state = json.loads(text)
        assert state["turn"] == 1 and state["status"] == "idle" and state["last_answer"] == answer["result"]["answer"]
    finally:
        store.close()
