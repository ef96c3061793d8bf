"""The session turn reasoner in-process with strict scripted models: the tool loop, the hand-off of client
tool calls and their verified re-entry, mode switches and the turn's trace, and the failure policy,
persistence and isolation around it."""

import asyncio
import json
import re

import pytest

from reasonray.gateway.protocol import ToolCall
from reasonray.gateway.testing import FunctionLLM, ScriptedLLM
from reasonray.kernel.errors import (
    InvalidParamsError,
    MaxLLMCallsError,
    NotFoundError,
    ReentryError,
    SessionStateError,
    ToolFailedError,
    UnregisteredToolError,
)
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.providers import SubmittedResult
from reasonray.reasoner.session import (
    SessionPipeline,
    Sessions,
    SessionSpec,
    SessionState,
)
from reasonray.reasoner.tools import ToolBox, server_tool
from reasonray.stores.sessions import SqliteSessionStore
from tests.client_tools import HANDED_OFF_THEN_RESUMED, WEATHER


def call(id, name, **arguments):
    return ToolCall(id=id, name=name, arguments=json.dumps(arguments))


def pipeline(tmp_path, llm, toolbox=None, **kw):
    return SessionPipeline(
        SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, toolbox or builtin_toolbox(), data_dir=tmp_path, **kw
    )


async def session(p, **spec):
    return (await p.create(SessionSpec.model_validate({"server_tools": ["calculator"], "client_tools": [WEATHER], **spec}))).session_id


def steps(result):
    return [s["type"] for s in result.trace]


async def test_normal_turn_completion(tmp_path):
    llm = ScriptedLLM(["<thinking>easy</thinking><answer>Hello!</answer>"])
    p = pipeline(tmp_path, llm)
    sid = await session(p)
    result = await p.turn(sid, "Hi", "t1")
    llm.assert_complete()
    assert result.status == "completed" and result.answer == "Hello!" and result.turn == 1
    assert steps(result) == ["TURN_STARTED", "LLM_CALL", "EXIT"] and result.trace[-1]["exit_mode"] == 1
    state = await Sessions(p).get(sid)
    assert state["status"] == "idle" and state["messages"] == 2 and state["last_answer"] == "Hello!"
    [request] = llm.requests
    assert {t["function"]["name"] for t in request.tools} == {"calculator", "get_weather"}


async def test_server_tool_continuation_feeds_the_result_to_the_next_call(tmp_path):
    llm = ScriptedLLM([call("c1", "calculator", expression="17 * 23"), "<answer>391</answer>"])
    p = pipeline(tmp_path, llm)
    result = await p.turn(await session(p), "17*23?", "t1")
    assert result.answer == "391" and result.llm_calls == 2
    assert steps(result) == ["TURN_STARTED", "LLM_CALL", "TOOL_EXECUTED", "LLM_CALL", "EXIT"]
    second = llm.requests[1].messages
    assert second[-2].role == "assistant" and second[-2].tool_calls[0].id == "c1"
    assert second[-1].role == "tool" and second[-1].tool_call_id == "c1" and second[-1].content == "391"


async def test_mid_turn_mode_change_applies_from_the_next_call_and_changes_tools(tmp_path):
    llm = ScriptedLLM([call("m1", "mode_state_change", mode="act"), call("c1", "python", code="print(6*7)"), "<answer>42</answer>"])
    p = pipeline(tmp_path, llm)
    created = await p.create(
        SessionSpec.model_validate(
            {
                "mode": "plan",
                "server_tools": ["calculator", "python"],
                "modes": {
                    "plan": {"instructions": "Plan only.", "tools": ["calculator"]},
                    "act": {"instructions": "Act now.", "tools": ["python"], "bootstrap": "You may now run code."},
                },
            }
        )
    )
    sid = created.session_id
    result = await p.turn(sid, "Compute 6*7 in code", "t1")
    assert result.answer == "42" and result.mode == "act"
    tools = [{t["function"]["name"] for t in r.tools} for r in llm.requests]
    assert tools == [{"calculator", "mode_state_change"}, {"python", "mode_state_change"}, {"python", "mode_state_change"}]
    assert "Current mode: plan." in llm.requests[0].messages[0].content
    assert "Current mode: act.\nAct now." in llm.requests[1].messages[0].content
    bootstraps = [[m.content for m in r.messages if m.role == "system" and "run code" in m.content] for r in llm.requests]
    assert bootstraps == [[], ["You may now run code."], []]  # armed by the mode change, emitted once
    change = next(s for s in result.trace if s["type"] == "MODE_CHANGE")
    assert (change["previous"], change["mode"]) == ("plan", "act")
    assert (await Sessions(p).get(sid))["mode"] == "act"  # the mode persists for the next turn


async def test_turn_context_is_emitted_once_and_session_context_every_call(tmp_path):
    llm = ScriptedLLM([call("c1", "calculator", expression="1+1"), "<answer>2</answer>", "<answer>again</answer>"])
    p = pipeline(tmp_path, llm)
    sid = await session(p, bootstrap="Welcome to the session.")
    await p.turn(sid, "1+1?", "t1")
    await p.turn(sid, "again?", "t2")
    welcome = [any(m.content == "Welcome to the session." for m in r.messages) for r in llm.requests]
    assert welcome == [True, False, False]
    assert all(r.messages[0].role == "system" and "helpful assistant" in r.messages[0].content for r in llm.requests)
    third = [m.content for m in llm.requests[2].messages if m.role in ("user", "assistant") and m.content]
    assert third == ["1+1?", "2", "again?"]  # the conversation persists; the first turn's tool round does not


async def test_thinking_is_never_carried_into_a_later_call(tmp_path):
    llm = ScriptedLLM(["<thinking>secret plan</thinking><answer>A</answer>", "<answer>B</answer>"])
    p = pipeline(tmp_path, llm)
    sid = await session(p)
    await p.turn(sid, "first", "t1")
    await p.turn(sid, "second", "t2")
    assert not any("secret plan" in (m.content or "") for m in llm.requests[1].messages)
    assert [m.content for m in llm.requests[1].messages if m.role == "assistant"] == ["A"]


async def test_exit_mode_2_hands_off_and_a_restarted_pipeline_continues(tmp_path):
    llm = ScriptedLLM(
        [
            call("c1", "calculator", expression="2+3"),
            call("w1", "get_weather", city="Paris"),
            "<thinking>ok</thinking><answer>Sunny in Paris</answer>",
        ]
    )
    sid = await session(pipeline(tmp_path, llm))
    first = await pipeline(tmp_path, llm).turn(sid, "Weather?", "t1")
    assert first.status == "awaiting_client_tools" and first.answer is None
    assert first.pending_tool_calls == [{"tool_call_id": "w1", "name": "get_weather", "arguments": {"city": "Paris"}}]
    assert steps(first)[-3:] == ["LLM_CALL", "CLIENT_TOOL_PENDING", "EXIT"] and first.trace[-1]["exit_mode"] == 2
    with pytest.raises(SessionStateError, match=r"waiting for the results of client tool calls w1; send them with session.resume"):
        await pipeline(tmp_path, llm).turn(sid, "another question", "t2")
    restarted = pipeline(tmp_path, llm)  # a new process: everything comes from the repository
    final = await restarted.resume(sid, [SubmittedResult("w1", "Sunny, 21 C")], "t3")
    llm.assert_complete()
    assert final.status == "completed" and final.answer == "Sunny in Paris" and final.llm_calls == 3
    assert steps(final) == HANDED_OFF_THEN_RESUMED
    assert llm.requests[2].messages[-1].role == "tool" and llm.requests[2].messages[-1].content == "Sunny, 21 C"


@pytest.mark.parametrize(
    ("results", "message", "data"),
    [
        ([], "no result for pending call(s) w1", {"missing": ["w1"], "unexpected": [], "mismatched": []}),
        ([("w1", "ok"), ("zz", "?")], "results for unknown call id(s) zz", {"missing": [], "unexpected": ["zz"], "mismatched": []}),
        (
            [("w1", "ok"), ("w1", "again")],
            "results for call(s) w1 that are not pending",
            {"missing": [], "unexpected": [], "mismatched": ["w1"]},
        ),
        (
            [("c1", "5"), ("w1", "ok")],
            "results for call(s) c1 that are not pending",
            {"missing": [], "unexpected": [], "mismatched": ["c1"]},
        ),
    ],
)
async def test_reentry_verification_failures_are_hard_and_change_nothing(tmp_path, results, message, data):
    llm = ScriptedLLM([call("c1", "calculator", expression="2+3"), call("w1", "get_weather", city="Paris"), "<answer>done</answer>"])
    p = pipeline(tmp_path, llm)
    sid = await session(p)
    await p.turn(sid, "Weather?", "t1")
    with pytest.raises(ReentryError, match=re.escape(message)) as err:
        await p.resume(sid, [SubmittedResult(i, c) for i, c in results], "t2")
    assert {k: err.value.data[k] for k in data} == data
    assert err.value.message.startswith(f"session {sid!r}, turn 1: ") and err.value.data["session_id"] == sid
    assert "Send exactly one result per pending tool_call_id" in err.value.message
    assert (await Sessions(p).get(sid))["status"] == "awaiting_client_tools"  # nothing was lost: the right results still work
    assert (await p.resume(sid, [SubmittedResult("w1", "sunny")], "t3")).answer == "done"


async def test_resume_without_pending_calls_and_unknown_sessions_are_refused(tmp_path):
    p = pipeline(tmp_path, ScriptedLLM([]))
    sid = await session(p)
    with pytest.raises(SessionStateError, match=r"has no pending client tool calls; send a new turn with session.turn"):
        await p.resume(sid, [SubmittedResult("x", "y")], "t1")
    with pytest.raises(NotFoundError, match=r"no session 'nope1234'; create one with session.create"):
        await p.turn("nope1234", "hi", "t1")
    await p.close(sid)
    with pytest.raises(SessionStateError, match="is closed"):
        await p.turn(sid, "hi", "t2")
    assert (await Sessions(p).get(sid))["status"] == "closed"


async def test_an_unregistered_tool_is_a_hard_error_and_the_turn_ends(tmp_path):
    llm = ScriptedLLM([call("x1", "rm_rf", path="/")])
    p = pipeline(tmp_path, llm)
    sid = await session(p)
    with pytest.raises(UnregisteredToolError, match="the model called 'rm_rf', not available in mode 'default'") as err:
        await p.turn(sid, "clean up", "t1")
    assert err.value.data["tool_call_ids"] == ["x1"]
    state = await Sessions(p).get(sid)
    assert state["status"] == "idle" and state["last_error"]["error_type"] == "UnregisteredToolError"


async def test_the_first_failing_tool_ends_the_turn(tmp_path):
    llm = ScriptedLLM([(call("c1", "calculator", expression="1/0"), call("c2", "calculator", expression="1+1"))])
    p = pipeline(tmp_path, llm)
    sid = await session(p)
    with pytest.raises(ToolFailedError, match=r"tool 'calculator' \(call c1\) failed, which ends the turn: ValueError: division by zero"):
        await p.turn(sid, "divide", "t1")
    trace = (await Sessions(p).get(sid))["trace"]
    executed = [s for s in trace if s["type"] == "TOOL_EXECUTED"]
    assert [(s["tool_call_id"], s["status"]) for s in executed] == [("c1", "failed")]  # c2 never ran
    llm.assert_complete()


async def test_a_client_tool_error_ends_the_turn_too(tmp_path):
    llm = ScriptedLLM([call("w1", "get_weather", city="Atlantis")])
    p = pipeline(tmp_path, llm)
    sid = await session(p)
    await p.turn(sid, "Weather?", "t1")
    with pytest.raises(ToolFailedError, match="client tool 'get_weather' \\(call w1\\) reported an error"):
        await p.resume(sid, [SubmittedResult("w1", "no such city", is_error=True)], "t2")
    assert (await Sessions(p).get(sid))["status"] == "idle"


async def test_the_llm_call_limit_is_enforced_per_turn(tmp_path):
    llm = FunctionLLM(lambda req: call(f"c{len(req.messages)}", "calculator", expression="1+1"))
    p = pipeline(tmp_path, llm)
    sid = await session(p, max_llm_calls=3)
    with pytest.raises(MaxLLMCallsError, match="made 3 LLM calls without a final answer \\(limit 3\\)"):
        await p.turn(sid, "loop forever", "t1")
    assert len(llm.requests) == 3


async def test_concurrent_sessions_never_see_each_others_state(tmp_path):
    def echo(request):
        users = [m.content for m in request.messages if m.role == "user"]
        return f"<answer>{' | '.join(users)}</answer>"

    llm = FunctionLLM(echo)
    p = pipeline(tmp_path, llm)
    a, b = await session(p), await session(p)
    for round_ in range(3):
        ra, rb = await asyncio.gather(p.turn(a, f"a{round_}", f"ta{round_}"), p.turn(b, f"b{round_}", f"tb{round_}"))
        assert ra.answer == " | ".join(f"a{i}" for i in range(round_ + 1))
        assert rb.answer == " | ".join(f"b{i}" for i in range(round_ + 1))


async def test_a_failed_save_leaves_the_previous_state(tmp_path, monkeypatch):
    llm = ScriptedLLM(["<answer>one</answer>", "<answer>two</answer>"])
    p = pipeline(tmp_path, llm)
    sid = await session(p)
    await p.turn(sid, "first", "t1")
    store = p.repository
    before = await store.load(sid)
    # the disk is full: the database may not grow by a page (the second turn's state needs several more)
    pages = store._db.run(lambda db: db.execute("PRAGMA page_count").fetchone()[0])
    store._db.run(lambda db: db.execute(f"PRAGMA max_page_count = {pages}"))
    with pytest.raises(OSError, match=r"could not be saved.*full"):
        await p.turn(sid, "second " + "x" * 20_000, "t2")
    assert await store.load(sid) == before


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"server_tools": ["teleport"]}, r"unknown server tools \['teleport'\]; available: calculator, python"),
        ({"mode": "act", "modes": {"plan": {}}}, "mode 'act' is not one of the modes given"),
        ({"server_tools": ["calculator"], "client_tools": [{"function": {"name": "calculator"}}]}, "tool names must be unique"),
        ({"modes": {"default": {"tools": ["ghost"]}}}, r"mode 'default' lists tools the session does not have: \['ghost'\]"),
    ],
)
async def test_session_specs_are_validated_with_clear_messages(tmp_path, spec, message):
    with pytest.raises((InvalidParamsError, ValueError), match=message):
        await pipeline(tmp_path, ScriptedLLM([])).create(SessionSpec.model_validate(spec))


async def test_a_tool_is_one_decorated_typed_function(tmp_path):
    @server_tool
    async def shout(text: str, times: int = 1) -> str:
        """Upper-case the text."""
        return (text.upper() + " ") * times

    schema = shout.schema()["function"]
    assert schema["description"] == "Upper-case the text."
    assert schema["parameters"]["required"] == ["text"] and schema["parameters"]["properties"]["times"]["default"] == 1
    llm = ScriptedLLM([call("s1", "shout", text="hi", times="two"), "<answer>x</answer>"])
    p = pipeline(tmp_path, llm, toolbox=ToolBox([shout]))
    sid = (await p.create(SessionSpec(server_tools=["shout"]))).session_id
    with pytest.raises(ToolFailedError, match="arguments for shout: times: Input should be a valid integer"):
        await p.turn(sid, "shout", "t1")


LESSON = "<memory><title>Check the forecast source</title><description>One sentence.</description><content>Say where the forecast came from.</content></memory>"
LONG_ANSWER = "Sunny in Paris this afternoon, 21 C, light wind from the west; the forecast comes from the client's weather tool."


def passive_pipeline(tmp_path, llm, memory=None):
    from reasonray.kernel.config import MemorySettings
    from reasonray.memory.loop import MemoryLoop
    from tests.unit.memory_harness import local_memory, make_bank

    bank = make_bank(tmp_path / "bank")
    loop = MemoryLoop(memory or local_memory(bank), MemorySettings(passive_learning=True))
    return pipeline(tmp_path, llm, passive=loop), bank


async def test_passive_learning_captures_a_completed_turn_after_the_hand_off_into_the_bank_and_the_trace(tmp_path):
    llm = ScriptedLLM([call("w1", "get_weather", city="Paris"), f"<answer>{LONG_ANSWER}</answer>", LESSON])
    p, bank = passive_pipeline(tmp_path, llm)
    sid = await session(p)
    handed_off = await p.turn(sid, "What is the weather in Paris today?", "t1")
    assert handed_off.status == "awaiting_client_tools" and handed_off.memory is None  # no answer yet: nothing to learn
    final = await p.resume(sid, [SubmittedResult("w1", "Sunny, 21 C")], "t2")
    llm.assert_complete()
    assert final.answer == LONG_ANSWER and final.memory.passive == "captured"
    assert final.memory.task_id == f"{sid}-turn-1" and final.memory.workspace == "default"
    [stored] = final.memory.stored
    item = bank.get(stored, workspace="default")
    assert item.source_type == "passive" and item.title == "Check the forecast source"
    assert "Question:\nWhat is the weather in Paris today?" in llm.requests[2].messages[1].content  # the turn's own message
    assert steps(final)[-2:] == ["EXIT", "MEMORY_LEARNING"] and final.trace[-1]["source"] == "passive"
    assert final.llm_calls == 2  # learning does not count against the turn's LLM call limit
    saved = await Sessions(p).get(sid)
    assert saved["trace"] == final.trace and saved["status"] == "idle" and saved["last_answer"] == LONG_ANSWER


async def test_passive_learning_skips_short_answers_and_never_fails_or_loses_the_turn(tmp_path):
    class Broken:  # a MemoryClient whose store is gone (the calls passive learning makes)
        async def store_items(self, items, workspace, keys=None):
            raise ConnectionError("chroma server gone")

        async def record_passive(self, captured):
            return None

    llm = ScriptedLLM(["<answer>Hello!</answer>", f"<answer>{LONG_ANSWER}</answer>", LESSON])
    p, bank = passive_pipeline(tmp_path, llm, memory=Broken())
    sid = await session(p)
    short = await p.turn(sid, "Hi, how are you today?", "t1")
    assert short.answer == "Hello!" and short.memory.passive == "skipped: answer shorter than 100 characters"
    assert "MEMORY_LEARNING" not in steps(short)
    failed = await p.turn(sid, "What is the weather in Paris today?", "t2")
    llm.assert_complete()
    assert failed.status == "completed" and failed.answer == LONG_ANSWER
    assert failed.memory.passive == "skipped: learning failed: ConnectionError: chroma server gone" and failed.memory.stored == []
    saved = await Sessions(p).get(sid)
    assert saved["status"] == "idle" and saved["turn"] == 2 and saved["last_answer"] == LONG_ANSWER and saved["messages"] == 4
    assert bank.list_workspaces() == []


async def test_a_learning_step_that_cannot_be_saved_leaves_the_saved_turn_and_the_answer(tmp_path, monkeypatch):
    llm = ScriptedLLM([f"<answer>{LONG_ANSWER}</answer>", LESSON])
    p, _ = passive_pipeline(tmp_path, llm)
    sid = await session(p)
    save = SqliteSessionStore.save

    async def disk_full_for_learning(self, state):
        if any(step["type"] == "MEMORY_LEARNING" for step in state.trace):
            raise OSError(28, "No space left on device")
        await save(self, state)

    monkeypatch.setattr(SqliteSessionStore, "save", disk_full_for_learning)
    result = await p.turn(sid, "What is the weather in Paris today?", "t1")
    assert result.answer == LONG_ANSWER and result.memory.passive == "captured" and steps(result)[-1] == "MEMORY_LEARNING"
    saved = await Sessions(p).get(sid)
    assert saved["last_answer"] == LONG_ANSWER and saved["turn"] == 1 and saved["trace"][-1]["type"] == "EXIT"
