"""The service's caps, retention, status codes, file modes and leaks, each through HTTP against one deployed
application (Ray Serve, the simulated model, authentication on so the audit log and the 401/403/429
paths exist): every refusal is a JSON error naming what was wrong, never a 5xx the client caused."""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from reasonray.api.access.auth import mint_token
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.reasoner.session import SessionSpec, SessionState
from tests.integration.conftest import LIGHT_APP, deep_merge, deploy, settings_for, undeploy
from tests.session_rows import stored_session

APP = "sec-http"
SECRET = "security-http-secret-" + "s" * 32
HISTORY_CAP = 4
BATCH_CONCURRENCY = 2


def bearer(sub: str = "root", *roles: str) -> dict[str, str]:
    return {"Authorization": "Bearer " + mint_token(SECRET, sub, list(roles or ["admin"]), 900)}


class InFlight:
    """ASGI middleware on the simulated model: how many chat completions it served at once."""

    def __init__(self, app: Any, counter: dict[str, int]) -> None:
        self.app, self.counter = app, counter

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        self.counter["now"] += 1
        self.counter["max"] = max(self.counter["max"], self.counter["now"])
        try:
            await self.app(scope, receive, send)
        finally:
            self.counter["now"] -= 1


@dataclass
class Service:
    client: httpx.Client
    data_dir: Path
    sim: SimulatorServer
    in_flight: dict[str, int]
    planted: dict[str, Path]

    def rpc(self, method: str, params: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        call = {"jsonrpc": "2.0", "method": method, "params": params, "id": 1}
        return self.client.post("/rpc", json=call, headers=headers or bearer()).json()

    def result(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        answer = self.rpc(method, params)
        assert "result" in answer, answer
        return answer["result"]

    def rest(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        return self.client.post("/v1/reasoning/execute", json=body, headers=bearer() if headers is None else headers)


def plant_session(sessions_dir: Path, session_id: str, age_days: float) -> Path:
    """A session file as an earlier version wrote it, last written `age_days` ago."""
    now = datetime.now(UTC)
    state = SessionState(session_id=session_id, status="idle", created_at=now, updated_at=now, spec=SessionSpec(), providers={}, version=1)
    path = plant(sessions_dir / f"{session_id}.json", age_days)
    path.write_text(state.model_dump_json())
    return plant(path, age_days, keep=True)


def plant(path: Path, age_days: float, keep: bool = False) -> Path:
    """A file the app did not write, `age_days` old (what retention must delete or keep)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not keep:
        path.write_text("{}")
    path.chmod(0o600)
    then = time.time() - age_days * 86400
    os.utime(path, (then, then))
    return path


@pytest.fixture(scope="module")
def service(serve_base: str) -> Iterator[Service]:
    counter = {"now": 0, "max": 0}
    sim = SimulatorServer(SimulatorSettings(port=0, hang_s=2))
    sim.app.add_middleware(InFlight, counter=counter)
    sim.start()
    data_dir = Path(tempfile.mkdtemp(prefix=f"reasonray-{APP}-"))
    planted = {  # before the app writes anything: its first session write and its first run sweep
        # sessions as an earlier version kept them (a file each): imported into the store, then swept by age
        "old session": plant_session(data_dir / "sessions", "s-expired", 40),
        "recent session": plant_session(data_dir / "sessions", "s-recent", 1),
        "old event log": plant(data_dir / "events" / "2020-01-01" / "old.jsonl", 3),
        "recent event log": plant(data_dir / "events" / "2020-01-02" / "recent.jsonl", 0.1),
    }
    settings = settings_for(
        sim.url,
        # one session host and one branch runner, started at their first use, as the task board
        **deep_merge(LIGHT_APP, {"fanout": {"max_in_flight": 2}}),
        data_dir=str(data_dir),
        auth={"jwt_secret": SECRET, "principals": {"hasty": {"requests_per_minute": 1}}},
        # caps below the strategies' own schema bounds, so each is what refuses (docs/security.md#caps)
        limits={
            "max_session_history": HISTORY_CAP,
            "batch_concurrency": BATCH_CONCURRENCY,
            "session_retention_days": 30,
            "max_samples": 4,
            "max_iterations": 8,
            "max_tree_nodes": 64,
            "max_tree_votes": 5,
            "max_tokens": 16_384,
        },
        reasoning={
            "strategies": {
                "chain_of_thought": {"default_max_tokens": 4096},
                "self_consistency": {"default_samples": 3},
                "react": {"default_max_tool_calls": 3},
            }
        },
        events={"max_age_days": 2, "sweep_interval_s": 0.5},
        llm={"cache": {"enabled": False}, "retry": {"max_attempts": 2}},
    )
    deploy(settings, APP, f"/{APP}")
    try:
        with httpx.Client(base_url=f"{serve_base}/{APP}", timeout=120) as client:
            yield Service(client, data_dir, sim, counter, planted)
    finally:
        undeploy(APP)
        sim.stop()


# --- calculator -------------------------------------------------------------------------------------


def test_the_calculator_refuses_a_huge_result_quickly_and_the_replica_stays_responsive(service):
    sid = service.result("session.create", {"server_tools": ["calculator"]})["session_id"]
    call = '[[sim call=calculator {"expression": "(((9**64)**64)**64)**64"}]]'
    started = time.perf_counter()
    answer = service.rpc("session.turn", {"session_id": sid, "message": f"Compute it. {call}"})
    took = time.perf_counter() - started
    error = answer["error"]
    # refused before computing, over a configured cap: -32602 naming the cap (and the tool call that hit it)
    assert error["code"] == -32602 and error["data"]["tool"] == "calculator", error
    assert error["data"]["cap"] == "[limits] max_calculator_digits" and error["data"]["limit"] == 10000, error
    assert "[limits] max_calculator_digits" in error["message"] and "cap is 10000" in error["message"], error
    assert took < 10, f"the refusal took {took:.1f} s (it used to be 14 s of CPU on the replica's loop)"
    # the replica answers at once, and the calculator still works on a normal result
    started = time.perf_counter()
    assert service.client.get("/healthz").json() == {"status": "ok"}
    assert time.perf_counter() - started < 5
    sid = service.result("session.create", {"server_tools": ["calculator"]})["session_id"]
    turn = service.result("session.turn", {"session_id": sid, "message": '[[sim call=calculator {"expression": "2 ** 64"}]]'})
    assert turn["answer"] == "18446744073709551616", turn


# --- strategy caps ----------------------------------------------------------------------------------

STRATEGY_CAPS = [  # within each strategy's own schema bounds (what is possible), above this app's caps (what it allows)
    ("refine", {"max_iterations": 9}, "max_iterations"),
    ("bounded_context", {"max_iterations": 9}, "max_iterations"),
    ("react", {"max_tool_calls": 9}, "max_iterations"),
    ("self_consistency", {"samples": 5}, "max_samples"),
    ("self_consistency", {"max_tokens": 40_000}, "max_tokens"),
    ("matts", {"k": 5}, "max_samples"),
    ("matts", {"k": 2, "base_strategy": "self_consistency", "base_config": {"samples": 5}}, "max_samples"),
    ("matts", {"k": 4, "base_strategy": "refine", "base_config": {"max_iterations": 8}}, "max_matts_work"),
    ("matts", {"k": 2, "base_strategy": "chain_of_thought", "base_config": {"max_tokens": 40_000}}, "max_tokens"),
    ("tree_of_thought", {"max_nodes": 65}, "max_tree_nodes"),
    ("tree_of_thought", {"votes": 6, "evaluation": "vote"}, "max_tree_votes"),
    ("tree_of_thought", {"max_tokens": 20_000}, "max_tokens"),
]


@pytest.mark.parametrize(("strategy", "config", "key"), STRATEGY_CAPS, ids=[f"{s}-{k}-{sorted(c)[0]}" for s, c, k in STRATEGY_CAPS])
def test_each_strategy_cap_is_invalid_params_naming_its_key(service, strategy, config, key):
    before = service.sim.app.state.model.stats.requests
    params = {"query": "What is 2 + 2?", "strategy": strategy, "strategy_config": config}
    error = service.rpc("reasoning.execute", params)["error"]
    assert error["code"] == -32602 and f"[limits] {key}" in error["message"], error
    assert error["data"]["cap"] == f"limits.{key}", error
    rest = service.rest(params)
    assert rest.status_code == 400 and rest.json()["error"]["data"]["cap"] == f"limits.{key}", rest.text
    assert service.sim.app.state.model.stats.requests == before, "a refused request reached the model"


# --- sessions: history cap and retention -------------------------------------------------------------


def test_a_session_keeps_at_most_max_session_history_messages(service):
    sid = service.result("session.create", {})["session_id"]
    for n in range(4):
        assert service.result("session.turn", {"session_id": sid, "message": f"turn {n} [[sim answer={n}]]"})["answer"] == str(n)
    state = service.result("session.get", {"session_id": sid})
    assert 2 <= state["messages"] <= HISTORY_CAP, state  # eight messages were exchanged
    assert state["last_answer"] == "3"
    stored = json.dumps((stored_session(service.data_dir / "sessions", sid) or {})["providers"])
    assert "turn 3 [[sim" in stored and "turn 0 [[sim" not in stored and "turn 1 [[sim" not in stored, stored[:2000]
    # the session goes on with what it kept
    assert service.result("session.turn", {"session_id": sid, "message": "turn 4 [[sim answer=4]]"})["answer"] == "4"


def test_sessions_and_event_logs_older_than_their_retention_are_deleted(service):
    service.result("session.create", {})  # the first session write sweeps the store (which imported the old files)
    service.result("reasoning.execute", {"query": "What is 3 + 4?"})  # a run sweeps the event logs (off the loop)
    deadline = time.monotonic() + 30
    while service.planted["old event log"].exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    sessions = service.data_dir / "sessions"
    assert stored_session(sessions, "s-expired") is None, "a session past [limits] session_retention_days was kept"
    assert stored_session(sessions, "s-recent") is not None
    assert not service.planted["old session"].exists() and not service.planted["recent session"].exists()  # imported
    assert not service.planted["old event log"].exists(), "an event log past [events] max_age_days was kept"
    assert service.planted["recent event log"].exists()


# --- batches ----------------------------------------------------------------------------------------


def test_a_batch_is_capped_and_runs_at_most_batch_concurrency_calls_at_once(service):
    too_many = [{"jsonrpc": "2.0", "method": "reasoning.strategies", "id": i} for i in range(21)]
    error = service.client.post("/rpc", json=too_many, headers=bearer()).json()["error"]
    assert error["code"] == -32602 and "[limits] max_batch_size" in error["message"], error
    service.sim.settings.ttft_ms = 300  # each call holds the model a while, so concurrent calls overlap
    service.in_flight["max"] = 0
    try:
        batch = [
            {"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": f"What is {i} + 1? [[sim answer={i + 1}]]"}, "id": i}
            for i in range(6)
        ]
        answers = service.client.post("/rpc", json=batch, headers=bearer()).json()
    finally:
        service.sim.settings.ttft_ms = 0
    assert sorted(a["result"]["answer"] for a in answers) == [str(i + 1) for i in range(6)], answers
    assert 1 <= service.in_flight["max"] <= BATCH_CONCURRENCY, service.in_flight


# --- REST mirrors: the HTTP status of each JSON-RPC code ----------------------------------------------


def documented_rest_status() -> dict[int, int]:
    """docs/api.md's REST table, read from the page (so the test and the docs cannot drift apart)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    line = next(x for x in page.splitlines() if x.startswith("| `POST /v1/reasoning/execute`"))
    names = {
        "invalid params": -32602,
        "max iterations": -32001,
        "budget": -32004,
        "deadline exceeded": -32015,
        "strategy unavailable": -32002,
        "not found": -32005,
        "session state": -32007,
        "cancelled": -32014,
        "model misbehaved": -32010,
        "tool failed": -32006,
        "model provider failed": -32013,
        "memory unavailable": -32008,
        "overloaded": -32011,
        "unauthenticated": -32016,
        "forbidden": -32003,
        "rate limited": -32012,
    }
    found: dict[int, int] = {}
    for status, names_part in re.findall(r"(\d{3}) ([^;|]+)", line):
        for name, code in names.items():
            if name in names_part:
                found.setdefault(code, int(status))
    return found


def test_the_documented_table_names_a_4xx_or_5xx_for_every_code_and_the_error_classes_agree():
    import reasonray.gateway.errors
    import reasonray.kernel.errors
    from reasonray.kernel.errors import ReasonRayError

    table = documented_rest_status()
    assert set(table) >= {-32602, -32001, -32004, -32015, -32002, -32005, -32007, -32014, -32010, -32006, -32013, -32008, -32011}
    table |= {-32016: 401, -32003: 403, -32012: 429}  # security.md's statuses of the gate and the limits
    del reasonray  # imported for their classes only

    def every(cls: type) -> list[type]:
        return [cls, *(c for sub in cls.__subclasses__() for c in every(sub))]

    classes = [c for c in every(ReasonRayError) if c is not ReasonRayError and c.code != -32603]
    assert len(classes) > 15
    for cls in classes:
        assert 400 <= cls.http_status < 600 and cls.http_status != 500, (cls.__name__, cls.http_status)
        assert table.get(cls.code) == cls.http_status, (cls.__name__, cls.code, cls.http_status, table.get(cls.code))


def add_script(service: Service, name: str, replies: list[dict[str, Any]]) -> None:
    response = httpx.post(f"{service.sim.url}/sim/scripts", json={"name": name, "replies": replies}, timeout=10)
    assert response.status_code == 200, response.text


REST_CASES: list[tuple[str, int, dict[str, Any], dict[str, str] | None]] = [
    ("no token", -32016, {"query": "What is 2 + 2?"}, {}),
    ("a role without runs", -32003, {"query": "What is 2 + 2?"}, {"as": "rita:reader"}),
    ("a cap", -32602, {"query": "What is 2 + 2?", "strategy": "self_consistency", "strategy_config": {"samples": 5}}, None),
    ("an unknown strategy", -32002, {"query": "What is 2 + 2?", "strategy": "telepathy"}, None),
    ("an unknown agent", -32005, {"query": "What is 2 + 2?", "agent_id": "nobody"}, None),
    ("a token budget", -32004, {"query": "What is 2 + 2?", "budget": {"max_total_tokens": 5}}, None),
    ("a deadline", -32015, {"query": "[[sim think=30000 answer=7]]", "budget": {"deadline_s": 0.01}}, None),
    (
        "iterations",
        -32001,
        {
            "query": "[[sim think=30000 answer=7]]",
            "strategy": "bounded_context",
            "strategy_config": {"max_iterations": 1, "chunk_size": 1024, "carryover_size": 512},
        },
        None,
    ),
    ("a reply without an answer", -32010, {"query": "[[sim script=empty]]", "strategy": "chain_of_thought"}, None),
    (
        "a failing tool",
        -32006,
        {"query": '[[sim call=python {"code": "raise SystemExit(3)"}]]', "strategy": "react", "strategy_config": {"tools": ["python"]}},
        None,
    ),
    ("the provider", -32013, {"query": "[[sim fault=500 times=50]] What is 2 + 2?"}, None),
]


@pytest.mark.parametrize(("name", "code", "body", "headers"), REST_CASES, ids=[c[0] for c in REST_CASES])
def test_the_rest_mirror_answers_each_code_with_its_documented_status(service, name, code, body, headers):
    add_script(service, "empty", [{"content": ""}])
    status = {**documented_rest_status(), -32016: 401, -32003: 403, -32012: 429}[code]
    if code == -32015:
        service.sim.settings.ttft_ms = 1000  # the model answers well after the 10 ms deadline, however fast the machine
    if headers and "as" in headers:  # minted when the case runs: a token made at collection can expire before it
        sub, role = headers["as"].split(":")
        headers = bearer(sub, role)
    try:
        response = service.rest(body, headers)
    finally:
        service.sim.settings.ttft_ms = 0
    assert response.status_code == status, (name, response.status_code, response.text[:400])
    error = response.json()["error"]
    assert error["code"] == code and error["message"], (name, error)
    if status == 503:
        assert int(response.headers["Retry-After"]) >= 1


def test_an_overloaded_replica_answers_503_with_retry_after(service):
    """[fanout] max_in_flight is 2 here: a fan-out wider than that runs alone, and one arriving meanwhile is -32011."""
    service.sim.settings.ttft_ms = 3000
    first: dict[str, httpx.Response] = {}
    body = {"query": "What is 2 + 2?", "strategy": "self_consistency", "strategy_config": {"samples": 3}}
    running = threading.Thread(target=lambda: first.setdefault("r", service.rest(body)))
    try:
        running.start()
        time.sleep(1.5)  # the first run's three branches now wait on the model
        second = service.rest({**body, "query": "What is 3 + 3?"})
        running.join(60)
    finally:
        service.sim.settings.ttft_ms = 0
    assert first["r"].status_code == 200, first["r"].text[:300]
    assert second.status_code == 503, second.text[:300]
    assert second.json()["error"]["code"] == -32011 and int(second.headers["Retry-After"]) >= 1


def test_a_rate_limited_caller_gets_429_on_the_rest_mirror(service):
    hasty = bearer("hasty", "reasoner")
    statuses = [service.rest({"query": f"What is {n} + 2?"}, hasty).status_code for n in range(3)]
    assert statuses[0] == 200 and statuses[-1] == 429, statuses
    limited = service.rest({"query": "What is 9 + 2?"}, hasty)
    assert limited.json()["error"]["code"] == -32012 and "Retry-After" in limited.headers


# --- leaks: provider errors, /healthz ----------------------------------------------------------------


def test_a_provider_failure_is_summarised_without_its_url(service):
    answer = service.rpc("reasoning.execute", {"query": "[[sim fault=500 times=50]] What is 5 + 5?"})
    error = answer["error"]
    assert error["code"] == -32013 and error["data"]["error_type"] == "provider_unavailable", error
    assert "HTTP 500" in error["message"], error
    text = json.dumps(error)
    host = f"127.0.0.1:{service.sim.settings.port}"
    for leak in (host, "/v1", "http://", "simulated server error"):
        assert leak not in text, (leak, text)


def test_healthz_says_only_ok_and_the_details_need_an_operator(service):
    public = service.client.get("/healthz")
    assert public.status_code == 200 and public.json() == {"status": "ok"}
    assert service.client.get("/admin/health").status_code == 401
    assert service.client.get("/admin/health", headers=bearer("rita", "reader")).status_code == 403
    details = service.client.get("/admin/health", headers=bearer("olga", "operator")).json()
    assert details["llm"]["base_url"].rstrip("/") == service.sim.url


# --- files -------------------------------------------------------------------------------------------


def test_what_the_service_wrote_is_its_users_alone(service):
    # real runs first: an event log, a session file, audit lines, Chroma's database
    service.result("reasoning.execute", {"query": "What is 6 + 6?"})
    sid = service.result("session.create", {})["session_id"]
    service.result("session.turn", {"session_id": sid, "message": "hello [[sim answer=hi]]"})
    item = {"title": "adding", "description": "add the numbers", "content": "6 + 6 is 12"}
    service.result("memory.store", {"items": [item]})
    root = service.data_dir
    expected = {
        "event log": next((root / "events").glob("*/*.jsonl"), None),
        "session store": root / "sessions" / "sessions.sqlite3",
        "audit log": root / "audit" / "audit.jsonl",
        "chroma database": next(root.rglob("chroma.sqlite3"), None),
    }
    for name, path in expected.items():
        assert path is not None and path.exists(), (name, sorted(str(p.relative_to(root)) for p in root.rglob("*")))
    wrong = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            continue
        if (path.is_dir() and mode != 0o700) or (path.is_file() and mode & 0o077):
            wrong.append(f"{path.relative_to(root)}: {oct(mode)}")
    assert not wrong, wrong
    assert stat.S_IMODE(expected["chroma database"].parent.stat().st_mode) == 0o700
