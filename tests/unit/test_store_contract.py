"""The repository contract, run against both stores: files under the data directory and PostgreSQL.

Each test gets a fresh store: a new temporary data directory, or the session's PostgreSQL cluster
with every table emptied. "Another process" is a second repository object over the same store (for
PostgreSQL with a different, empty data directory: nothing may depend on local files).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reasonray.api.access.limits import RateLimiter, TokenBudgets
from reasonray.gateway.testing import ScriptedLLM
from reasonray.kernel.errors import SessionStateError
from reasonray.kernel.events import EventRecorder, RunEnd, event_log_path
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import SessionPipeline, SessionSpec, SessionState
from reasonray.stores.a2a import TaskQuery, open_a2a
from reasonray.stores.agent_cards import open_cards
from reasonray.stores.audit import AuditRecord, open_audit
from reasonray.stores.counters import open_counters, window_start
from reasonray.stores.ownership import open_ownership
from reasonray.stores.runs import RunRecord, open_runs
from reasonray.stores.sessions import open_sessions
from reasonray.strategies.agents import AgentCard


class Store:
    def __init__(self, url: str | None, tmp_path: Path) -> None:
        self.url = url
        self.tmp_path = tmp_path
        self.data_dir = tmp_path / "data"

    def other_data_dir(self) -> Path:
        """What a second process uses: the same directory for files, a fresh one for PostgreSQL."""
        return self.data_dir if self.url is None else self.tmp_path / "fresh"

    def sessions(self, data_dir: Path | None = None):
        return open_sessions(SessionState, self.url, data_dir or self.data_dir)


@pytest.fixture(params=["files", "postgresql"])
async def store(request, tmp_path):
    if request.param == "files":
        yield Store(None, tmp_path)
        return
    pg = request.getfixturevalue("postgres")
    from reasonray.stores.postgres import pg_store

    await pg_store(pg.url).fetch("TRUNCATE sessions, agent_cards, runs, audit_log, counters, ownership")
    yield Store(pg.url, tmp_path)
    await pg_store(pg.url).aclose()  # the pool of this test's event loop, which closes with the test


def scripted_pipeline(store: Store, answers: list[str], data_dir: Path | None = None) -> tuple[SessionPipeline, ScriptedLLM]:
    llm = ScriptedLLM(answers)
    d = data_dir or store.data_dir
    return SessionPipeline(store.sessions(d), llm, builtin_toolbox(), data_dir=d, runs=open_runs(store.url, d)), llm


# -- sessions -------------------------------------------------------------------------------------------


async def test_a_session_continues_in_another_process(store):
    first, llm = scripted_pipeline(store, ["<answer>Hello!</answer>"])
    sid = (await first.create(SessionSpec())).session_id
    await first.turn(sid, "Hi", "trace-one")
    llm.assert_complete()

    second, llm2 = scripted_pipeline(store, ["<answer>Again!</answer>"], store.other_data_dir())
    result = await second.turn(sid, "Once more", "trace-two")
    assert result.turn == 2 and result.answer == "Again!"
    assert [m.content for m in llm2.requests[0].messages if m.role == "user"] == ["Hi", "Once more"]
    state = await store.sessions().load(sid)
    assert state is not None and state.turn == 2 and state.last_answer == "Again!" and state.version == 3  # created, then two turns


async def test_missing_session_is_none(store):
    assert await store.sessions().load("nosuchsession") is None


async def test_a_stale_save_fails_and_keeps_the_winner(store):
    pipeline, _ = scripted_pipeline(store, [])
    sid = (await pipeline.create(SessionSpec())).session_id
    repo_a, repo_b = store.sessions(), store.sessions(store.other_data_dir())
    a, b = await repo_a.load(sid), await repo_b.load(sid)
    assert a is not None and b is not None and a.version == b.version == 1
    await repo_a.save(a.model_copy(update={"last_answer": "from A"}))
    with pytest.raises(SessionStateError, match="saved by another replica") as err:
        await repo_b.save(b.model_copy(update={"last_answer": "from B"}))
    assert err.value.data["stale_version"] == 1  # SessionStateError: -32007 on the wire
    stored = await repo_a.load(sid)
    assert stored is not None and stored.last_answer == "from A" and stored.version == 2


async def test_creating_an_existing_session_again_conflicts(store):
    pipeline, _ = scripted_pipeline(store, [])
    state = await pipeline.create(SessionSpec())
    with pytest.raises(SessionStateError):
        await store.sessions().save(state.model_copy(update={"version": 0, "last_answer": "another create"}))


async def test_concurrent_savers_of_one_version_have_exactly_one_winner(store):
    pipeline, _ = scripted_pipeline(store, [])
    sid = (await pipeline.create(SessionSpec())).session_id
    loaded = [await store.sessions().load(sid) for _ in range(8)]

    async def save(i: int) -> str:
        try:
            await store.sessions().save(loaded[i].model_copy(update={"last_answer": f"writer {i}"}))
        except SessionStateError:
            return "conflict"
        return f"writer {i}"

    outcomes = await asyncio.gather(*(save(i) for i in range(8)))
    winners = [o for o in outcomes if o != "conflict"]
    assert len(winners) == 1 and (await store.sessions().load(sid)).last_answer == winners[0]


# -- agent cards ------------------------------------------------------------------------------------------


def card(agent_id: str, *capabilities: str) -> AgentCard:
    return AgentCard(
        id=agent_id,
        name=agent_id.title(),
        capabilities=list(capabilities) or ["reasoning.strategy.chain_of_thought"],
        registered_at=datetime.now(UTC),
    )


def test_agent_cards_are_put_replaced_deleted_and_seen_by_another_process(store):
    repo = open_cards(AgentCard, store.url, store.data_dir)
    assert repo.all() == {}
    repo.put(card("alpha"))
    repo.put(card("beta", "reasoning.strategy.react", "reasoning.parallel"))
    repo.put(card("alpha", "reasoning.strategy.refine"))  # replaces
    other = open_cards(AgentCard, store.url, store.other_data_dir())
    assert sorted(other.all()) == ["alpha", "beta"]
    assert other.all()["alpha"].capabilities == ["reasoning.strategy.refine"] and other.all()["beta"] == repo.all()["beta"]
    other.delete("beta")
    assert sorted(open_cards(AgentCard, store.url, store.other_data_dir()).all()) == ["alpha"]


# -- runs, audit, counters -------------------------------------------------------------------------------------


def a_run(trace_id: str, principal: str | None = None) -> RunRecord:
    return RunRecord(
        trace_id=trace_id,
        kind="execute",
        principal=principal,
        strategy="chain_of_thought",
        status="ok",
        prompt_tokens=20,
        completion_tokens=10,
        started_at=datetime.now(UTC),
        elapsed_ms=12,
    )


async def test_a_run_is_indexed_with_its_event_log(store):
    path = event_log_path(store.data_dir, "trace-run")
    recorder = EventRecorder(path, keep=False)
    recorder(RunEnd(trace_id="trace-run", strategy="chain_of_thought", status="ok", total_tokens=30, execution_time_ms=12))
    recorder.close()
    run = a_run("trace-run", principal="alice")
    await open_runs(store.url, store.data_dir).record(run, path)
    if store.url is not None:
        path.unlink()  # the database holds the events itself
    found = await open_runs(store.url, store.other_data_dir()).get("trace-run")
    assert found is not None
    record, events = found
    assert record == run and [e["type"] for e in events] == ["RUN_END"] and events[0]["total_tokens"] == 30
    assert await open_runs(store.url, store.data_dir).get("no-such-trace") is None


async def test_run_files_of_an_earlier_version_are_imported_once(tmp_path):
    run = a_run("old-run")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "old-run.json").write_text(json.dumps({"run": run.model_dump(mode="json"), "event_log": None}))
    (tmp_path / "runs" / "broken.json").write_text("{not json")
    found = await open_runs(None, tmp_path).get("old-run")
    assert found is not None and found[0] == run and found[1] == []
    assert not (tmp_path / "runs" / "old-run.json").exists() and (tmp_path / "runs" / "broken.json").exists()
    again = await open_runs(None, tmp_path).get("old-run")  # another process opening the index: the row, not the file
    assert again is not None and again[0] == run


async def test_session_turns_land_in_the_run_index(store):
    pipeline, _ = scripted_pipeline(store, ["<answer>Hello!</answer>"])
    sid = (await pipeline.create(SessionSpec())).session_id
    await pipeline.turn(sid, "Hi", "trace-turn")
    found = await open_runs(store.url, store.other_data_dir()).get("trace-turn")
    assert found is not None
    record, events = found
    assert (record.kind, record.status, record.strategy) == ("session", "ok", "session") and record.completion_tokens > 0
    assert "LLM_INVOCATION" in [e["type"] for e in events]


def test_counters_add_up_per_window(store):
    c = open_counters(store.url, store.data_dir)
    now = time.time() // 60 * 60 + 1  # the start of a current window: ended windows are pruned by the clock
    assert c.add("rate:alice", 1, window_s=60, now=now) == 1
    assert c.add("rate:alice", 2, window_s=60, now=now + 10) == 3
    assert c.add("rate:alice", 1, window_s=60, now=now + 60) == 1  # the next window starts from zero
    assert c.add("tokens:alice", 500) == 500 and c.add("tokens:alice", 250) == 750
    other = open_counters(store.url, store.other_data_dir())
    assert other.get("rate:alice", window_s=60, now=now + 61) == 1 and other.get("tokens:alice") == 750
    assert other.get("rate:bob", window_s=60, now=now) == 0


def test_ownership_is_claimed_once_shared_read_only_and_seen_by_another_process(store):
    table = open_ownership(store.url, store.data_dir)
    assert table.get("workspace", "w") is None
    assert table.claim("workspace", "w", "alice") and table.claim("workspace", "w", "alice")
    assert not table.claim("workspace", "w", "bob")
    table.claim("session", "s1", "bob")
    table.share("workspace", "w", ["carol", "carol"])
    other = open_ownership(store.url, store.other_data_dir())
    assert other.get("workspace", "w") == {"owner": "alice", "readers": ["carol"]}
    assert other.readable("workspace", "carol") == ["w"] and other.readable("workspace", "bob") == []
    assert other.owned("workspace") == {"w"} and other.owned("session") == {"s1"}
    other.drop("workspace", "w")
    assert open_ownership(store.url, store.data_dir).get("workspace", "w") is None


def test_token_budgets_outlive_the_limiter_and_are_shared_through_the_store(store):
    keyed = [("alice", {"tokens_per_day": 1000, "tokens_per_minute": 10**6})]
    first = RateLimiter(budgets=TokenBudgets(open_counters(store.url, store.data_dir)))
    first.finish(["alice"], first.admit(keyed, run=True)["run_id"], tokens=1200)
    # a limiter started afterwards (the actor restarted, or another cluster on the same store) sees the charge
    later = RateLimiter(budgets=TokenBudgets(open_counters(store.url, store.other_data_dir())))
    assert later.admit(keyed, run=True)["limit_name"] == "tokens_per_day"
    assert later.usage("alice")["tokens_today"] == 1200 and later.usage("bob")["tokens_today"] == 0


# -- PostgreSQL only: migrations and connection loss ------------------------------------------------------------


def test_migrating_again_applies_nothing(postgres):
    from reasonray.stores.postgres import migrate, pg_store

    pg_store(postgres.url)
    assert migrate(postgres.url) == []


async def test_a_restart_of_the_database_is_ridden_out(postgres, tmp_path):
    repo = open_sessions(SessionState, postgres.url, tmp_path)
    pipeline = SessionPipeline(repo, ScriptedLLM([]), builtin_toolbox(), data_dir=tmp_path)
    sid = (await pipeline.create(SessionSpec())).session_id
    cards = open_cards(AgentCard, postgres.url, tmp_path)
    cards.put(card("before"))  # the synchronous path (`PgStore.blocking`) has its pool too
    postgres.stop()  # every pooled connection breaks
    restarted = threading.Timer(0.5, postgres.start)
    restarted.start()
    started = time.monotonic()
    try:
        state = await repo.load(sid)  # retried until the server is back
    finally:
        restarted.join()
    try:
        assert state is not None and state.session_id == sid and time.monotonic() - started < 30
        assert "before" in cards.all()  # its broken connection is replaced as well
    finally:
        # the pool of this test's event loop, closed with the test: left to the loop's closing, a worker of the
        # pool that reconnected through the restart once kept the loop from closing
        from reasonray.stores.postgres import pg_store

        await pg_store(postgres.url).aclose()


def test_an_unreachable_database_is_a_config_error_naming_it(tmp_path):
    from reasonray.gateway.simulator.server import free_port
    from reasonray.kernel.config import ConfigError
    from reasonray.stores.postgres import PgStore

    with pytest.raises(ConfigError, match=r"\[store\] url: cannot connect to PostgreSQL at reasonray@127.0.0.1:\d+/nowhere"):
        PgStore(f"postgresql://reasonray:secret@127.0.0.1:{free_port()}/nowhere", timeout_s=2)


async def test_with_a_store_the_audit_log_is_its_table_and_nothing_is_written_to_the_data_directory(postgres, tmp_path):
    from reasonray.stores.postgres import pg_store

    await pg_store(postgres.url).fetch("TRUNCATE audit_log")
    record = AuditRecord(
        principal="alice", roles=["reasoner"], method="session.get", target="session:s1", outcome="forbidden", trace_id="t1"
    )
    await open_audit(postgres.url, tmp_path / "node-a").write(record)
    [(action, detail)] = await pg_store(postgres.url).fetch("SELECT action, detail FROM audit_log WHERE principal = 'alice'")
    assert action == "session.get"
    assert detail == {"roles": ["reasoner"], "target": "session:s1", "outcome": "forbidden", "trace_id": "t1"}
    assert not (tmp_path / "node-a").exists()


async def test_the_file_audit_log_is_private_to_its_owner_and_makes_its_directory(tmp_path):
    data_dir = tmp_path / "not" / "yet" / "there"
    log = open_audit(None, data_dir)
    await log.write(AuditRecord(at=datetime(2026, 1, 1, tzinfo=UTC), principal="alice", method="agent.register", outcome="ok"))
    path = data_dir / "audit" / "audit.jsonl"
    assert path.exists() and path.stat().st_mode & 0o777 == 0o600  # who did what is nobody else's to read
    assert AuditRecord.model_validate_json(path.read_text()).method == "agent.register"


def test_windows_start_on_multiples_of_their_length():
    assert window_start(None, 12_345.0) == 0  # no window: one bucket forever
    assert window_start(60, 12_345.9) == 12_300 and window_start(60, 12_300.0) == 12_300
    assert window_start(86_400, 1.5) == 0
    assert window_start(60, None) == int(time.time() // 60) * 60


def test_an_event_log_directory_removed_after_use_is_made_again(tmp_path):
    """A node's data directory wiped (or swept) while the process runs: later runs still write their event logs."""
    import shutil

    first = event_log_path(tmp_path / "data", "trace-a")
    recorder = EventRecorder(first, keep=False)
    recorder(RunEnd(trace_id="trace-a", strategy="chain_of_thought", status="ok", total_tokens=1, execution_time_ms=1))
    recorder.close()
    shutil.rmtree(tmp_path / "data")
    second = event_log_path(tmp_path / "data", "trace-b")
    recorder = EventRecorder(second, keep=False)
    recorder(RunEnd(trace_id="trace-b", strategy="chain_of_thought", status="ok", total_tokens=1, execution_time_ms=1))
    recorder.close()
    assert second.exists() and not first.exists()


# -- files only: the counters' SQLite file ----------------------------------------------------------------------


def _charge_from_another_process(data_dir: str, times: int) -> None:
    c = open_counters(None, Path(data_dir))
    for _ in range(times):
        c.add("tokens:alice", 1, window_s=86_400)


def test_counters_from_many_processes_lose_no_charge(tmp_path):
    """Replicas and the limiter actor of one machine charge the same file at once: every addition counts."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_charge_from_another_process, args=(str(tmp_path), 200)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    assert open_counters(None, tmp_path).get("tokens:alice", window_s=86_400) == 800
    assert (tmp_path / "counters.sqlite3").stat().st_mode & 0o777 == 0o600


def test_counters_of_an_earlier_json_file_carry_over_once_and_ended_windows_are_pruned(tmp_path):
    import json

    now = time.time() // 60 * 60 + 1
    old = {
        "tokens:alice": {"window_start": 0, "value": 750, "expires": now + 10**9},
        "rate:bob": {"window_start": int(now - 1), "value": 3, "expires": now + 59},
    }
    (tmp_path / "counters.json").write_text(json.dumps(old))
    c = open_counters(None, tmp_path)
    assert c.add("tokens:alice", 50) == 800 and c.get("rate:bob", window_s=60, now=now) == 3
    assert not (tmp_path / "counters.json").exists()  # imported once, then gone
    c.add("rate:carol", 1, window_s=60, now=now + 3600)  # an hour later: the ended windows go
    import sqlite3

    keys = {row[0] for row in sqlite3.connect(tmp_path / "counters.sqlite3").execute("SELECT key FROM counters")}
    assert keys == {"tokens:alice", "rate:carol"}


# -- A2A tasks and conversations ---------------------------------------------------------------------------------


def a2a_repository(store: Store, data_dir: Path | None = None):
    return open_a2a(store.url, (data_dir or store.data_dir) / "sessions")


async def test_a2a_tasks_are_their_owners_alone_and_list_newest_first_in_pages(store):
    repo = a2a_repository(store)
    for i, (context, state) in enumerate([("c1", 3), ("c1", 4), ("c2", 3), ("c1", 3)]):
        assert await repo.save_a2a_task(f"t{i}", "alice", context, state, 1000 + i, {"id": f"t{i}", "n": i})
    assert not await repo.save_a2a_task("t0", "bob", "c9", 3, 5000, {"id": "t0", "n": "bob's"})  # not his to overwrite
    assert await repo.save_a2a_task("t0", "alice", "c1", 3, 1000, {"id": "t0", "n": 0, "again": True})
    other = a2a_repository(store, store.other_data_dir())  # another process, same store
    assert await other.a2a_task("t0", "alice") == {"id": "t0", "n": 0, "again": True}
    assert await other.a2a_task("t0", "bob") is None and await other.a2a_task("t0", None) is None

    def ids(page):
        return [t["id"] for t in page[0]], page[1]

    everything = {"limit": 10}
    assert ids(await other.a2a_tasks(TaskQuery("alice", **everything))) == (["t3", "t2", "t1", "t0"], 4)
    assert ids(await other.a2a_tasks(TaskQuery("alice", **everything | {"context_id": "c1", "state": 3}))) == (["t3", "t0"], 2)
    assert ids(await other.a2a_tasks(TaskQuery("alice", **everything | {"since_ns": 1002}))) == (["t3", "t2"], 2)
    first = await other.a2a_tasks(TaskQuery("alice", **everything | {"limit": 2}))
    assert ids(first) == (["t3", "t2"], 4)
    assert ids(await other.a2a_tasks(TaskQuery("alice", **everything | {"limit": 2, "after": (1002, "t2")}))) == (["t1", "t0"], 4)
    assert await other.a2a_tasks(TaskQuery("bob", **everything)) == ([], 0)

    await other.delete_a2a_task("t1", "bob")  # not his: nothing happens
    assert await repo.a2a_task("t1", "alice") is not None
    await other.delete_a2a_task("t1", "alice")
    assert await repo.a2a_task("t1", "alice") is None


async def test_an_a2a_conversation_is_saved_only_over_the_version_it_was_loaded_at(store):
    repo, other = a2a_repository(store), a2a_repository(store, store.other_data_dir())
    assert await repo.load_a2a_conversation("a2a-x") is None
    assert await repo.save_a2a_conversation("a2a-x", "alice", "c1", [{"session_id": "s-1"}], 0)
    assert not await other.save_a2a_conversation("a2a-x", "alice", "c1", [{"session_id": "s-2"}], 0)  # lost the race
    assert await other.load_a2a_conversation("a2a-x") == ([{"session_id": "s-1"}], 1)
    assert await other.save_a2a_conversation("a2a-x", "alice", "c1", [{"session_id": "s-1"}, {"turn": 2}], 1)
    assert not await repo.save_a2a_conversation("a2a-x", "alice", "c1", [], 1)  # stale
    assert await repo.load_a2a_conversation("a2a-x") == ([{"session_id": "s-1"}, {"turn": 2}], 2)


async def test_a2a_records_of_earlier_json_files_are_imported_once(tmp_path):
    import json

    root = tmp_path / "sessions" / "a2a"
    (root / "tasks").mkdir(parents=True)
    (root / "contexts").mkdir()
    task = {"owner": "alice", "context_id": "c1", "state": 3, "status_ns": 7, "task": {"id": "t-old"}}
    (root / "tasks" / "t-old.json").write_text(json.dumps(task))
    conversation = {"owner": "alice", "context_id": "c1", "version": 2, "exchanges": [{"session_id": "s-1"}]}
    (root / "contexts" / "a2a-old.json").write_text(json.dumps(conversation))
    repo = open_a2a(None, tmp_path / "sessions")
    assert await repo.a2a_task("t-old", "alice") == {"id": "t-old"}
    assert await repo.load_a2a_conversation("a2a-old") == ([{"session_id": "s-1"}], 2)
    assert (root / "a2a.sqlite3").stat().st_mode & 0o777 == 0o600
