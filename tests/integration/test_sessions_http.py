"""Sessions through the running service: over HTTP on session hosts, a client-tool hand-off that
survives the session's host being killed and the service being restarted, idle sessions dropped from
memory, isolation, and ReAct."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray

from reasonray.actors import NAMESPACE
from reasonray.actors.session import host_index, host_name
from tests.client_tools import HANDED_OFF_THEN_RESUMED, WEATHER
from tests.integration.conftest import deploy, own_app, result_of, rpc

IDLE_S = 3
HOSTS = 2


@pytest.fixture(scope="module")
def sessions_api(serve_base, simulator):
    with own_app(serve_base, simulator.url, "sessions", sessions={"idle_timeout_s": IDLE_S, "hosts": HOSTS}) as app:
        yield app


def host_of(session_id):
    return ray.get_actor(host_name("sessions", host_index(session_id, HOSTS)), namespace=NAMESPACE)


def new_session(client):
    return result_of(rpc(client, "session.create", {"server_tools": ["calculator"], "client_tools": [WEATHER], "bootstrap": "Welcome."}))[
        "session_id"
    ]


def test_server_tool_then_client_tool_then_resume_after_the_host_was_killed(sessions_api):
    client, _ = sessions_api
    sid = new_session(client)
    message = 'Is it warm? [[sim call=calculator {"expression": "21 * 9 / 5 + 32"}]] [[sim call=get_weather {"city": "Lisbon"}]]'
    handed_off = result_of(rpc(client, "session.turn", {"session_id": sid, "message": message}))
    assert handed_off["status"] == "awaiting_client_tools"
    [pending] = handed_off["pending_tool_calls"]
    assert pending["name"] == "get_weather" and pending["arguments"] == {"city": "Lisbon"}

    ray.kill(host_of(sid), no_restart=False)  # the session's host dies (and restarts) with the hand-off outstanding
    resumed = result_of(
        rpc(
            client,
            "session.resume",
            {
                "session_id": sid,
                "tool_results": [{"tool_call_id": pending["tool_call_id"], "content": "Sunny, 21 C (69.8 F)"}],
            },
        )
    )
    assert resumed["status"] == "completed" and resumed["answer"] == "Sunny, 21 C (69.8 F)"
    assert [s["type"] for s in resumed["trace"]] == HANDED_OFF_THEN_RESUMED
    calculator = next(s for s in resumed["trace"] if s["type"] == "TOOL_EXECUTED")
    assert calculator["tool"] == "calculator" and calculator["status"] == "ok"
    assert resumed["trace"][5]["exit_mode"] == 2 and resumed["trace"][-1]["exit_mode"] == 1
    assert result_of(rpc(client, "session.get", {"session_id": sid}))["status"] == "idle"


def test_a_pending_hand_off_survives_a_restart_of_the_service(sessions_api):
    from ray import serve

    client, settings = sessions_api
    sid = new_session(client)
    handed_off = result_of(rpc(client, "session.turn", {"session_id": sid, "message": '[[sim call=get_weather {"city": "Oslo"}]]'}))
    call_id = handed_off["pending_tool_calls"][0]["tool_call_id"]
    serve.delete("sessions")
    ray.kill(host_of(sid), no_restart=True)  # gone for good: the deploy creates the hosts again
    deploy(settings, "sessions", "/sessions")
    assert result_of(rpc(client, "session.get", {"session_id": sid}))["pending_tool_calls"][0]["tool_call_id"] == call_id
    done = result_of(rpc(client, "session.resume", {"session_id": sid, "tool_results": [{"tool_call_id": call_id, "content": "Snow"}]}))
    assert done["answer"] == "Snow"


def test_wrong_results_and_conflicts_have_their_codes_and_lose_nothing(sessions_api):
    client, _ = sessions_api
    sid = new_session(client)
    call_id = result_of(rpc(client, "session.turn", {"session_id": sid, "message": '[[sim call=get_weather {"city": "Rome"}]]'}))[
        "pending_tool_calls"
    ][0]["tool_call_id"]
    wrong = rpc(client, "session.resume", {"session_id": sid, "tool_results": [{"tool_call_id": "call_x", "content": "?"}]}).json()["error"]
    assert wrong["code"] == -32602 and wrong["data"]["missing"] == [call_id] and wrong["data"]["unexpected"] == ["call_x"]
    assert sid in str(rpc(client, "session.turn", {"session_id": sid, "message": "hi"}).json()["error"]["message"])
    assert (
        result_of(rpc(client, "session.resume", {"session_id": sid, "tool_results": [{"tool_call_id": call_id, "content": "Warm"}]}))[
            "answer"
        ]
        == "Warm"
    )
    assert rpc(client, "session.turn", {"session_id": "no-such-session", "message": "hi"}).json()["error"]["code"] == -32005


def test_concurrent_sessions_never_see_each_others_state(sessions_api):
    client, _ = sessions_api
    sids = [new_session(client) for _ in range(4)]

    def converse(index_sid):
        index, sid = index_sid
        answers = []
        for step in range(2):
            expression = f"{index} * 100 + {step}"
            answers.append(
                result_of(
                    rpc(client, "session.turn", {"session_id": sid, "message": f'[[sim call=calculator {{"expression": "{expression}"}}]]'})
                )["answer"]
            )
        return answers

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(converse, enumerate(sids)))
    assert results == [[str(i * 100), str(i * 100 + 1)] for i in range(4)]
    for index, sid in enumerate(sids):
        state = result_of(rpc(client, "session.get", {"session_id": sid}))
        assert state["turn"] == 2 and state["last_answer"] == str(index * 100 + 1)


def test_an_idle_session_leaves_its_hosts_memory_and_comes_back(sessions_api):
    client, _ = sessions_api
    sid = new_session(client)
    result_of(rpc(client, "session.turn", {"session_id": sid, "message": "What is 2 + 2?"}))
    host = host_of(sid)
    assert ray.get(host.is_live.remote(sid))
    deadline = time.monotonic() + IDLE_S * 6
    while ray.get(host.is_live.remote(sid)):
        assert time.monotonic() < deadline, "the idle session was not dropped from its host's memory"
        time.sleep(0.5)
    again = result_of(rpc(client, "session.turn", {"session_id": sid, "message": "What is 3 + 3?"}))
    assert again["answer"] == "6" and again["turn"] == 2


def test_react_uses_server_tools_through_reasoning_execute(sessions_api):
    client, _ = sessions_api
    run = result_of(
        rpc(
            client,
            "reasoning.execute",
            {
                "query": 'Sum of squares below 10 [[sim call=python {"code": "print(sum(i*i for i in range(10)))"}]]',
                "strategy": "react",
                "include_trace": True,
            },
        )
    )
    assert run["answer"] == "285" and run["strategy_used"] == "react"
    assert [c["tool"] for c in run["metrics"]["strategy_specific"]["tool_calls"]] == ["python"]
    assert [e["type"] for e in run["trace"] if e["type"] in ("TOOL_EXECUTED", "EXIT")] == ["TOOL_EXECUTED", "EXIT"]
