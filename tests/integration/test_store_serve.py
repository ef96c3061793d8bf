"""`reasonray serve` (what `make serve` runs) with `REASONRAY_STORE__URL`: the first service creates the
schema and keeps its sessions, agent cards and runs in PostgreSQL; a second service started later with a
fresh, empty `REASONRAY_DATA_DIR` and the same URL finds every session and card and continues them."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from reasonray.gateway.simulator.server import free_port
from reasonray.reasoner.session import SessionState
from reasonray.stores.agent_cards import PgCardStore
from reasonray.stores.postgres import PgStore
from reasonray.stores.sessions import PgSessionStore
from reasonray.strategies.agents import AgentCard
from tests.integration.conftest import result_of, rpc, wait_until_serving
from tests.serving import serving, user_env

CARD = {"id": "pg-planner", "name": "Planner", "capabilities": ["reasoning.strategy.chain_of_thought"]}


@contextmanager
def serve(store_url: str, data_dir: Path) -> Iterator[httpx.Client]:
    port = free_port()
    env = user_env(
        REASONRAY_STORE__URL=store_url,
        REASONRAY_DATA_DIR=str(data_dir),
        REASONRAY_MEMORY__ENABLED="false",  # the memory bank is not what this test is about
        REASONRAY_LOGGING__LEVEL="warning",
        # Serve's own proxy: HAProxy binds with SO_REUSEPORT, so a service of another test that picked the
        # same free port would silently share it and answer half of our requests
        REASONRAY_SERVER__FAST_INGRESS="false",
        RAY_raylet_start_wait_time_s="120",  # a loaded machine registers the node slowly
    )
    with serving("--port", str(port), "--no-dashboard", env=env) as proc:
        wait_until_serving(proc, port, 300, lambda: proc.communicate(timeout=30)[0])  # a loaded machine starts Ray slowly
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, output


@pytest.mark.timeout(900)  # starts Ray twice; a loaded machine takes minutes
@pytest.mark.slow  # two `reasonray serve` clusters one after the other (the store's contract tests run by default)
def test_a_second_service_with_a_fresh_data_dir_finds_every_session_and_card(pg_url, tmp_path):
    with serve(pg_url, tmp_path / "first") as client:
        sid = result_of(rpc(client, "session.create", {"server_tools": ["calculator"]}))["session_id"]
        first = result_of(rpc(client, "session.turn", {"session_id": sid, "message": "What is 2 + 2?"}))
        assert first["status"] == "completed" and first["turn"] == 1
        result_of(rpc(client, "agent.register", CARD))

    store = PgStore(pg_url)  # the schema exists: the first service migrated it on start
    try:
        local = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "first").rglob("*") if p.suffix == ".json")
        assert store.blocking(PgSessionStore(SessionState, store).load(sid)) is not None, (
            f"session {sid} is not in PostgreSQL; local JSON files: {local}"
        )
        assert list(PgCardStore(AgentCard, store).all()) == [CARD["id"]]
        assert store.blocking(store.fetch("SELECT trace_id FROM runs LIMIT 1")), "the turn is in the run index"
    finally:
        store.close()

    fresh = tmp_path / "second"
    with serve(pg_url, fresh) as client:
        assert result_of(rpc(client, "agent.get", {"agent_id": CARD["id"]}))["name"] == "Planner"
        got = result_of(rpc(client, "session.get", {"session_id": sid}))
        assert got["turn"] == 1 and got["messages"] == 2
        second = result_of(rpc(client, "session.turn", {"session_id": sid, "message": "What is 3 + 3?"}))
        assert second["turn"] == 2 and second["status"] == "completed"
    assert not (fresh / "sessions").exists() and not (fresh / "agents.json").exists()  # nothing of it on local disk
