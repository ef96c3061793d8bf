"""ReasonRay as an A2A agent, driven by the official a2a-sdk client against the running service:
resolve the card, send a message, stream a bounded-context run, cancel a long task, continue a context;
and with authentication on, the tenancy guard deciding each run and tasks kept from other principals."""

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

from reasonray.api.auth import mint_token
from tests.integration.conftest import DATA_DIR, own_app


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
    [interface] = card.supported_interfaces
    assert (interface.url, interface.protocol_binding, interface.protocol_version) == (f"{base}/a2a", "JSONRPC", "1.0")
    assert not card.security_schemes  # no [auth] configured here


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
    assert task.artifacts[0].metadata["strategy_used"] == "chain_of_thought"
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
    assert events[answer_at].artifact_update.artifact.metadata["strategy_used"] == "bounded_context"
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


def test_cancelling_a_long_task_cancels_its_run(agent):
    base, _ = agent

    async def cancel():
        async with httpx.AsyncClient(timeout=60) as http:
            client = await client_for(base, http, streaming=True)
            request = message("[[sim fault=timeout times=9]] What is 5 * 5?")  # each attempt hangs: a long run
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


def test_a_second_message_in_the_same_context_is_reasoned_with_the_first_exchange(agent):
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
    assert first.artifacts[0].metadata["turn"] == 1 and second.artifacts[0].metadata["turn"] == 2
    trace_id = second.artifacts[0].metadata["trace_id"]
    [log] = list(data_dir.glob(f"events/*/{trace_id}.jsonl"))
    prompt = json.loads(log.read_text().splitlines()[0])["messages"][-1]["content"]
    assert "User: What is 6 * 7?" in prompt and "Assistant: 42" in prompt and prompt.endswith("Now: What is 2 + 3?")
    # the tasks and the context's conversation live beside the sessions, in the data directory
    assert len(list((data_dir / "sessions" / "a2a" / "tasks").glob("*.json"))) >= 2
    assert len(list((data_dir / "sessions" / "a2a" / "contexts").glob("*.json"))) >= 1


SECRET = "a2a-integration-secret-" + "x" * 32


@pytest.fixture(scope="module")
def secured_agent(serve_base, simulator):
    auth = {"jwt_secret": SECRET, "roles": {"cot": {"methods": ["reasoning.*"], "strategies": ["chain_of_thought"], "limits": {}}}}
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
            [refused] = [r async for r in alice.send_message(message("What is 12 * 12?", strategy="tree_of_thought"))]
            [answered] = [r async for r in alice.send_message(message("What is 12 * 12?", strategy="chain_of_thought"))]
            bob = await create_client(card, ClientConfig(httpx_client=as_bob, streaming=False))
            with pytest.raises(TaskNotFoundError):
                await bob.get_task(GetTaskRequest(id=answered.task.id))
            return card, refused.task, answered.task, await bob.list_tasks(ListTasksRequest())

    card, refused, answered, bobs = run(exercise())
    assert "bearer" in card.security_schemes
    assert refused.status.state == TaskState.TASK_STATE_REJECTED and refused.status.message.metadata["code"] == -32003
    assert "may not run strategy 'tree_of_thought'" in refused.status.message.parts[0].text
    assert answered.status.state == TaskState.TASK_STATE_COMPLETED and answered.artifacts[0].parts[0].text == "144"
    assert list(bobs.tasks) == []
