"""The A2A agent in one process: the card, runs through the tenancy guard (roles, budgets, audit; a refusal is
an HTTP 401/403/429 with a JSON-RPC error, no task), tasks owned by their principal, a context continuing a
ReasonRay session, a cancel and a resubscription reaching a task from another replica (two servers sharing one
board), and the task store on files and on PostgreSQL."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.server.cluster import TaskVersion
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import (
    Artifact,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import TaskNotFoundError
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.routing import Route

from reasonray.api.access.auth import CURRENT_PRINCIPAL, Policy, Principal
from reasonray.api.access.limits import LocalLimits, RateLimiter
from reasonray.api.access.tenancy import Guard, LocalOwners, install_guard
from reasonray.api.app import local_dispatcher
from reasonray.api.surfaces.a2a import A2AServer, agent_card
from reasonray.api.surfaces.a2a_tasks import (
    CONFLICT,
    NOT_YOURS,
    ContextSessions,
    SharedTaskStore,
    TaskBoard,
    principal_user,
)
from reasonray.gateway.testing import FunctionLLM
from reasonray.kernel.auth_settings import AuthSettings
from reasonray.kernel.config import ReasoningSettings
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.session import LocalSessions, SessionPipeline, SessionState
from reasonray.stores.a2a import SqliteRepository, open_a2a
from reasonray.stores.audit import JsonlAuditLog
from reasonray.stores.ownership import OwnershipTable
from reasonray.stores.sessions import SqliteSessionStore
from reasonray.strategies.registry import StrategyRegistry, build_catalogue
from tests.a2a_rows import stored_rows

CATALOGUE = {
    "default_strategy": "chain_of_thought",
    "strategies": [
        {"name": "chain_of_thought", "description": "Step by step.", "capabilities": ["reasoning.strategy.chain_of_thought"]},
        {"name": "bounded_context", "description": "Fixed memory.", "capabilities": ["reasoning.strategy.bounded_context"]},
    ],
}


def test_the_card_has_a_skill_per_strategy_and_declares_bearer_auth_only_when_configured():
    card = agent_card(CATALOGUE, "http://host:8000/", "0.1.0")
    assert [s.id for s in card.skills] == ["chain_of_thought", "bounded_context"]
    assert card.skills[0].description == "Step by step." and card.skills[0].examples
    assert card.supported_interfaces[0].url == "http://host:8000/a2a"
    assert not card.security_schemes and not card.security_requirements
    secured = agent_card_to_dict(agent_card(CATALOGUE, "http://host:8000", "0.1.0", bearer=True))
    assert secured["securitySchemes"]["bearer"]["httpAuthSecurityScheme"] == {"scheme": "Bearer", "bearerFormat": "JWT"}
    assert secured["securityRequirements"] == [{"schemes": {"bearer": {}}}]


# -- the agent in one process, authentication on ----------------------------------------------------------

ROLES = {
    "reasoner": {"methods": ["reasoning.*", "session.*"], "strategies": ["*"]},
    "cot": {"methods": ["reasoning.*"], "strategies": ["chain_of_thought"]},
    "reader": {"methods": ["reasoning.strategies"], "strategies": []},
}
CALLERS = {
    "alice": Principal("alice", ("reasoner",)),
    "bob": Principal("bob", ("reasoner",)),
    "carol": Principal("carol", ("cot",)),
    "rita": Principal("rita", ("reader",)),
    "tess": Principal("tess", ("reasoner",)),
}


class HangingLLM(FunctionLLM):
    """A model that never answers a prompt containing `[hang]` (a long run, for cancels)."""

    stopped = 0  # hanging calls that were cancelled (the run stopped)

    async def complete(self, request):
        if "[hang]" in request.messages[-1].content:
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                self.stopped += 1
                raise
        return await super().complete(request)


def rate_limit_headers(error):
    return {"Retry-After": str(round(error["data"]["retry_after_s"] + 0.5))} if error["code"] == -32012 else {}


class Agent:
    """The A2A route over a guarded dispatcher; `Authorization: Bearer <name>` stands for a verified token.
    Two agents built with one `board` (and data directory) are two replicas of one service."""

    def __init__(self, tmp_path, board: TaskBoard | None = None, *, executor: str | None = None, **auth) -> None:
        reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought", "tree_of_thought"], default_strategy="chain_of_thought")
        self.prompts: list[str] = []
        self.llm = HangingLLM(self._reply)
        sessions = LocalSessions(
            SessionPipeline(SqliteSessionStore(SessionState, tmp_path / "sessions"), self.llm, builtin_toolbox(), data_dir=tmp_path)
        )
        self.rpc = local_dispatcher(reasoning, self.llm, data_dir=tmp_path, sessions=sessions)
        self.limiter = RateLimiter()
        self.audit_path = tmp_path / "audit.jsonl"

        async def strategy_of(params):
            return params.strategy or "chain_of_thought"

        async def no_agent(agent_id):
            return False

        async def no_strategies(agent_id):
            return []  # no agents here: no principal of these tests is bound to one

        guard = Guard(
            Policy(AuthSettings(jwt_secret="s" * 40, roles=ROLES, **auth)),
            LocalOwners(OwnershipTable()),
            LocalLimits(self.limiter),
            agent_exists=no_agent,
            strategy_of=strategy_of,
            agent_strategies=no_strategies,
            audit=JsonlAuditLog(self.audit_path),
        )
        install_guard(self.rpc, guard)
        self.repo = SqliteRepository(tmp_path / "sessions")
        catalogue = build_catalogue(StrategyRegistry().discover(), reasoning)
        self.server = A2AServer(
            self.rpc,
            catalogue,
            self.repo,
            "0.1.0",
            bearer=True,
            board=board,
            refusal_headers=rate_limit_headers,
            executor=executor,
        )
        self.app = Starlette(routes=[Route("/a2a", self.server.handle, methods=["POST"])])

    def _reply(self, request) -> str:
        """6 * 7 is 42; "that plus one" is one more than the last answer in the conversation, else unknown."""
        self.prompts.append("\n".join(str(m.content) for m in request.messages))
        asked = request.messages[-1].content
        if "that plus one" in asked:
            earlier = [m.content for m in request.messages[:-1] if m.role == "assistant" and "42" in str(m.content)]
            answer = "43" if earlier else "which number?"
        else:
            answer = "42" if "6 * 7" in asked else "5"
        return f"<thinking>easy</thinking><answer>{answer}</answer>"

    async def __call__(self, scope, receive, send):
        """What the ingress's auth gate does: the verified caller in CURRENT_PRINCIPAL around the route."""
        header = dict(scope["headers"]).get(b"authorization", b"").decode()
        token = CURRENT_PRINCIPAL.set(CALLERS.get(header.removeprefix("Bearer ")))
        try:
            await self.app(scope, receive, send)
        finally:
            CURRENT_PRINCIPAL.reset(token)

    def http(self, who: str, http_clients: list) -> httpx.AsyncClient:
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(self),
            base_url="http://agent",
            headers={"Authorization": f"Bearer {who}", "A2A-Version": "1.0"},
            timeout=30,
        )
        http_clients.append(http)
        return http

    async def client(self, who: str, http_clients: list, *, streaming: bool = False):
        http = self.http(who, http_clients)
        return await create_client(self.server.card("http://agent"), ClientConfig(httpx_client=http, streaming=streaming))


def message(text: str, *, context_id: str = "", **metadata) -> SendMessageRequest:
    sent = Message(role=Role.ROLE_USER, message_id=f"m-{text}-{context_id}", context_id=context_id, parts=[Part(text=text)])
    sent.metadata.update(metadata)
    return SendMessageRequest(message=sent)


async def send(client, request: SendMessageRequest) -> Task:
    [response] = [r async for r in client.send_message(request)]
    return response.task


@pytest.fixture
async def http_clients():
    made: list[httpx.AsyncClient] = []
    yield made
    for http in made:
        await http.aclose()


def rpc_body(request: SendMessageRequest, method: str = "SendMessage") -> dict:
    return {"jsonrpc": "2.0", "id": "r-1", "method": method, "params": json_format.MessageToDict(request)}


async def test_a_refused_http_json_call_is_a_403_in_that_bindings_shape_and_leaves_no_task(tmp_path, http_clients):
    agent = Agent(tmp_path)
    agent.app.router.routes.append(Route("/a2a/{operation:path}", agent.server.handle_rest, methods=["GET", "POST"]))
    request = json_format.MessageToDict(message("What is 6 * 7?", strategy="chain_of_thought"))
    answer = await agent.http("rita", http_clients).post("/a2a/message:send", json=request)
    assert answer.status_code == 403 and answer.headers["content-type"] == "application/json", answer.text
    error = answer.json()["error"]
    assert error["code"] == 403 and error["status"] == "PERMISSION_DENIED" and error["details"][0]["code"] == -32003
    assert "may not call reasoning.execute" in error["message"] and agent.llm.requests == []
    assert stored_rows(tmp_path / "sessions", "a2a_tasks") == 0


async def test_a_refused_call_is_an_http_403_with_the_json_rpc_error_and_leaves_no_task(tmp_path, http_clients):
    agent = Agent(tmp_path)
    for method in ("SendMessage", "SendStreamingMessage"):
        request = message("What is 6 * 7?", strategy="chain_of_thought")
        answer = await agent.http("rita", http_clients).post("/a2a", json=rpc_body(request, method))
        assert answer.status_code == 403, answer.text
        body = answer.json()
        assert body["id"] == "r-1" and body["error"]["code"] == -32003
        assert "may not call reasoning.execute" in body["error"]["message"]
    carol = await agent.client("carol", http_clients)
    with pytest.raises(A2AClientError, match="HTTP Error 403"):
        await send(carol, message("What is 6 * 7?", strategy="tree_of_thought"))
    answer = await agent.http("carol", http_clients).post("/a2a", json=rpc_body(message("What is 6 * 7?", strategy="tree_of_thought")))
    assert answer.status_code == 403 and "may not run strategy 'tree_of_thought'" in answer.json()["error"]["message"]
    assert agent.llm.requests == []  # refused before the first model call
    assert (await carol.list_tasks(ListTasksRequest())).tasks == []  # and no task was left behind
    assert stored_rows(tmp_path / "sessions", "a2a_tasks") == 0
    allowed = await send(carol, message("What is 6 * 7?", strategy="chain_of_thought"))
    assert allowed.status.state == TaskState.TASK_STATE_COMPLETED and allowed.artifacts[0].parts[0].text == "42"
    records = [json.loads(line) for line in agent.audit_path.read_text().splitlines()]
    assert [(r["principal"], r["method"], r["outcome"]) for r in records] == [
        ("rita", "reasoning.execute", "forbidden"),
        ("rita", "reasoning.execute", "forbidden"),
        ("carol", "reasoning.execute", "forbidden"),
        ("carol", "reasoning.execute", "forbidden"),
        ("carol", "reasoning.execute", "ok"),
    ]
    assert records[-1]["trace_id"] == allowed.artifacts[0].metadata["traceId"]


async def test_a2a_runs_are_charged_to_the_callers_token_budget_and_refused_past_it_with_429(tmp_path, http_clients):
    agent = Agent(tmp_path, principals={"tess": {"tokens_per_day": 1}})
    tess = await agent.client("tess", http_clients)
    ran = await send(tess, message("What is 6 * 7?", strategy="chain_of_thought"))
    assert agent.limiter.usage("tess")["tokens_today"] == ran.artifacts[0].metadata["totalTokens"] > 0
    for request in (message("What is 2 + 3?", strategy="chain_of_thought"), message("What is 2 + 3?")):  # a run, a session turn
        over = await agent.http("tess", http_clients).post("/a2a", json=rpc_body(request))
        assert over.status_code == 429, over.text
        error = over.json()["error"]
        assert error["code"] == -32012 and error["data"]["limit_name"] == "tokens_per_day" and "token budget" in error["message"]
        assert int(over.headers["Retry-After"]) >= 1
    assert len((await tess.list_tasks(ListTasksRequest())).tasks) == 1


async def test_a_refusal_outside_the_route_still_ends_in_a_rejected_task(tmp_path):
    agent = Agent(tmp_path)
    token = CURRENT_PRINCIPAL.set(CALLERS["rita"])
    try:
        task = await agent.server.handler.on_message_send(message("What is 6 * 7?"), ServerCallContext(user=principal_user("rita")))
    finally:
        CURRENT_PRINCIPAL.reset(token)
    assert task.status.state == TaskState.TASK_STATE_REJECTED and task.status.message.metadata["code"] == -32003


async def test_another_principals_tasks_read_list_and_cancel_as_if_they_did_not_exist(tmp_path, http_clients):
    agent = Agent(tmp_path)
    alice, bob = await agent.client("alice", http_clients), await agent.client("bob", http_clients)
    hers = await send(alice, message("What is 6 * 7?"))
    assert (await alice.get_task(GetTaskRequest(id=hers.id))).artifacts[0].parts[0].text == "42"
    answers = []
    for task_id in (hers.id, "00000000-0000-4000-8000-000000000000"):  # hers, and one that does not exist
        with pytest.raises(TaskNotFoundError, match="Task not found") as got:
            await bob.get_task(GetTaskRequest(id=task_id))
        with pytest.raises(TaskNotFoundError, match="Task not found") as cancelled:
            await bob.cancel_task(CancelTaskRequest(id=task_id))
        answers.append([(type(e.value), str(e.value).replace(task_id, "ID")) for e in (got, cancelled)])
    assert answers[0] == answers[1]
    assert [t.id for t in (await alice.list_tasks(ListTasksRequest())).tasks] == [hers.id]
    assert (await bob.list_tasks(ListTasksRequest())).tasks == []
    assert (await bob.list_tasks(ListTasksRequest(context_id=hers.context_id))).tasks == []
    with pytest.raises(TaskNotFoundError):  # continuing her task by id
        await send(
            bob, SendMessageRequest(message=Message(role=Role.ROLE_USER, message_id="m-x", task_id=hers.id, parts=[Part(text="hi")]))
        )
    as_bob = ServerCallContext(user=principal_user("bob"))
    with pytest.raises(TaskNotFoundError):  # resubscribing
        [e async for e in agent.server.handler.on_subscribe_to_task(SubscribeToTaskRequest(id=hers.id), as_bob)]


async def as_caller(who: str, call):
    token = CURRENT_PRINCIPAL.set(CALLERS[who])
    try:
        return await call
    finally:
        CURRENT_PRINCIPAL.reset(token)


async def test_a_context_is_a_reasonray_session_of_its_owner_and_a_fresh_one_for_anyone_else(tmp_path, http_clients):
    agent = Agent(tmp_path)
    alice, bob = await agent.client("alice", http_clients), await agent.client("bob", http_clients)
    first = await send(alice, message("What is 6 * 7?"))
    second = await send(alice, message("What is that plus one?", context_id=first.context_id))
    assert [first.artifacts[0].parts[0].text, second.artifacts[0].parts[0].text] == ["42", "43"]  # the second needs the first
    meta = [first.artifacts[0].metadata, second.artifacts[0].metadata]
    assert [m["turn"] for m in meta] == [1, 2] and meta[0]["sessionId"] == meta[1]["sessionId"]
    session = await as_caller("alice", agent.rpc.call("session.get", {"session_id": meta[0]["sessionId"]}, "t-1"))  # a real one
    assert session["turn"] == 2 and session["status"] == "idle"

    intruder = await send(bob, message("What is that plus one?", context_id=first.context_id))
    assert intruder.artifacts[0].parts[0].text == "which number?" and intruder.artifacts[0].metadata["turn"] == 1
    assert intruder.artifacts[0].metadata["sessionId"] != meta[0]["sessionId"] and "6 * 7" not in agent.prompts[-1]
    assert [t.id for t in (await alice.list_tasks(ListTasksRequest(context_id=first.context_id))).tasks] == [second.id, first.id]
    third = await send(alice, message("What is 6 * 7?", context_id=first.context_id))
    assert third.artifacts[0].metadata["turn"] == 3 and "which number" not in agent.prompts[-1]

    await as_caller("alice", agent.rpc.call("session.close", {"session_id": meta[0]["sessionId"]}, "t-2"))  # closed: a new one
    fourth = await send(alice, message("What is 6 * 7?", context_id=first.context_id))
    assert fourth.artifacts[0].metadata["turn"] == 1 and fourth.artifacts[0].metadata["sessionId"] != meta[0]["sessionId"]


async def test_a_cancel_and_a_resubscription_reach_a_task_running_on_another_replica(tmp_path, http_clients):
    board = TaskBoard()
    one, two = Agent(tmp_path, board=board), Agent(tmp_path, board=board)  # two replicas: one board, one store
    as_alice = ServerCallContext(user=principal_user("alice"))
    token = CURRENT_PRINCIPAL.set(CALLERS["alice"])  # what the auth gate sets (the handler is called directly:
    try:  # httpx's in-process transport would hold a streamed answer until it ends)
        events = one.server.handler.on_message_send_stream(message("[hang] What is 6 * 7?", strategy="chain_of_thought"), as_alice)
        async for event in events:
            if isinstance(event, TaskStatusUpdateEvent) and event.status.state == TaskState.TASK_STATE_WORKING:
                task_id = event.task_id
                break
        assert await two.server.handler._active_task_registry.get(task_id) is None  # not running on replica two
        resubscribed = two.server.handler.on_subscribe_to_task(SubscribeToTaskRequest(id=task_id), as_alice)
        snapshot = await anext(resubscribed)
        assert snapshot.status.state == TaskState.TASK_STATE_WORKING
        on_two = await two.client("alice", http_clients)
        cancelled = await on_two.cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        tail = await asyncio.wait_for(_all(resubscribed), 10)  # replica two tails the task's events until it ends
        assert tail and tail[-1].status.state == TaskState.TASK_STATE_CANCELED
        rest = await asyncio.wait_for(_all(events), 10)  # the original stream, on replica one, ends cancelled too
        assert rest[-1].status.state == TaskState.TASK_STATE_CANCELED
    finally:
        CURRENT_PRINCIPAL.reset(token)
    for _ in range(50):  # replica one stopped its run
        if await one.server.handler._active_task_registry.get(task_id) is None:
            break
        await asyncio.sleep(0.1)
    assert await one.server.handler._active_task_registry.get(task_id) is None and one.llm.stopped == 1  # its model call too
    final = await on_two.get_task(GetTaskRequest(id=task_id))
    assert final.status.state == TaskState.TASK_STATE_CANCELED and not final.artifacts


async def test_a_cancel_on_the_replica_running_the_task_stops_its_model_call(tmp_path, http_clients):
    agent = Agent(tmp_path)
    as_alice = ServerCallContext(user=principal_user("alice"))
    token = CURRENT_PRINCIPAL.set(CALLERS["alice"])
    try:
        events = agent.server.handler.on_message_send_stream(message("[hang] What is 6 * 7?", strategy="chain_of_thought"), as_alice)
        async for event in events:
            if isinstance(event, TaskStatusUpdateEvent) and event.status.state == TaskState.TASK_STATE_WORKING:
                task_id = event.task_id
                break
        cancelled = await (await agent.client("alice", http_clients)).cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        await asyncio.wait_for(_all(events), 10)
    finally:
        CURRENT_PRINCIPAL.reset(token)
    for _ in range(50):
        if agent.llm.stopped:
            break
        await asyncio.sleep(0.1)
    assert agent.llm.stopped == 1


async def _all(stream) -> list:
    return [e async for e in stream]


async def test_the_board_versions_writes_lets_a_cancel_win_and_keeps_owners_apart():
    board = TaskBoard()
    working, cancelled, completed = TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_COMPLETED
    assert await board.commit("t", "alice", 0, working, {"id": "t"}) == 1
    assert await board.commit("t", "alice", 1, working, {"id": "t"}) == 2
    assert await board.commit("t", "alice", 1, working, {"id": "t"}) == CONFLICT  # stale
    assert await board.commit("t", "bob", 2, working, {"id": "t"}) == NOT_YOURS
    assert await board.get("t", "bob") is None and (await board.get("t", "alice"))[1] == 2
    assert await board.commit("t", "alice", 0, cancelled, {"id": "t"}) == 3  # a cancel skips the version check
    assert await board.commit("t", "alice", 3, completed, {"id": "t"}) == CONFLICT  # an ended task stays ended
    await board.publish("t", 3, {"statusUpdate": {"taskId": "t"}})
    items, cursor = await board.events("t", 0, 0.01)
    assert [i["version"] for i in items] == [3] and cursor == 1
    assert await board.events("t", cursor, 0.01) == ([], 1) and await board.events("nope", 0, 0.01) is None


# -- the task store on both stores ---------------------------------------------------------------------------


@pytest.fixture(params=["files", "postgresql"])
async def repo(request, tmp_path):
    if request.param == "files":
        yield open_a2a(None, tmp_path / "sessions")
        return
    pg = request.getfixturevalue("postgres")
    made = open_a2a(pg.url, tmp_path / "unused")
    await made.db.fetch("TRUNCATE a2a_tasks, a2a_conversations")
    yield made
    await made.db.aclose()  # the pool of this test's event loop


def task(task_id: str, context: str, answer: str | None, seconds: int) -> Task:
    made = Task(id=task_id, context_id=context, history=[Message(role=Role.ROLE_USER, message_id=task_id, parts=[Part(text="q")])])
    made.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED if answer else TaskState.TASK_STATE_WORKING))
    made.status.timestamp.FromSeconds(seconds)
    if answer:
        made.artifacts.append(Artifact(artifact_id=f"a-{task_id}", parts=[Part(text=answer)]))
    return made


async def test_the_task_store_keeps_owned_tasks_lists_pages_and_filters(repo):
    store, alice, bob = (
        SharedTaskStore(repo, TaskBoard()),
        ServerCallContext(user=principal_user("alice")),
        ServerCallContext(user=principal_user("bob")),
    )

    async def save(on: SharedTaskStore, task: Task, context: ServerCallContext) -> None:
        await on.save(task, event=None, prev=None, prev_version=TaskVersion.MISSING, context=context)

    for i, (context, answer) in enumerate([("c1", "42"), ("c1", "43"), ("c2", None)], start=1):
        await save(store, task(f"t{i}", context, answer, i), alice)
    await save(store, task("b1", "c1", "x", 9), bob)
    assert (await store.get("t2", alice)).task.artifacts[0].parts[0].text == "43"
    assert await store.get("t2", bob) is None and await store.get("nope", alice) is None
    assert await store.get("t2", ServerCallContext()) is None  # no owner (authentication off) is an owner of its own
    first = await store.list(ListTasksRequest(page_size=2), alice)
    assert [t.id for t in first.tasks] == ["t3", "t2"] and first.total_size == 3 and first.next_page_token
    rest = await store.list(ListTasksRequest(page_size=2, page_token=first.next_page_token), alice)
    assert [t.id for t in rest.tasks] == ["t1"] and not rest.next_page_token
    assert [t.id for t in (await store.list(ListTasksRequest(context_id="c1"), alice)).tasks] == ["t2", "t1"]
    assert [t.id for t in (await store.list(ListTasksRequest(status=TaskState.TASK_STATE_WORKING), alice)).tasks] == ["t3"]
    assert [t.id for t in (await store.list(ListTasksRequest(), bob)).tasks] == ["b1"]
    for on in (store, SharedTaskStore(repo, TaskBoard())):  # bob cannot overwrite alice's task under its id, live or stored
        with pytest.raises(TaskNotFoundError):
            await save(on, task("t1", "c9", "mine now", 10), bob)
    await store.delete("t1", bob)
    assert await store.get("t1", alice) is not None
    await store.delete("t1", alice)
    assert await store.get("t1", alice) is None
    assert await SharedTaskStore(repo, TaskBoard()).get("t2", alice) is not None  # the durable copy, the board restarted


async def test_a_context_is_bound_to_one_session_per_owner_and_survives_a_new_process(repo, tmp_path):
    contexts = ContextSessions(repo)
    assert await contexts.session_of("alice", "c1") is None
    assert await contexts.bind("alice", "c1", "s-1") == "s-1"
    assert await contexts.bind("alice", "c1", "s-2") == "s-1"  # a concurrent first message: the winner's session
    again = ContextSessions(open_a2a(getattr(repo.db, "url", None), tmp_path / "sessions"))
    assert await again.session_of("alice", "c1") == "s-1"
    assert await again.session_of("bob", "c1") is None and await again.session_of(None, "c1") is None
    assert await again.bind("alice", "c1", "s-3", replacing="s-1") == "s-3"  # its session was closed: a new one
    assert await contexts.session_of("alice", "c1") == "s-3"


# -- remote A2A agents in the agent directory ------------------------------------------------------------------


class RemoteAgent:
    """Another A2A agent (a second ReasonRay A2A server, auth off) with its card, reachable over `http`."""

    def __init__(self, tmp_path) -> None:
        reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought")
        self.llm = FunctionLLM(lambda request: "<answer>remote says 42</answer>")
        rpc = local_dispatcher(reasoning, self.llm, data_dir=tmp_path / "remote")
        self.server = A2AServer(
            rpc, build_catalogue(StrategyRegistry().discover(), reasoning), SqliteRepository(tmp_path / "remote"), "9.9"
        )

        async def card(request):
            from starlette.responses import JSONResponse

            return JSONResponse(agent_card_to_dict(self.server.card("http://remote.test")))

        app = Starlette(
            routes=[Route("/a2a", self.server.handle, methods=["POST"]), Route("/.well-known/agent-card.json", card, methods=["GET"])]
        )
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://remote.test", timeout=30)


async def test_a_remote_agent_registers_by_its_card_url_advertises_its_skills_and_answers_forwarded_runs(tmp_path):
    from reasonray.api.a2a_remote import forward, remote_registration
    from reasonray.api.access.egress import Egress
    from reasonray.kernel.egress_settings import EgressSettings
    from reasonray.kernel.errors import InvalidParamsError
    from reasonray.strategies.agents import AgentRegistration

    remote = RemoteAgent(tmp_path)
    egress = Egress(EgressSettings(allow_hosts=["remote.test:80"]))
    try:
        asked = AgentRegistration(
            id="far", name="Far away", capabilities=["remote"], a2a_card_url="http://remote.test/.well-known/agent-card.json"
        )
        registered = await remote_registration(asked, egress, remote.http)
        assert registered.capabilities == ["a2a.skill.chain_of_thought", "remote"] and registered.remote_skills == ["chain_of_thought"]
        assert registered.description.startswith("LLM reasoning on Ray")  # the card's, as none was given
        result = await forward(registered.model_dump(), "What is 6 * 7?", "chain_of_thought", "trace-x", egress, http=remote.http)
        assert result.answer == "remote says 42" and result.strategy_used == "a2a:far"
        assert result.metrics.strategy_specific["remote"]["state"] == "TASK_STATE_COMPLETED"
        assert remote.llm.requests  # the remote agent's model answered
        with pytest.raises(InvalidParamsError, match="no valid A2A agent card"):
            await remote_registration(asked.model_copy(update={"a2a_card_url": "http://remote.test/nothing.json"}), egress, remote.http)
        with pytest.raises(InvalidParamsError, match="not local strategies"):
            await remote_registration(
                asked.model_copy(update={"capabilities": ["reasoning.strategy.chain_of_thought"]}), egress, remote.http
            )
    finally:
        await remote.http.aclose()


def test_a_remote_card_is_validated_against_its_skills_not_the_local_catalogue():
    from reasonray.kernel.errors import InvalidParamsError
    from reasonray.strategies.agents import AgentRegistration, validate_card

    catalogue = build_catalogue(StrategyRegistry().discover(), ReasoningSettings(enabled_strategies=["chain_of_thought"]))
    card = AgentRegistration(
        id="far", name="Far", capabilities=["a2a.skill.tot"], default_strategy="tot", a2a_card_url="http://x/.well-known/agent-card.json"
    )
    assert validate_card(card, catalogue, ["reasoning.execute"]) == card  # tree_of_thought is not enabled here: no matter
    with pytest.raises(InvalidParamsError, match="is not one of the remote agent's skills"):
        validate_card(card.model_copy(update={"default_strategy": "other"}), catalogue, ["reasoning.execute"])
    with pytest.raises(InvalidParamsError, match="advertises no skills"):
        validate_card(card.model_copy(update={"capabilities": ["x"], "default_strategy": None}), catalogue, ["reasoning.execute"])
