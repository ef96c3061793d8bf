"""The A2A agent's pure parts: the card from the catalogue (with and without auth) and the task store."""

from __future__ import annotations

from a2a.types.a2a_pb2 import Artifact, ListTasksRequest, Message, Part, Role, Task, TaskState, TaskStatus

from reasonray.api.a2a import FileTaskStore, agent_card, auth_configured, card_json

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


def task(task_id: str, context: str, question: str, answer: str | None, seconds: int) -> Task:
    made = Task(id=task_id, context_id=context, history=[Message(role=Role.ROLE_USER, message_id=task_id, parts=[Part(text=question)])])
    made.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED if answer else TaskState.TASK_STATE_WORKING))
    made.status.timestamp.FromSeconds(seconds)
    if answer:
        made.artifacts.append(Artifact(artifact_id=f"a-{task_id}", parts=[Part(text=answer)]))
    return made


async def test_the_task_store_keeps_tasks_as_files_lists_pages_and_gives_a_contexts_exchanges(tmp_path):
    store = FileTaskStore(tmp_path)
    await store.save(task("t1", "c1", "What is 6 * 7?", "42", 1))
    await store.save(task("t2", "c1", "And plus 1?", "43", 2))
    await store.save(task("t3", "c2", "Other", None, 3))
    assert (await FileTaskStore(tmp_path).get("t2")).artifacts[0].parts[0].text == "43"  # survives a new process
    assert await store.get("nope") is None
    page = await store.list(ListTasksRequest(page_size=2))
    assert [t.id for t in page.tasks] == ["t3", "t2"] and page.next_page_token == "2" and page.total_size == 3
    assert [t.id for t in (await store.list(ListTasksRequest(context_id="c1"))).tasks] == ["t2", "t1"]
    assert await store.exchanges("c1", before="t9") == [("What is 6 * 7?", "42"), ("And plus 1?", "43")]
    assert await store.exchanges("c2", before="t9") == []  # not completed
    await store.delete("t1")
    assert await store.get("t1") is None
    assert sorted(p.name for p in (tmp_path / "a2a" / "tasks").iterdir()) == ["t2.json", "t3.json"]
