"""Caps that need no cluster: session history and retention, the calculator, strategy caps and the
HTTP body rules, each failing with a message naming its config key."""

import asyncio
import json
import time
from datetime import UTC, datetime

import pytest

from reasonray.api.access.caps import check_strategy_config
from reasonray.api.app import Backends, build_application
from reasonray.api.surfaces.guard import GuardSettings, Refusal, check_body, check_host, check_post_headers
from reasonray.gateway.arithmetic import evaluate
from reasonray.gateway.testing import FunctionLLM
from reasonray.kernel.config import CapSettings, ReasoningSettings, Settings
from reasonray.kernel.errors import InvalidParamsError, SessionStateError
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import SessionSpec, SessionState
from reasonray.stores.sessions import SqliteSessionStore
from tests.unit.memory_harness import local_memory, make_bank


def stored_state(sid: str, **changes) -> SessionState:
    now = datetime.now(UTC)
    return SessionState(session_id=sid, status="idle", created_at=now, updated_at=now, spec=SessionSpec(), providers={}, **changes)


async def test_old_sessions_are_swept_and_recent_ones_kept(tmp_path):
    repo = SqliteSessionStore(SessionState, tmp_path, retention_days=1)
    for sid in ("old", "recent"):
        await repo.save(stored_state(sid))
    assert repo.sweep(now=time.time() + 0.5 * 86400) == 0  # half a day later: both kept
    # "recent" is written again a day and a half later; two days after the first writes only "old" is past a day
    repo._db.run(lambda db: db.execute("UPDATE sessions SET written_at = written_at + 1.5 * 86400 WHERE session_id = 'recent'"))
    assert repo.sweep(now=time.time() + 2 * 86400) == 1
    assert await repo.load("old") is None and await repo.load("recent") is not None
    assert SqliteSessionStore(SessionState, tmp_path, retention_days=None).sweep(now=time.time() + 10**6) == 0


def test_a_trimmed_history_keeps_the_cap_and_starts_with_no_half_of_a_tool_exchange():
    from reasonray.gateway.protocol import Message, ToolCall
    from reasonray.reasoner.session import trim_history

    call = Message(role="assistant", tool_calls=(ToolCall(id="c1", name="calculator", arguments="{}"),))
    history = [Message(role="user", content="q1"), call, Message(role="tool", content="4", tool_call_id="c1")]
    history += [Message(role="assistant", content="4"), Message(role="user", content="q2"), Message(role="assistant", content="5")]
    trim_history(history, 4)  # the newest four begin with the tool result of a call that was cut: it goes too
    assert [m.content for m in history] == ["4", "q2", "5"] and history[0].role == "assistant"
    trim_history(history, 2)
    assert [m.content for m in history] == ["q2", "5"]


def test_the_calculator_bounds_results_before_computing():
    started = time.perf_counter()
    with pytest.raises(ValueError, match="cap is 10000"):
        evaluate("(((9**64)**64)**64)**64")
    with pytest.raises(ValueError, match="cap"):
        evaluate("(10**64)**64 * (10**64)**64 * (10**64)**64")  # products are bounded too
    assert time.perf_counter() - started < 0.5
    assert evaluate("2 ** 64") == 18446744073709551616


@pytest.mark.parametrize(
    ("strategy", "config", "key"),
    [
        ("self_consistency", {"samples": 11}, "max_samples"),
        ("chain_of_thought", {"max_tokens": 262_144}, "max_tokens"),
        ("tree_of_thought", {"max_nodes": 500}, "max_tree_nodes"),
        ("tree_of_thought", {"votes": 8}, "max_tree_votes"),
        ("refine", {"max_iterations": 51}, "max_iterations"),
        ("matts", {"k": 5, "base_strategy": "refine", "base_config": {"max_iterations": 10}}, "max_matts_work"),
    ],
)
def test_strategy_caps_name_their_key(strategy, config, key):
    with pytest.raises(InvalidParamsError, match=rf"\[limits\] {key}") as caught:
        check_strategy_config(strategy, config, CapSettings())
    assert caught.value.data["cap"] == f"limits.{key}"


def test_within_the_caps_nothing_is_refused():
    check_strategy_config("matts", {"k": 3, "base_strategy": "refine", "base_config": {"max_iterations": 10}}, CapSettings())


def test_the_front_door_rules():
    guard = GuardSettings()
    check_host({"host": "127.0.0.1:8000"}, guard)
    check_host({"host": "[::1]:8000"}, guard)
    for host in ("evil.example", "127.0.0.1.evil.example:80", ""):
        with pytest.raises(Refusal) as caught:
            check_host({"host": host}, guard)
        assert caught.value.status == 400 and "allowed_hosts" in caught.value.message
    with pytest.raises(Refusal) as caught:
        check_post_headers({"content-type": "text/plain", "content-length": "10"}, guard)
    assert caught.value.status == 415
    with pytest.raises(Refusal) as caught:
        check_post_headers({"content-type": "application/json"}, guard)
    assert caught.value.status == 411
    with pytest.raises(Refusal) as caught:
        check_post_headers({"content-type": "application/json; charset=utf-8", "content-length": "2000000"}, guard)
    assert caught.value.status == 413 and "max_body_bytes" in caught.value.message
    for body in (
        b"[" * 100_000,
        json.dumps({"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}).encode(),
        b'{"id": "\\ud800"}',
    ):
        with pytest.raises(Refusal) as caught:
            check_body(body, guard)
        assert caught.value.status == 400 and caught.value.code == -32600
    check_body(b"{oops", guard)  # not JSON: the route answers -32700 itself


def test_the_calculator_cap_is_the_configured_one():
    assert CapSettings().max_calculator_digits == 10_000
    with pytest.raises(ValueError, match=r"cap is 30 \(\[limits\] max_calculator_digits"):
        evaluate("10 ** 40", max_result_digits=30)
    small = builtin_toolbox(max_calculator_digits=30).select(["calculator"])[0]
    with pytest.raises(ValueError, match="max_calculator_digits"):
        small.fn(expression="10 ** 40")
    assert builtin_toolbox().select(["calculator"])[0].fn(expression="10 ** 40") == str(10**40)


QUERY_METHODS = {
    "reasoning.execute": "query",
    "reasoning.bounded_context": "query",
    "solve_coding_task": "task",
}


@pytest.mark.parametrize("method", sorted(QUERY_METHODS))
@pytest.mark.parametrize("cap", [40, 150_000])
def test_the_configured_query_cap_is_the_one_enforced(method, cap, tmp_path):
    # the schemas once hard-coded 50k/100k: a larger cap had no effect and a refusal did not name the key
    settings = Settings(
        reasoning=ReasoningSettings(
            enabled_strategies=["chain_of_thought", "bounded_context", "refine", "matts"], default_strategy="chain_of_thought"
        ),
        limits=CapSettings(max_query_chars=cap),
    )
    app = build_application(
        settings,
        llm=FunctionLLM(lambda request: "<answer>4</answer>"),
        data_dir=None,
        backends=Backends(cache=None, memory=local_memory(make_bank(tmp_path))),
    )
    field = QUERY_METHODS[method]

    def call(length: int) -> dict:
        body = {"jsonrpc": "2.0", "method": method, "params": {field: "2+2 " + "x" * (length - 4)}, "id": 1}
        return asyncio.run(app.dispatcher.handle(json.dumps(body)))[0]

    refused = call(cap + 1)["error"]
    assert refused["code"] == -32602 and "[limits] max_query_chars" in refused["message"], refused
    assert refused["data"]["cap"] == "limits.max_query_chars"
    within = call(min(cap, 120_000))
    # accepted: bounded_context may still find a long query too large for its chunk, which is its own check
    assert "result" in within or "context size exceeded" in within["error"]["message"], within


async def test_a_session_saved_from_a_stale_version_is_refused_and_the_newer_one_kept(tmp_path):
    first, second = (
        SqliteSessionStore(SessionState, tmp_path),
        SqliteSessionStore(SessionState, tmp_path),
    )  # two processes' views of one file
    await first.save(stored_state("s1", turn=1))
    with pytest.raises(SessionStateError, match="stale"):
        await second.save(stored_state("s1", turn=9))  # made anew elsewhere: version 0 again
    loaded = await second.load("s1")
    assert loaded is not None and loaded.version == 1 and loaded.turn == 1
    await second.save(loaded.model_copy(update={"turn": 2}))
    with pytest.raises(SessionStateError, match="stale"):
        await first.save(loaded.model_copy(update={"turn": 3}))  # loaded at version 1, saved since
    again = await first.load("s1")
    assert again is not None and (again.version, again.turn) == (2, 2)


async def test_sessions_an_earlier_version_kept_as_files_are_imported_once(tmp_path):
    kept = stored_state("s-old", turn=4, version=3)
    (tmp_path / "s-old.json").write_text(kept.model_dump_json())
    (tmp_path / ".s-old.lock").write_text("")
    (tmp_path / "notes.json").write_text('{"not": "a session"}')  # left where it is
    repo = SqliteSessionStore(SessionState, tmp_path)
    loaded = await repo.load("s-old")
    assert loaded is not None and (loaded.version, loaded.turn) == (3, 4)
    assert not (tmp_path / "s-old.json").exists() and not (tmp_path / ".s-old.lock").exists()
    assert (tmp_path / "notes.json").exists()
