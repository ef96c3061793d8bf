"""The A2A TCK's scripted scenarios (tests/a2a_scenarios.py, plugged in as `[a2a] executor`): each scenario's
answer on the wire, over JSON-RPC and HTTP+JSON, unary and streamed; their tasks stored, listed, continued,
cancelled and resubscribed like any other; the guard deciding with authentication on; and without the plug-in,
a scenario's message id reasons like any other message."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import pytest
from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
    TaskStatusUpdateEvent,
)
from starlette.applications import Starlette
from starlette.routing import Route

from reasonray.api.app import local_dispatcher
from reasonray.api.surfaces.a2a import A2AServer
from reasonray.api.surfaces.a2a_tasks import principal_user
from reasonray.gateway.testing import ScriptedLLM
from reasonray.kernel.config import ReasoningSettings, Settings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
from reasonray.stores.a2a import SqliteRepository
from reasonray.stores.sessions import SqliteSessionStore
from reasonray.strategies.registry import StrategyRegistry, build_catalogue
from tests.a2a_rows import stored_rows
from tests.a2a_scenarios import RESUBSCRIBE_WAIT_S, SCENARIOS, File, Script, Status, Wait, scenario_for
from tests.unit.test_a2a import Agent

BINDINGS = ["jsonrpc", "http_json"]
PLUG_IN = "tests.a2a_scenarios:ScenarioExecutor"
# every scenario of the TCK's scenarios/core_operations.feature and scenarios/streaming.feature
FEATURE_PREFIXES = {
    "tck-complete-task",
    "tck-artifact-text",
    "tck-artifact-file",
    "tck-artifact-file-url",
    "tck-artifact-data",
    "tck-message-response",
    "tck-input-required",
    "tck-reject-task",
    "tck-stream-001",
    "tck-stream-002",
    "tck-stream-003",
    "tck-stream-ordering-001",
    "tck-stream-artifact-text",
    "tck-stream-artifact-file",
    "tck-stream-artifact-chunked",
    "test-resubscribe-message-id",
}


class Conformance:
    """The A2A routes of both bindings over a dispatcher without authentication, in one process; the model is
    strict: a scenario must not call it."""

    def __init__(self, tmp_path, *, on: bool, replies: tuple[str, ...] = ()) -> None:
        reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought")
        self.llm = ScriptedLLM(replies)
        sessions = LocalSessions(
            SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), self.llm, builtin_toolbox(), data_dir=tmp_path)
        )
        rpc = local_dispatcher(reasoning, self.llm, data_dir=tmp_path, sessions=sessions)
        catalogue = build_catalogue(StrategyRegistry().discover(), reasoning)
        self.server = A2AServer(rpc, catalogue, SqliteRepository(tmp_path / "sessions"), "0.1.0", executor=PLUG_IN if on else None)
        app = Starlette(
            routes=[
                Route("/a2a", self.server.handle, methods=["POST"]),
                Route("/a2a/{operation:path}", self.server.handle_rest, methods=["GET", "POST"]),
            ]
        )
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://agent", headers={"A2A-Version": "1.0"})

    async def call(self, binding: str, method: str, params: dict[str, Any], rest: tuple[str, str]) -> httpx.Response:
        """One A2A operation: JSON-RPC `method` on /a2a, or the HTTP+JSON `rest` (verb, path) with `params`."""
        if binding == "jsonrpc":
            return await self.http.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        verb, path = rest
        return await self.http.request(verb, path, json=params if verb == "POST" else None)

    async def send(self, binding: str, message_id: str, *, stream: bool = False, **fields: Any) -> list[dict[str, Any]]:
        """The answer to one message: its one result (unary), or its events in order (streamed)."""
        message = {"role": "ROLE_USER", "parts": [{"text": "TCK scenario"}], "messageId": message_id, **fields}
        method, path = ("SendStreamingMessage", "/a2a/message:stream") if stream else ("SendMessage", "/a2a/message:send")
        answer = await self.call(binding, method, {"message": message}, ("POST", path))
        assert answer.status_code == 200, answer.text
        bodies = [json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:")] if stream else [answer.json()]
        return [body["result"] if binding == "jsonrpc" else body for body in bodies]

    async def task(self, binding: str, task_id: str) -> dict[str, Any]:
        answer = await self.call(binding, "GetTask", {"id": task_id}, ("GET", f"/a2a/tasks/{task_id}"))
        assert answer.status_code == 200, answer.text
        return answer.json()["result"] if binding == "jsonrpc" else answer.json()

    async def aclose(self) -> None:
        await self.http.aclose()


@pytest.fixture
async def agent(tmp_path):
    made = Conformance(tmp_path, on=True)
    yield made
    await made.aclose()
    assert made.llm.requests == []  # no scenario reached the model


def only_task(results: list[dict[str, Any]]) -> dict[str, Any]:
    [result] = results
    assert set(result) == {"task"}, result
    return result["task"]


def test_the_table_holds_every_scenario_of_the_feature_files_and_the_longest_prefix_wins():
    assert set(SCENARIOS) == FEATURE_PREFIXES
    assert scenario_for("tck-artifact-file-url-0a1b") is SCENARIOS["tck-artifact-file-url"]
    assert scenario_for("tck-artifact-file-0a1b") is SCENARIOS["tck-artifact-file"]
    assert scenario_for("tck-stream-artifact-file-x") is SCENARIOS["tck-stream-artifact-file"]
    assert scenario_for("tck-send-001-x") is None and scenario_for("m-what-is-6x7") is None and scenario_for("") is None
    assert scenario_for("x-tck-artifact-text") is None  # a prefix, not a substring
    resubscribe = SCENARIOS["test-resubscribe-message-id"]
    assert resubscribe == Script((Status("working"), Wait(RESUBSCRIBE_WAIT_S), Status("completed"))) and RESUBSCRIBE_WAIT_S >= 4.0
    with pytest.raises(ValueError, match="raw\\) or its url"):
        File("output.txt", "text/plain")  # a file part says where its bytes are


def test_no_executor_is_plugged_in_unless_configured():
    assert Settings().a2a.executor is None
    assert Settings.model_validate({"a2a": {"executor": PLUG_IN}}).a2a.executor == PLUG_IN


@pytest.mark.parametrize("binding", BINDINGS)
async def test_artifact_scenarios_complete_with_their_text_file_url_and_data_parts(agent, binding):
    text = only_task(await agent.send(binding, "tck-artifact-text-1"))
    assert text["status"]["state"] == "TASK_STATE_COMPLETED"
    [artifact] = text["artifacts"]
    assert artifact["artifactId"] and artifact["parts"] == [{"text": "Generated text content"}]

    [file] = only_task(await agent.send(binding, "tck-artifact-file-1"))["artifacts"]
    assert file["artifactId"] and file["parts"] == [
        {"raw": base64.b64encode(b"tck").decode(), "filename": "output.txt", "mediaType": "text/plain"}
    ]

    [url] = only_task(await agent.send(binding, "tck-artifact-file-url-1"))["artifacts"]
    assert url["parts"] == [{"url": "https://example.com/output.txt", "filename": "output.txt", "mediaType": "text/plain"}]

    [data] = only_task(await agent.send(binding, "tck-artifact-data-1"))["artifacts"]
    assert data["parts"] == [{"data": {"key": "value", "count": 42}}]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_message_response_is_a_message_and_leaves_no_task(agent, binding):
    [result] = await agent.send(binding, "tck-message-response-1", contextId="ctx-1")
    assert set(result) == {"message"}
    message = result["message"]
    assert message["role"] == "ROLE_AGENT" and message["messageId"] and message["contextId"] == "ctx-1"
    assert message["parts"] == [{"text": "Direct message response"}] and "taskId" not in message
    listed = await agent.call(binding, "ListTasks", {}, ("GET", "/a2a/tasks"))
    assert (listed.json()["result"] if binding == "jsonrpc" else listed.json()).get("tasks", []) == []


@pytest.mark.parametrize("binding", BINDINGS)
async def test_complete_input_required_and_reject_end_in_their_states(agent, binding):
    done = only_task(await agent.send(binding, "tck-complete-task-1"))
    assert done["status"]["state"] == "TASK_STATE_COMPLETED" and done["status"]["message"]["parts"] == [{"text": "Hello from TCK"}]
    assert not done.get("artifacts")
    waiting = only_task(await agent.send(binding, "tck-input-required-1"))
    assert waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    rejected = only_task(await agent.send(binding, "tck-reject-task-1"))
    assert rejected["status"]["state"] == "TASK_STATE_REJECTED" and rejected["status"]["message"]["parts"] == [{"text": "rejected"}]
    assert (await agent.task(binding, rejected["id"]))["status"]["state"] == "TASK_STATE_REJECTED"  # stored like any task


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """Each streamed event as `task:<state>`, `status:<state>` or `artifact:<text of its parts>`."""
    out = []
    for event in events:
        [(kind, body)] = event.items()
        if kind == "artifactUpdate":
            out.append("artifact:" + "".join(p.get("text", "<file>") for p in body["artifact"]["parts"]))
        else:
            out.append(f"{kind.removesuffix('Update')}:{body['status']['state'].removeprefix('TASK_STATE_').lower()}")
    return out


STREAMED = {
    "tck-stream-001": ["artifact:Stream hello from TCK"],
    "tck-stream-003": ["artifact:Stream task lifecycle"],
    "tck-stream-ordering-001": ["artifact:Ordered output"],
    "tck-stream-artifact-text": ["artifact:Streamed text content"],
    "tck-stream-artifact-file": ["artifact:<file>"],
    "tck-stream-artifact-chunked": ["artifact:chunk-1 ", "artifact:chunk-2"],
}


@pytest.mark.parametrize("binding", BINDINGS)
async def test_streaming_scenarios_stream_their_events_in_order(agent, binding):
    for prefix, artifacts in STREAMED.items():
        events = await agent.send(binding, f"{prefix}-1", stream=True)
        assert kinds(events) == ["task:submitted", "status:working", *artifacts, "status:completed"], prefix
        task_ids = {next(iter(e.values())).get("taskId") or next(iter(e.values()))["id"] for e in events}
        assert len(task_ids) == 1
        stored = await agent.task(binding, task_ids.pop())
        assert stored["status"]["state"] == "TASK_STATE_COMPLETED" and len(stored["artifacts"]) == 1  # chunks: one artifact
    assert kinds(await agent.send(binding, "tck-stream-002-1", stream=True)) == ["task:submitted", "status:completed"]
    chunks = [e["artifactUpdate"] for e in await agent.send(binding, "tck-stream-artifact-chunked-2", stream=True) if "artifactUpdate" in e]
    assert chunks[0]["artifact"]["artifactId"] == chunks[1]["artifact"]["artifactId"]
    assert [(c.get("append", False), c.get("lastChunk", False)) for c in chunks] == [(False, False), (True, True)]
    [file] = [e for e in await agent.send(binding, "tck-stream-artifact-file-2", stream=True) if "artifactUpdate" in e]
    assert file["artifactUpdate"]["artifact"]["parts"][0] | {"raw": "-"} == {
        "raw": "-",
        "filename": "output.txt",
        "mediaType": "text/plain",
    }


@pytest.mark.parametrize("binding", BINDINGS)
async def test_unary_scenarios_also_stream_and_streaming_ones_also_answer_unary(agent, binding):
    events = await agent.send(binding, "tck-artifact-data-1", stream=True)
    assert [next(iter(e)) for e in events] == ["task", "artifactUpdate", "statusUpdate"]
    assert events[1]["artifactUpdate"]["artifact"]["parts"] == [{"data": {"key": "value", "count": 42}}]
    [message] = await agent.send(binding, "tck-message-response-2", stream=True)
    assert message["message"]["parts"] == [{"text": "Direct message response"}]
    task = only_task(await agent.send(binding, "tck-stream-001-2"))
    assert task["status"]["state"] == "TASK_STATE_COMPLETED" and task["artifacts"][0]["parts"] == [{"text": "Stream hello from TCK"}]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_scenario_task_is_continued_listed_and_cancelled_like_any_task(agent, binding):
    first = only_task(await agent.send(binding, "tck-input-required-1"))
    more = only_task(await agent.send(binding, "tck-input-required-2", taskId=first["id"]))
    assert more["id"] == first["id"] and more["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    done = only_task(await agent.send(binding, "tck-complete-task-2", taskId=first["id"]))
    assert done["id"] == first["id"] and done["status"]["state"] == "TASK_STATE_COMPLETED"
    stored = await agent.task(binding, first["id"])
    assert [m["messageId"] for m in stored["history"] if m["role"] == "ROLE_USER"] == [
        "tck-input-required-1",
        "tck-input-required-2",
        "tck-complete-task-2",
    ]
    waiting = only_task(await agent.send(binding, "tck-input-required-3"))
    cancelled = await agent.call(binding, "CancelTask", {"id": waiting["id"]}, ("POST", f"/a2a/tasks/{waiting['id']}:cancel"))
    assert cancelled.status_code == 200, cancelled.text
    assert (await agent.task(binding, waiting["id"]))["status"]["state"] == "TASK_STATE_CANCELED"
    listed = await agent.call(binding, "ListTasks", {}, ("GET", "/a2a/tasks"))
    tasks = (listed.json()["result"] if binding == "jsonrpc" else listed.json())["tasks"]
    assert {t["id"]: t["status"]["state"] for t in tasks} == {first["id"]: "TASK_STATE_COMPLETED", waiting["id"]: "TASK_STATE_CANCELED"}


async def _all(stream) -> list:
    return [e async for e in stream]


async def test_the_resubscription_task_stays_working_for_a_resubscriber_and_can_be_cancelled(agent):
    asked = Message(role=Role.ROLE_USER, message_id="test-resubscribe-message-id-1", parts=[Part(text="long")])
    context = ServerCallContext()
    handler = agent.server.handler
    events = handler.on_message_send_stream(SendMessageRequest(message=asked), context)
    async for event in events:
        if isinstance(event, TaskStatusUpdateEvent) and event.status.state == TaskState.TASK_STATE_WORKING:
            task_id = event.task_id
            break
    await asyncio.sleep(0.5)
    resubscribed = handler.on_subscribe_to_task(SubscribeToTaskRequest(id=task_id), context)
    assert (await anext(resubscribed)).status.state == TaskState.TASK_STATE_WORKING  # still working
    cancelled = await handler.on_cancel_task(CancelTaskRequest(id=task_id), context)
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    tail = await asyncio.wait_for(_all(resubscribed), 10)
    assert tail[-1].status.state == TaskState.TASK_STATE_CANCELED
    rest = await asyncio.wait_for(_all(events), 10)
    assert rest[-1].status.state == TaskState.TASK_STATE_CANCELED


async def test_without_the_plug_in_a_scenario_message_id_reasons_like_any_message(tmp_path):
    off = Conformance(tmp_path, on=False, replies=("<thinking>easy</thinking><answer>5</answer>",))
    try:
        task = only_task(await off.send("jsonrpc", "tck-artifact-text-1"))
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        [artifact] = task["artifacts"]
        assert artifact["name"] == "answer" and artifact["parts"] == [{"text": "5"}] and artifact["metadata"]["turn"] == 1
        off.llm.assert_complete()  # the message went to the model, as a turn of the context's session
        assert "TCK scenario" in off.llm.requests[0].messages[-1].content
    finally:
        await off.aclose()


async def test_with_authentication_the_guard_decides_and_a_scenario_task_is_its_callers(tmp_path):
    agent = Agent(tmp_path, executor=PLUG_IN)
    http_clients: list[httpx.AsyncClient] = []
    try:
        await _guarded(agent, tmp_path, http_clients)
    finally:
        for http in http_clients:
            await http.aclose()


async def _guarded(agent: Agent, tmp_path, http_clients: list[httpx.AsyncClient]) -> None:
    body = {"jsonrpc": "2.0", "id": "r-1", "method": "SendMessage"}
    asked = {"role": "ROLE_USER", "parts": [{"text": "TCK"}], "messageId": "tck-artifact-text-1"}
    refused = await agent.http("rita", http_clients).post("/a2a", json=body | {"params": {"message": asked}})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == -32003  # a reader may not run reasoning
    nobody = await agent.http("nobody", http_clients).post("/a2a", json=body | {"params": {"message": asked}})
    assert nobody.status_code == 401
    assert stored_rows(tmp_path / "sessions", "a2a_tasks") == 0  # refused: no task
    answered = await agent.http("alice", http_clients).post("/a2a", json=body | {"params": {"message": asked}})
    task = answered.json()["result"]["task"]
    assert task["artifacts"][0]["parts"] == [{"text": "Generated text content"}]
    assert agent.llm.requests == []
    records = [json.loads(line) for line in agent.audit_path.read_text().splitlines()]
    assert [(r["principal"], r["method"], r["outcome"]) for r in records] == [
        ("rita", "reasoning.execute", "forbidden"),
        ("anonymous", "reasoning.execute", "unauthenticated"),
        ("alice", "reasoning.execute", "ok"),
    ]
    stored = agent.server.store
    assert await stored.get(task["id"], ServerCallContext(user=principal_user("alice"))) is not None  # filed under its caller
    assert await stored.get(task["id"], ServerCallContext(user=principal_user("bob"))) is None  # and no one else's
