"""ReasonRay as an A2A agent, driven by the official a2a-sdk client against the running service:
resolve the card, send a message, stream a bounded-context run, cancel a long task, continue a context in
its ReasonRay session; with two replicas, a cancel and a resubscription served by the replica that does not
run the task; and with authentication on, refusals as HTTP 403/429 with the JSON-RPC error, and tasks kept
from other principals."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, ListTasksRequest, Message, Part, Role, SendMessageRequest, TaskState
from a2a.utils.errors import TaskNotFoundError
from google.protobuf import json_format

from reasonray.api.access.auth import mint_token
from tests.a2a_rows import stored_rows
from tests.integration.conftest import DATA_DIR, own_app, result_of, rpc


@pytest.fixture(scope="module")
def agent(api):
    """The session's main application (the default settings: no application of its own to deploy)."""
    return str(api.base_url).rstrip("/"), DATA_DIR


def message(text: str, *, context_id: str = "", **metadata) -> SendMessageRequest:
    sent = Message(role=Role.ROLE_USER, message_id=f"m-{time.monotonic_ns()}", context_id=context_id, parts=[Part(text=text)])
    sent.metadata.update(metadata)
    return SendMessageRequest(message=sent)


async def client_for(base: str, http: httpx.AsyncClient, *, streaming: bool):
    return await create_client(base, ClientConfig(httpx_client=http, streaming=streaming))


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 120))


def test_the_card_lists_one_skill_per_enabled_strategy_streaming_and_the_jsonrpc_interface(agent):
    base, _ = agent

    async def resolve():
        async with httpx.AsyncClient(timeout=30) as http:
            return await A2ACardResolver(http, base).get_agent_card()

    card = run(resolve())
    strategies = httpx.get(f"{base}/v1/strategies").json()["strategies"]
    assert [s.id for s in card.skills] == [s["name"] for s in strategies]
    assert all(s.description and s.examples for s in card.skills)
    assert card.capabilities.streaming
    interfaces = [(i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces]
    assert interfaces == [(f"{base}/a2a", "JSONRPC", "1.0"), (f"{base}/a2a", "HTTP+JSON", "1.0")]
    assert not card.security_schemes  # no [auth] configured here
    # cacheable, revalidated by its ETag
    first = httpx.get(f"{base}/.well-known/agent-card.json")
    assert first.headers["cache-control"] == "public, max-age=300" and first.headers["last-modified"].endswith("GMT")
    again = httpx.get(f"{base}/.well-known/agent-card.json", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.headers["etag"] == first.headers["etag"]


def test_the_jsonrpc_endpoint_answers_with_a_trailing_slash_and_refuses_bodies_that_are_not_json(agent):
    base, _ = agent
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "no-such-task"}}
    headers = {"A2A-Version": "1.0"}
    for url in (f"{base}/a2a", f"{base}/a2a/"):
        answer = httpx.post(url, json=body, headers=headers, follow_redirects=False)
        assert answer.status_code == 200 and answer.json()["error"]["code"] == -32001, answer.text  # TaskNotFoundError
    plain = httpx.post(f"{base}/a2a", content=b"hello", headers={"Content-Type": "text/plain", **headers})
    assert plain.status_code == 415 and plain.json()["error"]["code"] == -32005
    rest = httpx.get(f"{base}/a2a/tasks/no-such-task", headers=headers)
    assert rest.status_code == 404 and rest.headers["content-type"].startswith("application/json"), rest.text


def test_send_a_message_and_get_the_answer_then_get_the_task(agent):
    base, _ = agent

    async def ask():
        async with httpx.AsyncClient(timeout=60) as http:
            client = await client_for(base, http, streaming=False)
            [response] = [r async for r in client.send_message(message("What is 12 * 12?", strategy="chain_of_thought"))]
            fetched = await client.get_task(GetTaskRequest(id=response.task.id))
            return response.task, fetched

    task, fetched = run(ask())
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.artifacts[0].parts[0].text == "144"
    assert task.artifacts[0].metadata["strategyUsed"] == "chain_of_thought"
    assert fetched.status.state == TaskState.TASK_STATE_COMPLETED and fetched.artifacts[0].parts[0].text == "144"


def test_a_streamed_bounded_context_run_sends_status_updates_before_the_answer_artifact(agent):
    base, _ = agent

    async def stream():
        async with httpx.AsyncClient(timeout=60) as http:
            client = await client_for(base, http, streaming=True)
            request = message("[[sim think=30000 answer=7]] Work it out.", skill="bounded_context", strategy_config={"max_iterations": 10})
            return [r async for r in client.send_message(request)]

    events = run(stream())
    kinds = [e.WhichOneof("payload") for e in events]
    assert "artifact_update" in kinds, events[-1]
    answer_at = kinds.index("artifact_update")
    progress = [
        e.status_update.status.message.parts[0].text
        for e in events[:answer_at]
        if e.WhichOneof("payload") == "status_update" and "iteration" in e.status_update.status.message.parts[0].text
    ]
    assert len(progress) >= 2, kinds  # several iterations reported while the run was going
    assert events[answer_at].artifact_update.artifact.parts[0].text == "7"
    assert events[answer_at].artifact_update.artifact.metadata["strategyUsed"] == "bounded_context"
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


def test_cancelling_a_long_task_cancels_its_run(agent):
    base, _ = agent

    async def cancel():
        async with httpx.AsyncClient(timeout=60) as http:
            client = await client_for(base, http, streaming=True)
            # each attempt hangs: a long run
            request = message("[[sim fault=timeout times=9]] What is 5 * 5?", strategy="chain_of_thought")
            stream = client.send_message(request)
            async for event in stream:
                if event.WhichOneof("payload") == "status_update" and event.status_update.status.state == TaskState.TASK_STATE_WORKING:
                    task_id = event.status_update.task_id
                    break
            started = time.monotonic()
            cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
            took = time.monotonic() - started
            await stream.aclose()
            return cancelled, await client.get_task(GetTaskRequest(id=task_id)), took

    cancelled, fetched, took = run(cancel())
    assert cancelled.status.state == fetched.status.state == TaskState.TASK_STATE_CANCELED
    assert took < 5  # the run was stopped, not waited for (one attempt alone hangs 10 s)
    assert not fetched.artifacts


def test_a_context_continues_one_reasonray_session_whose_second_turn_sees_the_first(agent):
    base, data_dir = agent

    async def converse():
        async with httpx.AsyncClient(timeout=60) as http:
            client = await client_for(base, http, streaming=False)
            [first] = [r async for r in client.send_message(message("What is 6 * 7?"))]
            context_id = first.task.context_id
            [second] = [r async for r in client.send_message(message("What is 2 + 3?", context_id=context_id))]
            return first.task, second.task

    first, second = run(converse())
    assert second.context_id == first.context_id and second.id != first.id
    assert [first.artifacts[0].parts[0].text, second.artifacts[0].parts[0].text] == ["42", "5"]
    meta = [first.artifacts[0].metadata, second.artifacts[0].metadata]
    assert [m["turn"] for m in meta] == [1, 2] and meta[0]["sessionId"] == meta[1]["sessionId"]
    with httpx.Client(base_url=base, timeout=30) as http:  # a real ReasonRay session, as session.* sees it
        session = result_of(rpc(http, "session.get", {"session_id": meta[0]["sessionId"]}))
    assert session["turn"] == 2 and session["messages"] >= 4 and session["last_answer"] == "5"
    # the second turn's model call was given the first exchange (the session's conversation)
    [log] = list(data_dir.glob(f"events/*/{meta[1]['traceId']}.jsonl"))
    calls = [json.loads(line) for line in log.read_text().splitlines() if '"messages"' in line]
    contents = [m.get("content") or "" for m in calls[0]["messages"]]
    assert "What is 6 * 7?" in contents and any("42" in c for c in contents) and contents[-1] == "What is 2 + 3?"
    # the tasks and the context's binding to its session live beside the sessions, in the data directory
    assert stored_rows(data_dir / "sessions", "a2a_tasks") >= 2
    assert stored_rows(data_dir / "sessions", "a2a_conversations") >= 1


@pytest.fixture(scope="module")
def two_replicas(serve_base, simulator):
    retry = {"retry": {"max_attempts": 10, "deadline_s": 60}}  # the test's hanging run keeps going that long
    # the session's main application is the remote agent of the last test: its host:port is on the egress list
    egress = {"allow_hosts": [f"127.0.0.1:{httpx.URL(serve_base).port}"]}
    with own_app(serve_base, simulator.url, "a2a-two", server={"num_replicas": 2}, llm=retry, egress=egress) as (client, _):
        # Serve reports both replicas running before the ingress has been reloaded with the second one:
        # the tests below need each to be reachable, so wait until both have answered
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            seen.add(client.post("/a2a", json=call("GetTask", {"id": "none"})).headers["X-Served-By"])
            time.sleep(0.05)
        assert len(seen) == 2, f"only replica {seen} answered within a minute"
        yield str(client.base_url).rstrip("/")


def call(method: str, params: dict, ident: str = "1") -> dict:
    return {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}


def test_cancel_and_resubscribe_reach_a_task_running_on_the_other_replica(two_replicas):
    base = two_replicas
    # each model call hangs, and is retried for up to a minute (the fixture's retry settings): a long run
    hang = message("[[sim fault=timeout times=99]] What is 5 * 5?", strategy="chain_of_thought")

    async def first_event(lines) -> dict:
        seen = []
        async for line in lines:
            if line.startswith("data:"):
                return json.loads(line.removeprefix("data:"))["result"]
            seen.append(line)
        raise AssertionError(f"the stream ended without an event: {seen}")

    async def exercise():
        async with httpx.AsyncClient(base_url=base, timeout=60, headers={"A2A-Version": "1.0"}) as http:
            body = call("SendStreamingMessage", json_format.MessageToDict(hang))
            # 1. a resubscription served by the replica that does not run the task tails it to its end
            async with http.stream("POST", "/a2a", json=body) as started:
                first_runner = runner = started.headers["X-Served-By"]
                first = (await first_event(started.aiter_lines()))["task"]["id"]
                for _ in range(20):  # Serve's proxy picks the replica: retried until it routes the resubscription there
                    async with http.stream("POST", "/a2a", json=call("SubscribeToTask", {"id": first})) as tail:
                        if tail.headers["X-Served-By"] == runner:
                            continue
                        lines = tail.aiter_lines()
                        snapshot = await first_event(lines)
                        await http.post("/a2a", json=call("CancelTask", {"id": first}))
                        tailed = [json.loads(x.removeprefix("data:"))["result"] async for x in lines if x.startswith("data:")]
                        break
                else:
                    raise AssertionError("no resubscription reached the other replica")
            # 2. a cancel served by the replica that does not run the task (the idler one: Serve prefers it)
            for _attempt in range(12):
                async with http.stream("POST", "/a2a", json=body) as started:
                    runner = started.headers["X-Served-By"]
                    task_id = (await first_event(started.aiter_lines()))["task"]["id"]
                    cancelled = await http.post("/a2a", json=call("CancelTask", {"id": task_id}))
                    if cancelled.headers["X-Served-By"] != runner:
                        return (first_runner, tail.headers["X-Served-By"]), (runner, cancelled), snapshot, tailed, task_id
            raise AssertionError("no cancel reached the other replica in 12 tries")

    started = time.monotonic()
    (first_runner, tailer), (runner, cancelled), snapshot, tailed, task_id = run(exercise())
    assert first_runner != tailer and runner != cancelled.headers["X-Served-By"]
    assert cancelled.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED", cancelled.json()
    assert snapshot["task"]["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
    states = [e.get("statusUpdate", e.get("task", {})).get("status", {}).get("state") for e in tailed]
    assert states and states[-1] == "TASK_STATE_CANCELED", tailed
    assert time.monotonic() - started < 60

    async def settled():  # the running replica stopped the run: the task stays cancelled, with no answer
        async with httpx.AsyncClient(timeout=60) as http:
            client = await client_for(base, http, streaming=False)
            await asyncio.sleep(2)
            return await client.get_task(GetTaskRequest(id=task_id))

    final = run(settled())
    assert final.status.state == TaskState.TASK_STATE_CANCELED and not final.artifacts


SECRET = "a2a-integration-secret-" + "x" * 32


@pytest.fixture(scope="module")
def secured_agent(serve_base, simulator):
    auth = {
        "jwt_secret": SECRET,
        "roles": {"cot": {"methods": ["reasoning.*"], "strategies": ["chain_of_thought"], "limits": {}}},
        "principals": {"rita": {"requests_per_minute": 1}},
    }
    with own_app(serve_base, simulator.url, "a2a-auth", auth=auth) as (client, _):
        yield str(client.base_url).rstrip("/")


def test_with_auth_on_the_guard_decides_and_tasks_are_their_owners_alone(secured_agent):
    base = secured_agent

    def bearer(sub: str) -> dict[str, str]:
        return {"Authorization": "Bearer " + mint_token(SECRET, sub, ["cot"], 600)}

    async def exercise():
        async with (
            httpx.AsyncClient(timeout=60) as anonymous,
            httpx.AsyncClient(timeout=60, headers=bearer("alice")) as as_alice,
            httpx.AsyncClient(timeout=60, headers=bearer("bob")) as as_bob,
        ):
            card = await A2ACardResolver(anonymous, base).get_agent_card()  # the card is public
            nobody = await create_client(card, ClientConfig(httpx_client=anonymous, streaming=False))
            with pytest.raises(A2AClientError, match="HTTP Error 401"):
                [r async for r in nobody.send_message(message("What is 12 * 12?"))]
            alice = await create_client(card, ClientConfig(httpx_client=as_alice, streaming=False))
            with pytest.raises(A2AClientError, match="HTTP Error 403"):
                [r async for r in alice.send_message(message("What is 12 * 12?", strategy="tree_of_thought"))]
            body = call("SendMessage", json_format.MessageToDict(message("What is 12 * 12?", strategy="tree_of_thought")))
            refused = await as_alice.post(f"{base}/a2a", json=body, headers={"A2A-Version": "1.0"})
            [answered] = [r async for r in alice.send_message(message("What is 12 * 12?", strategy="chain_of_thought"))]
            bob = await create_client(card, ClientConfig(httpx_client=as_bob, streaming=False))
            with pytest.raises(TaskNotFoundError):
                await bob.get_task(GetTaskRequest(id=answered.task.id))
            return card, refused, answered.task, await bob.list_tasks(ListTasksRequest()), await alice.list_tasks(ListTasksRequest())

    card, refused, answered, bobs, alices = run(exercise())
    assert "bearer" in card.security_schemes
    assert refused.status_code == 403 and refused.json()["error"]["code"] == -32003
    assert "may not run strategy 'tree_of_thought'" in refused.json()["error"]["message"]
    assert [t.id for t in alices.tasks] == [answered.id]  # the refused calls left no task
    assert answered.status.state == TaskState.TASK_STATE_COMPLETED and answered.artifacts[0].parts[0].text == "144"
    assert list(bobs.tasks) == []


def test_with_auth_on_a_rate_limited_caller_gets_429_with_retry_after_and_rate_limit_headers(secured_agent):
    base = secured_agent
    headers = {"Authorization": "Bearer " + mint_token(SECRET, "rita", ["cot"], 600), "A2A-Version": "1.0"}
    body = call("SendMessage", json_format.MessageToDict(message("What is 12 * 12?", strategy="chain_of_thought")))
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        answers = [http.post("/a2a", json=body) for _ in range(3)]
    assert answers[0].status_code == 200 and answers[0].json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    limited = answers[-1]
    assert limited.status_code == 429, limited.text
    error = limited.json()["error"]
    assert error["code"] == -32012 and error["data"]["limit_name"] == "requests_per_minute"
    assert int(limited.headers["Retry-After"]) >= 1 and limited.headers["X-RateLimit-Limit"] == "1"
    assert limited.headers["X-RateLimit-Remaining"] == "0" and "X-RateLimit-Reset" in limited.headers


def test_a_remote_a2a_agent_registers_by_card_url_is_discovered_by_its_skills_and_answers_forwarded_runs(agent, two_replicas):
    remote_base, _ = agent  # another ReasonRay service, at another route prefix, is the remote A2A agent
    card_url = f"{remote_base}/.well-known/agent-card.json"
    with httpx.Client(base_url=two_replicas, timeout=120) as http:
        registered = result_of(
            rpc(http, "agent.register", {"id": "far", "name": "Far", "capabilities": ["remote"], "a2a_card_url": card_url})
        )
        assert "a2a.skill.chain_of_thought" in registered["agent"]["capabilities"]
        found = result_of(rpc(http, "agent.discover", {"capabilities": ["a2a.skill.chain_of_thought"]}))
        assert [a["id"] for a in found["agents"]] == ["far"] and found["agents"][0]["a2a_card_url"] == card_url
        ran = result_of(rpc(http, "reasoning.execute", {"query": "What is 12 * 12?", "agent_id": "far", "strategy": "chain_of_thought"}))
        assert ran["answer"] == "144" and ran["strategy_used"] == "a2a:far"
        assert ran["metrics"]["strategy_specific"]["remote"]["state"] == "TASK_STATE_COMPLETED"
        bad = rpc(http, "agent.register", {"id": "nowhere", "name": "N", "capabilities": ["x"], "a2a_card_url": f"{remote_base}/nope.json"})
        assert bad.json()["error"]["code"] == -32602 and "no valid A2A agent card" in bad.json()["error"]["message"]

    async def via_a2a():  # an A2A message naming the agent is forwarded too
        async with httpx.AsyncClient(timeout=60) as http:
            client = await client_for(two_replicas, http, streaming=False)
            [reply] = [r async for r in client.send_message(message("What is 6 * 7?", agent_id="far"))]
            return reply.task

    task = run(via_a2a())
    assert task.status.state == TaskState.TASK_STATE_COMPLETED and task.artifacts[0].parts[0].text == "42"
    assert task.artifacts[0].metadata["strategyUsed"] == "a2a:far"
