"""Sessions as logical actors, without Ray: a retried request never runs its turn twice, a session's calls
run one at a time in arrival order, and a host holds at most its bound of live sessions."""

from __future__ import annotations

import asyncio
import json

import pytest

from reasonray.gateway.protocol import ToolCall
from reasonray.gateway.testing import FunctionLLM, ScriptedLLM, make_completion
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.errors import OverloadedError, SessionStateError, ToolFailedError
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.hosting import LiveSessions
from reasonray.reasoner.providers import SubmittedResult
from reasonray.reasoner.session import SessionPipeline, Sessions, SessionSpec, SessionState
from reasonray.stores.sessions import SqliteSessionStore

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}}


def pipeline(tmp_path, llm):
    return SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), llm, builtin_toolbox(), data_dir=tmp_path)


async def new_session(p):
    return (await p.create(SessionSpec.model_validate({"server_tools": ["calculator"], "client_tools": [WEATHER]}))).session_id


async def test_a_retried_turn_gets_the_saved_result_and_makes_no_second_llm_call(tmp_path):
    llm = ScriptedLLM(["<answer>Hello!</answer>"])  # one reply only: a second run of the turn would fail
    p = pipeline(tmp_path, llm)
    sid = await new_session(p)
    first = await p.turn(sid, "Hi", "t1", request_id="r1")
    again = await p.turn(sid, "Hi", "t1", request_id="r1")  # the host died after saving; the caller retries
    llm.assert_complete()
    assert again == first and again.turn == 1
    state = await Sessions(p).get(sid)
    assert state["turn"] == 1 and state["messages"] == 2


async def test_a_new_request_id_is_a_new_turn(tmp_path):
    p = pipeline(tmp_path, ScriptedLLM(["<answer>One</answer>", "<answer>Two</answer>"]))
    sid = await new_session(p)
    await p.turn(sid, "first", "t1", request_id="r1")
    second = await p.turn(sid, "second", "t2", request_id="r2")
    assert second.turn == 2 and second.answer == "Two"


async def test_a_retried_failed_turn_raises_the_saved_error_and_runs_nothing(tmp_path):
    llm = ScriptedLLM([(ToolCall(id="c1", name="calculator", arguments=json.dumps({"expression": "1/0"})),)])
    p = pipeline(tmp_path, llm)
    sid = await new_session(p)
    with pytest.raises(ToolFailedError, match="division by zero") as first:
        await p.turn(sid, "divide", "t1", request_id="r1")
    with pytest.raises(ToolFailedError, match="division by zero") as again:
        await p.turn(sid, "divide", "t1", request_id="r1")
    llm.assert_complete()
    assert again.value.data["tool_call_id"] == first.value.data["tool_call_id"] == "c1"
    assert (await Sessions(p).get(sid))["turn"] == 1


async def test_a_retried_resume_gets_the_saved_result(tmp_path):
    weather = ToolCall(id="w1", name="get_weather", arguments="{}")
    llm = ScriptedLLM([(weather,), "<answer>Sunny</answer>"])
    p = pipeline(tmp_path, llm)
    sid = await new_session(p)
    handed_off = await p.turn(sid, "weather?", "t1", request_id="r1")
    assert handed_off.status == "awaiting_client_tools"
    assert await p.turn(sid, "weather?", "t1", request_id="r1") == handed_off  # the hand-off, not a state conflict
    done = await p.resume(sid, [SubmittedResult("w1", "Sunny")], "t1", request_id="r2")
    assert await p.resume(sid, [SubmittedResult("w1", "Sunny")], "t1", request_id="r2") == done
    llm.assert_complete()
    with pytest.raises(SessionStateError):  # a new request id is a new re-entry, and none is pending
        await p.resume(sid, [SubmittedResult("w1", "Sunny")], "t1", request_id="r3")


async def test_a_sessions_calls_run_one_at_a_time_in_arrival_order(tmp_path):
    running = 0
    overlapped = False

    async def slow_reply(request):
        nonlocal running, overlapped
        running += 1
        overlapped |= running > 1
        await asyncio.sleep(0.01)
        running -= 1
        return f"<answer>{request.messages[-1].content}</answer>"

    class SlowLLM(FunctionLLM):  # takes a while to answer, so unserialised turns would overlap
        async def complete(self, request):
            reply = await slow_reply(request)
            return make_completion(request, reply, model=self.model, counter=counter_for_model(self.model))

    p = pipeline(tmp_path, SlowLLM(lambda r: ""))
    live = LiveSessions(capacity=8, idle_timeout_s=60)
    sid = await new_session(p)

    async def turn(n):
        async with live.use(sid):
            return await p.turn(sid, f"m{n}", f"t{n}", request_id=f"r{n}")

    async def close():
        async with live.use(sid):
            return await p.close(sid)

    results = await asyncio.gather(*(turn(n) for n in range(5)), close(), return_exceptions=True)
    assert not overlapped
    assert [r.answer for r in results[:5]] == ["m0", "m1", "m2", "m3", "m4"] and [r.turn for r in results[:5]] == [1, 2, 3, 4, 5]
    assert (await Sessions(p).get(sid))["status"] == "closed"  # closed after the turns queued before it, none lost


async def test_a_full_host_drops_its_least_recently_used_idle_session_or_refuses_when_all_are_busy():
    live = LiveSessions(capacity=2, idle_timeout_s=60, retry_after_s=2.5)
    async with live.use("a"):
        pass
    async with live.use("b"):
        pass
    async with live.use("c"):  # full: "a" (idle, least recently used) makes room
        assert "a" not in live and len(live) == 2
        release = asyncio.Event()
        entered = asyncio.Event()

        async def hold(sid):
            async with live.use(sid):
                entered.set()
                await release.wait()

        holder = asyncio.create_task(hold("b"))
        await entered.wait()
        with pytest.raises(OverloadedError, match="every one is busy") as refused:  # "b" and "c" are both in a call
            async with live.use("d"):
                pass
        assert refused.value.data == {"session_id": "d", "retry_after_s": 2.5}
        release.set()
        await holder
    assert live.busy == 0 and live.drop_idle() == 0  # used just now: not idle yet
    live.idle_timeout_s = 0
    assert live.drop_idle() == 2 and len(live) == 0


def test_errors_keep_their_data_across_processes():
    import pickle

    # an error raised in a session host reaches the ingress pickled: its retry hint must survive
    again = pickle.loads(pickle.dumps(OverloadedError("busy", {"retry_after_s": 2.5, "session_id": "s"})))
    assert type(again) is OverloadedError and again.message == "busy" and again.data == {"retry_after_s": 2.5, "session_id": "s"}
