"""ReasonRay as an A2A agent, with the official a2a-sdk (docs/interop.md).

- `agent_card`: the card at `/.well-known/agent-card.json`, generated from the strategy catalogue:
  one skill per enabled strategy, streaming, the JSON-RPC interface at `/a2a` with its protocol
  version, a bearer scheme when authentication is configured.
- `ReasoningExecutor`: the SDK's `AgentExecutor`. `SendMessage` runs a reasoning run (the strategy named
  by the message's or request's metadata, `strategy` or `skill`, else the default; `strategy_config` too); its events stream as
  task status updates and its answer arrives as an artifact. Cancelling the task cancels the run.
- `FileTaskStore`: the SDK's `TaskStore` over the data directory, beside the sessions
  (`<data_dir>/sessions/a2a/`); a context (`context_id`) is a conversation kept there too: each new
  message of a context is reasoned about with the context's earlier exchanges.

Transport-free: the Serve ingress forwards `/a2a` and the card route to what is built here.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import uuid
from pathlib import Path
from typing import Any

import structlog
from a2a.helpers.proto_helpers import get_message_text, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes
from a2a.server.tasks import TaskStore, TaskUpdater
from a2a.types import a2a_pb2
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    Message,
    SecurityRequirement,
    SecurityScheme,
    Task,
    TaskState,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT
from google.protobuf import json_format
from pydantic import ValidationError

from reasonray.api.service import ExecuteParams, ReasoningService
from reasonray.kernel import tracing
from reasonray.kernel.errors import ReasonRayError
from reasonray.kernel.events import BranchRun, Event, IterationEnd, LLMInvocation, MemoryRetrieval
from reasonray.kernel.storage import write_atomic

log = structlog.get_logger(__name__)

A2A_PATH = "/a2a"
HISTORY_TURNS = 8  # earlier exchanges of a context a new message is reasoned with
EXAMPLES = {
    "chain_of_thought": "What is 17 * 23?",
    "bounded_context": "Prove that the sum of the first n odd numbers is n squared, step by step.",
    "tree_of_thought": "Use 4, 7, 8 and 8 with + - * / to make 24.",
    "self_consistency": "A bat and a ball cost 1.10 in total; the bat costs 1.00 more than the ball. What does the ball cost?",
    "react": "Compute the sum of the squares of 1 to 10 with the python tool.",
    "refine": "Write a one-sentence definition of entropy, then improve it.",
    "matts": "How many prime numbers are there below 100?",
}


def agent_card(catalogue: dict[str, Any], base_url: str, version: str, *, bearer: bool = False) -> AgentCard:
    """The agent card: one skill per enabled strategy (`reasoning.strategies`' description)."""
    skills = [
        AgentSkill(
            id=s["name"],
            name=s["name"].replace("_", " "),
            description=s.get("description") or f"Reason with the {s['name']} strategy.",
            tags=["reasoning", *(c.removeprefix("reasoning.") for c in s.get("capabilities", []))],
            examples=[EXAMPLES.get(s["name"], "What is 12 * 12?")],
        )
        for s in catalogue["strategies"]
    ]
    default = catalogue.get("default_strategy")
    card = AgentCard(
        name="ReasonRay",
        description="LLM reasoning on Ray: pluggable strategies (choose one with the message metadata `strategy`, "
        f"or a skill id as `skill`; default {default or 'none'}), memory, sessions.",
        version=version,
        supported_interfaces=[
            AgentInterface(url=base_url.rstrip("/") + A2A_PATH, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_CURRENT)
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=skills,
        documentation_url=base_url.rstrip("/") + "/docs",
    )
    if bearer:  # [auth] is configured: callers send `Authorization: Bearer <JWT>`
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer", bearer_format="JWT"))
        )
        requirement = SecurityRequirement()
        requirement.schemes["bearer"].SetInParent()
        card.security_requirements.append(requirement)
    return card


class FileTaskStore(TaskStore):
    """A2A tasks as JSON files under the sessions' directory, replaced atomically (one per task)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / "a2a" / "tasks"

    def _path(self, task_id: str) -> Path:
        return self.root / f"{uuid.UUID(task_id).hex if _is_uuid(task_id) else _safe(task_id)}.json"

    async def save(self, task: Task, context: ServerCallContext | None = None) -> None:
        await asyncio.to_thread(write_atomic, self._path(task.id), json_format.MessageToJson(task).encode())

    async def get(self, task_id: str, context: ServerCallContext | None = None) -> Task | None:
        path = self._path(task_id)
        if not path.exists():
            return None
        task: Task = json_format.Parse(await asyncio.to_thread(path.read_bytes), Task())
        return task

    async def list(self, params: a2a_pb2.ListTasksRequest, context: ServerCallContext | None = None) -> a2a_pb2.ListTasksResponse:
        tasks = await asyncio.to_thread(self._all)
        if params.context_id:
            tasks = [t for t in tasks if t.context_id == params.context_id]
        if params.status:
            tasks = [t for t in tasks if t.status.state == params.status]
        tasks.sort(key=lambda t: (t.status.timestamp.ToNanoseconds(), t.id), reverse=True)
        size = params.page_size or 50
        start = int(params.page_token) if params.page_token.isdigit() else 0
        page = tasks[start : start + size]
        following = str(start + size) if start + size < len(tasks) else ""
        return a2a_pb2.ListTasksResponse(tasks=page, next_page_token=following, page_size=size, total_size=len(tasks))

    async def delete(self, task_id: str, context: ServerCallContext | None = None) -> None:
        self._path(task_id).unlink(missing_ok=True)

    def _all(self) -> builtins.list[Task]:  # builtins: the class's own `list` method shadows the type here
        if not self.root.exists():
            return []
        return [json_format.Parse(p.read_bytes(), Task()) for p in self.root.glob("*.json")]

    async def exchanges(self, context_id: str, before: str) -> builtins.list[tuple[str, str]]:
        """The context's earlier completed exchanges (question, answer), oldest first."""
        tasks = [t for t in await asyncio.to_thread(self._all) if t.context_id == context_id and t.id != before]
        tasks = [t for t in tasks if t.status.state == TaskState.TASK_STATE_COMPLETED and t.history and t.artifacts]
        tasks.sort(key=lambda t: t.status.timestamp.ToNanoseconds())
        return [(get_message_text(t.history[0]), "".join(p.text for p in t.artifacts[-1].parts)) for t in tasks[-HISTORY_TURNS:]]


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _safe(value: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in value)[:128]


def _progress(event: Event) -> str | None:
    """One status line for the events a caller wants to watch (None: not worth a status update)."""
    if isinstance(event, IterationEnd):
        return f"{event.strategy}: iteration {event.iteration} done ({event.completion_tokens} tokens, stop={event.stop})"
    if isinstance(event, BranchRun):
        return f"{event.strategy}: branch {event.label}[{event.index}] done ({event.llm_calls} model calls)"
    if isinstance(event, LLMInvocation):
        return f"{event.strategy}: model call done ({event.completion_tokens} tokens)"
    if isinstance(event, MemoryRetrieval):
        return "memory: retrieved"
    return None


def _choice(context: RequestContext) -> tuple[str | None, dict[str, Any] | None]:
    """`strategy` (or a skill id as `skill`) and `strategy_config` from the message's metadata, else the
    request's; (None, None): the default strategy with its defaults."""
    sources = [json_format.MessageToDict(context.message.metadata) if context.message else {}, context.metadata]
    strategy = next((s[k] for s in sources for k in ("strategy", "skill") if isinstance(s.get(k), str) and s[k]), None)
    config = next((s["strategy_config"] for s in sources if isinstance(s.get("strategy_config"), dict)), None)
    return strategy, config


def _query(text: str, earlier: list[tuple[str, str]]) -> str:
    if not earlier:
        return text
    lines = ["Earlier in this conversation:"]
    for question, answer in earlier:
        lines += [f"User: {question}", f"Assistant: {answer}"]
    return "\n".join([*lines, "", f"Now: {text}"])


class ReasoningExecutor(AgentExecutor):
    """Runs one reasoning run per A2A task; progress as status updates, the answer as an artifact."""

    def __init__(self, service: ReasoningService, store: FileTaskStore) -> None:
        self.service = service
        self.store = store

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id and context.context_id
        task = context.current_task
        if task is None:
            task = Task(
                id=context.task_id,
                context_id=context.context_id,
                status=a2a_pb2.TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message],
            )
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        strategy, config = _choice(context)
        headers = context.call_context.state.get("headers", {}) if context.call_context else {}
        trace_id = tracing.trace_id_from(headers.get("traceparent")) or tracing.current_trace_id() or uuid.uuid4().hex
        earlier = await self.store.exchanges(task.context_id, before=task.id)

        def say(text: str) -> Message:
            return new_text_message(text, context_id=task.context_id, task_id=task.id)

        await updater.start_work(say(f"reasoning with {strategy or 'the default strategy'} (trace {trace_id})"))
        lines: asyncio.Queue[str | None] = asyncio.Queue()
        pump = asyncio.create_task(self._pump(lines, updater, say))

        def observe(event: Event) -> None:
            if (line := _progress(event)) is not None:
                lines.put_nowait(line)

        try:
            params = ExecuteParams(query=_query(context.get_user_input(), earlier), strategy=strategy, strategy_config=config)
            result = await self.service.execute(params, trace_id, observe=observe)
        except (ReasonRayError, ValidationError) as exc:
            await self._drain(lines, pump)  # the caller's or the model's fault: the task fails, saying why
            await updater.failed(say(f"{type(exc).__name__}: {getattr(exc, 'message', str(exc))}"[:2000]))
            log.info("a2a.task_failed", task_id=task.id, error=type(exc).__name__)
            return
        except BaseException:
            pump.cancel()
            raise
        await self._drain(lines, pump)
        metadata = {
            "strategy_used": result.strategy_used,
            "trace_id": trace_id,
            "total_tokens": result.metrics.total_tokens,
            "turn": len(earlier) + 1,
        }
        await updater.add_artifact([new_text_part(result.answer)], name="answer", metadata=metadata, last_chunk=True)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """The run's asyncio task was cancelled by the SDK (the run stops with it): say so."""
        assert context.task_id and context.context_id
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()

    @staticmethod
    async def _pump(lines: asyncio.Queue[str | None], updater: TaskUpdater, say: Any) -> None:
        while (line := await lines.get()) is not None:
            await updater.update_status(TaskState.TASK_STATE_WORKING, say(line))

    @staticmethod
    async def _drain(lines: asyncio.Queue[str | None], pump: asyncio.Task[None]) -> None:
        lines.put_nowait(None)
        with contextlib.suppress(asyncio.CancelledError):
            await pump


def card_json(card: AgentCard) -> dict[str, Any]:
    """The card as the SDK serves it (camelCase JSON)."""
    return agent_card_to_dict(card)


def auth_configured(settings: Any) -> bool:
    """Whether `[auth]` asks callers for a bearer token (read defensively: the section may not exist)."""
    auth = getattr(settings, "auth", None)
    return bool(auth is not None and getattr(auth, "enabled", False))


class A2AServer:
    """The a2a-sdk request handler and JSON-RPC route over one reasoning service, for the ingress to mount."""

    def __init__(self, service: ReasoningService, sessions_dir: Path, version: str, *, bearer: bool = False) -> None:
        self.service = service
        self.version = version
        self.bearer = bearer
        self.store = FileTaskStore(sessions_dir)
        handler = DefaultRequestHandler(
            agent_executor=ReasoningExecutor(service, self.store), task_store=self.store, agent_card=self.card("")
        )
        [route] = create_jsonrpc_routes(handler, rpc_url=A2A_PATH)
        self.handle = route.endpoint  # Starlette endpoint: Request in, Response (JSON or SSE) out

    def card(self, base_url: str) -> AgentCard:
        return agent_card(self.service.catalogue.describe(), base_url, self.version, bearer=self.bearer)
