"""The A2A agent in one process: the card, runs through the tenancy guard (roles, budgets, audit), tasks and
contexts owned by their principal, and the task store on files and on PostgreSQL."""

from __future__ import annotations

import json

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.server.context import ServerCallContext
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
)
from a2a.utils.errors import TaskNotFoundError
from starlette.applications import Starlette
from starlette.routing import Route

from reasonray.api.a2a import A2AServer, agent_card, auth_configured, card_json
from reasonray.api.a2a_store import Conversations, FileRepository, OwnedTaskStore, PrincipalUser, repository
from reasonray.api.app import local_dispatcher
from reasonray.api.audit import JsonlAuditLog
from reasonray.api.auth import CURRENT_PRINCIPAL, Policy, Principal
from reasonray.api.limits import LocalLimits, RateLimiter
from reasonray.api.tenancy import Guard, LocalOwners, OwnershipTable, install_guard
from reasonray.gateway.testing import FunctionLLM
from reasonray.kernel.auth_settings import AuthSettings
from reasonray.kernel.config import ReasoningSettings
from reasonray.strategies.registry import StrategyRegistry, build_catalogue

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
    secured = card_json(agent_card(CATALOGUE, "http://host:8000", "0.1.0", bearer=True))
    assert secured["securitySchemes"]["bearer"]["httpAuthSecurityScheme"] == {"scheme": "Bearer", "bearerFormat": "JWT"}
    assert secured["securityRequirements"] == [{"schemes": {"bearer": {}}}]


def test_auth_is_read_defensively():
    class Auth:
        enabled = True

    class WithAuth:
        auth = Auth()

    assert auth_configured(WithAuth()) and not auth_configured(object())


# -- the agent in one process, authentication on ----------------------------------------------------------

ROLES = {
    "reasoner": {"methods": ["reasoning.*"], "strategies": ["*"]},
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


class Agent:
    """The A2A route over a guarded dispatcher; `Authorization: Bearer <name>` stands for a verified token."""

    def __init__(self, tmp_path, **auth) -> None:
        reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought", "tree_of_thought"], default_strategy="chain_of_thought")
        self.prompts: list[str] = []
        self.llm = FunctionLLM(self._reply)
        self.rpc = local_dispatcher(reasoning, self.llm, data_dir=tmp_path)
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
        self.repo = FileRepository(tmp_path / "sessions")
        self.server = A2AServer(self.rpc, build_catalogue(StrategyRegistry().discover(), reasoning), self.repo, "0.1.0", bearer=True)
        self.app = Starlette(routes=[Route("/a2a", self.server.handle, methods=["POST"])])

    def _reply(self, request) -> str:
        self.prompts.append(request.messages[-1].content)
        answer = "42" if "6 * 7" in request.messages[-1].content.split("Now:")[-1] else "5"
        return f"<thinking>easy</thinking><answer>{answer}</answer>"

    async def __call__(self, scope, receive, send):
        """What the ingress's auth gate does: the verified caller in CURRENT_PRINCIPAL around the route."""
        header = dict(scope["headers"]).get(b"authorization", b"").decode()
        token = CURRENT_PRINCIPAL.set(CALLERS.get(header.removeprefix("Bearer ")))
        try:
            await self.app(scope, receive, send)
        finally:
            CURRENT_PRINCIPAL.reset(token)

    async def client(self, who: str, http_clients: list):
        http = httpx.AsyncClient(transport=httpx.ASGITransport(self), headers={"Authorization": f"Bearer {who}"}, timeout=30)
        http_clients.append(http)
        return await create_client(self.server.card("http://agent"), ClientConfig(httpx_client=http, streaming=False))


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


async def test_a_role_without_the_method_or_the_strategy_gets_a_rejected_task_and_no_run(tmp_path, http_clients):
    agent = Agent(tmp_path)
    rita, carol = await agent.client("rita", http_clients), await agent.client("carol", http_clients)
    refused = await send(rita, message("What is 6 * 7?"))
    assert refused.status.state == TaskState.TASK_STATE_REJECTED and not refused.artifacts
    assert "may not call reasoning.execute" in refused.status.message.parts[0].text
    assert refused.status.message.metadata["code"] == -32003
    wrong_strategy = await send(carol, message("What is 6 * 7?", strategy="tree_of_thought"))
    assert wrong_strategy.status.state == TaskState.TASK_STATE_REJECTED
    assert "may not run strategy 'tree_of_thought'" in wrong_strategy.status.message.parts[0].text
    assert agent.llm.requests == []  # refused before the first model call
    allowed = await send(carol, message("What is 6 * 7?", strategy="chain_of_thought"))
    assert allowed.status.state == TaskState.TASK_STATE_COMPLETED and allowed.artifacts[0].parts[0].text == "42"
    records = [json.loads(line) for line in agent.audit_path.read_text().splitlines()]
    assert [(r["principal"], r["method"], r["outcome"]) for r in records] == [
        ("rita", "reasoning.execute", "forbidden"),
        ("carol", "reasoning.execute", "forbidden"),
        ("carol", "reasoning.execute", "ok"),
    ]
    assert records[-1]["trace_id"] == allowed.artifacts[0].metadata["trace_id"]


async def test_a2a_runs_are_charged_to_the_callers_token_budget_and_refused_past_it(tmp_path, http_clients):
    agent = Agent(tmp_path, principals={"tess": {"tokens_per_day": 1}})
    tess = await agent.client("tess", http_clients)
    ran = await send(tess, message("What is 6 * 7?"))
    assert agent.limiter.usage("tess")["tokens_today"] == ran.artifacts[0].metadata["total_tokens"] > 0
    over = await send(tess, message("What is 2 + 3?"))
    assert over.status.state == TaskState.TASK_STATE_REJECTED
    assert over.status.message.metadata["code"] == -32012 and over.status.message.metadata["retry_after_s"] > 0
    assert over.status.message.metadata["limit_name"] == "tokens_per_day" and "token budget" in over.status.message.parts[0].text


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
    as_bob = ServerCallContext(user=PrincipalUser("bob"))
    with pytest.raises(TaskNotFoundError):  # resubscribing
        [e async for e in agent.server.handler.on_subscribe_to_task(SubscribeToTaskRequest(id=hers.id), as_bob)]


async def test_a_context_continues_for_its_owner_and_is_a_fresh_conversation_for_anyone_else(tmp_path, http_clients):
    agent = Agent(tmp_path)
    alice, bob = await agent.client("alice", http_clients), await agent.client("bob", http_clients)
    first = await send(alice, message("What is 6 * 7?"))
    second = await send(alice, message("What is 2 + 3?", context_id=first.context_id))
    assert [first.artifacts[0].metadata["turn"], second.artifacts[0].metadata["turn"]] == [1, 2]
    assert "User: What is 6 * 7?" in agent.prompts[-1] and "Assistant: 42" in agent.prompts[-1]
    assert agent.prompts[-1].endswith("Now: What is 2 + 3?")

    intruder = await send(bob, message("What did I ask first?", context_id=first.context_id))
    assert intruder.status.state == TaskState.TASK_STATE_COMPLETED and intruder.artifacts[0].metadata["turn"] == 1
    assert "6 * 7" not in agent.prompts[-1] and "Earlier in this conversation" not in agent.prompts[-1]
    assert [t.id for t in (await alice.list_tasks(ListTasksRequest(context_id=first.context_id))).tasks] == [second.id, first.id]
    third = await send(alice, message("And 6 * 7 again?", context_id=first.context_id))
    assert third.artifacts[0].metadata["turn"] == 3 and "What did I ask first" not in agent.prompts[-1]


# -- the task store on both stores ---------------------------------------------------------------------------


@pytest.fixture(params=["files", "postgresql"])
async def repo(request, tmp_path):
    if request.param == "files":
        yield repository(None, tmp_path / "sessions")
        return
    pg = request.getfixturevalue("postgres")
    made = repository(pg.url, tmp_path / "unused")
    await made.fetch("TRUNCATE a2a_tasks, a2a_conversations")
    yield made
    await made.aclose()  # the pool of this test's event loop


def task(task_id: str, context: str, answer: str | None, seconds: int) -> Task:
    made = Task(id=task_id, context_id=context, history=[Message(role=Role.ROLE_USER, message_id=task_id, parts=[Part(text="q")])])
    made.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED if answer else TaskState.TASK_STATE_WORKING))
    made.status.timestamp.FromSeconds(seconds)
    if answer:
        made.artifacts.append(Artifact(artifact_id=f"a-{task_id}", parts=[Part(text=answer)]))
    return made


async def test_the_task_store_keeps_owned_tasks_lists_pages_and_filters(repo):
    store, alice, bob = OwnedTaskStore(repo), ServerCallContext(user=PrincipalUser("alice")), ServerCallContext(user=PrincipalUser("bob"))
    for i, (context, answer) in enumerate([("c1", "42"), ("c1", "43"), ("c2", None)], start=1):
        await store.save(task(f"t{i}", context, answer, i), alice)
    await store.save(task("b1", "c1", "x", 9), bob)
    assert (await store.get("t2", alice)).artifacts[0].parts[0].text == "43"
    assert await store.get("t2", bob) is None and await store.get("nope", alice) is None
    assert await store.get("t2", ServerCallContext()) is None  # no owner (authentication off) is an owner of its own
    first = await store.list(ListTasksRequest(page_size=2), alice)
    assert [t.id for t in first.tasks] == ["t3", "t2"] and first.total_size == 3 and first.next_page_token
    rest = await store.list(ListTasksRequest(page_size=2, page_token=first.next_page_token), alice)
    assert [t.id for t in rest.tasks] == ["t1"] and not rest.next_page_token
    assert [t.id for t in (await store.list(ListTasksRequest(context_id="c1"), alice)).tasks] == ["t2", "t1"]
    assert [t.id for t in (await store.list(ListTasksRequest(status=TaskState.TASK_STATE_WORKING), alice)).tasks] == ["t3"]
    assert [t.id for t in (await store.list(ListTasksRequest(), bob)).tasks] == ["b1"]
    with pytest.raises(TaskNotFoundError):  # bob cannot overwrite alice's task under its id
        await store.save(task("t1", "c9", "mine now", 10), bob)
    await store.delete("t1", bob)
    assert await store.get("t1", alice) is not None
    await store.delete("t1", alice)
    assert await store.get("t1", alice) is None


async def test_a_conversation_is_per_owner_and_context_and_survives_a_new_process(repo, tmp_path):
    conversations = Conversations(repo)
    assert await conversations.append("alice", "c1", "What is 6 * 7?", "42", "t1", "trace-1") == 1
    assert await conversations.append("alice", "c1", "And plus 1?", "43", "t2", "trace-2") == 2
    again = Conversations(repository(getattr(repo, "url", None), tmp_path / "sessions"))
    assert [(e.turn, e.question, e.answer) for e in await again.exchanges("alice", "c1")] == [
        (1, "What is 6 * 7?", "42"),
        (2, "And plus 1?", "43"),
    ]
    assert await again.exchanges("bob", "c1") == [] and await again.exchanges(None, "c1") == []
