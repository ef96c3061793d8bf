"""ReasonRay as an A2A agent, with the official a2a-sdk (docs/interop.md).

- `agent_card`: the card at `/.well-known/agent-card.json`, generated from the strategy catalogue:
  one skill per enabled strategy, streaming, the JSON-RPC interface at `/a2a` with its protocol
  version, a bearer scheme when authentication is configured.
- `ReasoningExecutor`: the SDK's `AgentExecutor`. `SendMessage` is one `reasoning.execute` call through the
  JSON-RPC dispatcher, guard included (the strategy named by the message's or request's metadata,
  `strategy` or `skill`, else the default; `strategy_config` too); its events stream as task status
  updates and its answer arrives as an artifact. Cancelling the task cancels the run. A refused caller
  gets a `rejected` task saying why.
- Tasks and the conversation of each context live in the sessions' store, owned by the caller
  (`reasonray.api.a2a_store`); each new message of a context is reasoned about with the context's
  earlier exchanges.

Transport-free: the Serve ingress forwards `/a2a` and the card route to what is built here.
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from a2a.helpers.proto_helpers import new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes
from a2a.server.tasks import TaskUpdater
from a2a.types import a2a_pb2
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    Task,
    TaskState,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT
from google.protobuf import json_format

from reasonray.api.a2a_store import CallerContextBuilder, Conversations, Exchange, OwnedTaskStore, Repository, owner_of
from reasonray.api.jsonrpc import FORBIDDEN, RATE_LIMITED, UNAUTHENTICATED, Dispatcher, RpcError
from reasonray.api.streaming import CallResult, stream_call
from reasonray.kernel import tracing
from reasonray.kernel.events import BranchRun, Event, IterationEnd, LLMInvocation, MemoryRetrieval
from reasonray.strategies.registry import Catalogue

log = structlog.get_logger(__name__)

A2A_PATH = "/a2a"
HISTORY_TURNS = 8  # earlier exchanges of a context a new message is reasoned with
REFUSALS = frozenset({UNAUTHENTICATED, FORBIDDEN, RATE_LIMITED})  # the guard refused before any run: the task is rejected
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


def _query(text: str, earlier: list[Exchange]) -> str:
    """The run's problem: the new message, after the context's earlier exchanges when it has any (a strategy
    takes one problem statement, so the conversation so far is written into it)."""
    if not earlier:
        return text
    lines = ["Earlier in this conversation:"]
    for exchange in earlier:
        lines += [f"User: {exchange.question}", f"Assistant: {exchange.answer}"]
    return "\n".join([*lines, "", f"Now: {text}"])


def _refusal(error: dict[str, Any]) -> str:
    """The status line of a run that did not answer: the JSON-RPC error's message and code."""
    return f"{error['message']} (code {error['code']})"[:2000]


class ReasoningExecutor(AgentExecutor):
    """Runs one `reasoning.execute` call per A2A task through the JSON-RPC dispatcher, so the caller meets the
    same guard as on `POST /rpc` (roles per method and strategy, agent binding, rate limits, token budgets
    charged with what the run used, the audit record); progress as status updates, the answer as an artifact."""

    def __init__(self, rpc: Dispatcher, conversations: Conversations) -> None:
        self.rpc = rpc
        self.conversations = conversations

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
        owner = owner_of(context.call_context)
        text = context.get_user_input()
        earlier = await self.conversations.exchanges(owner, task.context_id)

        def say(line: str) -> a2a_pb2.Message:
            return new_text_message(line, context_id=task.context_id, task_id=task.id)

        await updater.start_work(say(f"reasoning with {strategy or 'the default strategy'} (trace {trace_id})"))
        params = {"query": _query(text, earlier[-HISTORY_TURNS:]), "strategy": strategy, "strategy_config": config}
        result: dict[str, Any] = {}
        try:
            async for item in stream_call(self.rpc, "reasoning.execute", {k: v for k, v in params.items() if v is not None}, trace_id):
                if isinstance(item, CallResult):
                    result = item.value
                elif isinstance(item, Event) and (line := _progress(item)) is not None:
                    await updater.update_status(TaskState.TASK_STATE_WORKING, say(line))
        except RpcError as error:
            await self._not_answered(updater, say, error.body(), task.id)
            return
        turn = await self.conversations.append(owner, task.context_id, text, result["answer"], task.id, trace_id)
        metadata = {
            "strategy_used": result["strategy_used"],
            "trace_id": trace_id,
            "total_tokens": result["metrics"]["total_tokens"],
            "turn": turn,
        }
        await updater.add_artifact([new_text_part(result["answer"])], name="answer", metadata=metadata, last_chunk=True)
        await updater.complete()

    @staticmethod
    async def _not_answered(updater: TaskUpdater, say: Any, error: dict[str, Any], task_id: str) -> None:
        """A refused caller (401/403/429: no run started) gets a `rejected` task, a run that failed a `failed`
        one; the status message says why and carries the error's code and type, and for a rate limit its
        `limit_name` and `retry_after_s`."""
        message = say(_refusal(error))
        data = error.get("data") or {}
        message.metadata.update(
            {"code": error["code"], **{k: data[k] for k in ("error_type", "retry_after_s", "limit_name", "trace_id") if k in data}}
        )
        if error["code"] in REFUSALS:
            await updater.reject(message)
        else:
            await updater.failed(message)
        log.info("a2a.task_not_answered", task_id=task_id, code=error["code"], error_type=data.get("error_type"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """The run's asyncio task was cancelled by the SDK (the run stops with it): say so."""
        assert context.task_id and context.context_id
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def card_json(card: AgentCard) -> dict[str, Any]:
    """The card as the SDK serves it (camelCase JSON)."""
    return agent_card_to_dict(card)


def auth_configured(settings: Any) -> bool:
    """Whether `[auth]` asks callers for a bearer token (read defensively: the section may not exist)."""
    auth = getattr(settings, "auth", None)
    return bool(auth is not None and getattr(auth, "enabled", False))


class A2AServer:
    """The a2a-sdk request handler and JSON-RPC route, running tasks through the ingress's dispatcher `rpc` (and
    so through its guard when authentication is on) and keeping them in `repo`, for the ingress to mount."""

    def __init__(self, rpc: Dispatcher, catalogue: Catalogue, repo: Repository, version: str, *, bearer: bool = False) -> None:
        self.catalogue = catalogue
        self.version = version
        self.bearer = bearer
        self.store = OwnedTaskStore(repo)
        self.handler = DefaultRequestHandler(
            agent_executor=ReasoningExecutor(rpc, Conversations(repo)), task_store=self.store, agent_card=self.card("")
        )
        [route] = create_jsonrpc_routes(self.handler, rpc_url=A2A_PATH, context_builder=CallerContextBuilder())
        self.handle = route.endpoint  # Starlette endpoint: Request in, Response (JSON or SSE) out

    def card(self, base_url: str) -> AgentCard:
        return agent_card(self.catalogue.describe(), base_url, self.version, bearer=self.bearer)
