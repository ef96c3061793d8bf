"""ReasonRay as an A2A agent, with the official a2a-sdk (docs/interop.md).

- `agent_card`: the card at `/.well-known/agent-card.json`, generated from the strategy catalogue:
  one skill per enabled strategy, streaming, the JSON-RPC interface at `/a2a` with its protocol
  version, a bearer scheme when authentication is configured.
- `ReasoningExecutor`: the SDK's `AgentExecutor`. A message naming a strategy (`strategy`, or a skill id as
  `skill`, with `strategy_config`) or an agent (`agent_id`) is one `reasoning.execute` call through the
  JSON-RPC dispatcher, guard included; any other message is a turn of its context's ReasonRay session
  (`session.create` on the context's first message, `session.turn` after). Events stream as task status
  updates, the answer arrives as an artifact. A caller the guard refuses gets HTTP 401/403/429 with the
  JSON-RPC error and no task (`A2AServer.handle`).
- Cancelling the task cancels the run, from any replica: running tasks and their events are on the shared
  task board (`reasonray.api.surfaces.a2a_tasks.TaskBoard`), which the running replica watches.
- Tasks and each context's session binding live in the sessions' store, owned by the caller
  (`reasonray.api.surfaces.a2a_tasks`).
- `[a2a] executor` plugs in an agent executor wrapping ReasonRay's (`A2AServer`'s `executor`): a conformance
  run's scripted scenarios, for one, live with the tests that need them, not here.

Transport-free: the Serve ingress forwards `/a2a` and the card route to what is built here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import pkgutil
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextvars import ContextVar
from email.utils import formatdate
from typing import Any, TypeVar

import structlog
from a2a.auth.user import UnauthenticatedUser, User
from a2a.helpers.proto_helpers import new_task, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes, create_rest_routes
from a2a.server.routes.common import DefaultServerCallContextBuilder
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
    TaskState,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT
from a2a.utils.errors import A2AError
from google.protobuf import json_format
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from reasonray.api.access.auth import CURRENT_PRINCIPAL, principal_trace_id
from reasonray.api.errors import a2a_refused, view_of
from reasonray.api.jsonrpc import Dispatcher, ErrorObject, RpcError
from reasonray.api.results import SessionCreateResult, SessionGetResult, TurnResult
from reasonray.api.service import ExecuteResult
from reasonray.api.surfaces.a2a_tasks import (
    Board,
    BoardEventStream,
    ContextSessions,
    SharedTaskStore,
    TaskBoard,
    owner_of,
    principal_user,
)
from reasonray.api.surfaces.streaming import CallResult, stream_call
from reasonray.kernel import tracing
from reasonray.kernel.errors import ForbiddenError, NotFoundError
from reasonray.kernel.events import BranchRun, Event, IterationEnd, LLMInvocation, MemoryRetrieval
from reasonray.stores.a2a import Repository
from reasonray.strategies.registry import Catalogue

log = structlog.get_logger(__name__)
T = TypeVar("T")

A2A_PATH = "/a2a"
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
    bearer_scheme = SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer", bearer_format="JWT"))
    return AgentCard(
        name="ReasonRay",
        description="LLM reasoning on Ray: pluggable strategies (choose one with the message metadata `strategy`, "
        f"or a skill id as `skill`; default {default or 'none'}), memory, sessions (a message naming no strategy "
        "continues its context's session).",
        version=version,
        supported_interfaces=[  # one URL, two bindings: JSON-RPC posts to it, HTTP+JSON adds its paths under it
            AgentInterface(url=base_url.rstrip("/") + A2A_PATH, protocol_binding=binding, protocol_version=PROTOCOL_VERSION_CURRENT)
            for binding in ("JSONRPC", "HTTP+JSON")
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=skills,
        documentation_url=base_url.rstrip("/") + "/docs",
        # [auth] is configured: callers send `Authorization: Bearer <JWT>`
        security_schemes={"bearer": bearer_scheme} if bearer else {},
        security_requirements=[SecurityRequirement(schemes={"bearer": a2a_pb2.StringList()})] if bearer else [],
    )


_PROGRESS: dict[type[Any], Callable[[Any], str]] = {  # a status line for the events a caller wants to watch, by type
    IterationEnd: lambda e: f"{e.strategy}: iteration {e.iteration} done ({e.completion_tokens} tokens, stop={e.stop})",
    BranchRun: lambda e: f"{e.strategy}: branch {e.label}[{e.index}] done ({e.llm_calls} model calls)",
    LLMInvocation: lambda e: f"{e.strategy}: model call done ({e.completion_tokens} tokens)",
    MemoryRetrieval: lambda e: "memory: retrieved",
}


class CallerContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context with the caller the auth gate verified (`CURRENT_PRINCIPAL`) as its user."""

    def build_user(self, request: Request) -> User:
        principal = CURRENT_PRINCIPAL.get()
        return principal_user(principal.sub) if principal is not None else UnauthenticatedUser()


_REFUSAL_KEYS = {"error_type": "errorType", "retry_after_s": "retryAfterS", "limit_name": "limitName", "trace_id": "traceId"}
_ASKED: dict[str, tuple[type, tuple[str, ...]]] = {  # what a message's metadata may ask for, by reasoning.execute's names
    "strategy": (str, ("strategy", "skill")),  # a skill id names its strategy
    "strategy_config": (dict, ("strategyConfig", "strategy_config")),
    "agent_id": (str, ("agentId", "agent_id")),  # run as this registered agent (a remote A2A agent: forwarded to it)
    "session": (dict, ("session",)),  # the `session.create` spec of a context's first message
}


def run_trace_id(context: RequestContext) -> str:
    """The trace id of the message's run: the caller's (traceparent, or the request's span) when it may choose one."""
    headers = context.call_context.state.get("headers", {}) if context.call_context else {}
    given = tracing.trace_id_from(headers.get("traceparent")) or tracing.current_trace_id()
    return principal_trace_id(given) or uuid.uuid4().hex  # a caller's chosen trace id is its own


def _context_of(context: RequestContext) -> str:
    """The context of the message's task: a message continuing a task by its id alone is given a fresh
    context id by the SDK, and the task's events must carry the task's own."""
    assert context.context_id
    return context.current_task.context_id if context.current_task is not None else context.context_id


REFUSED: ContextVar[dict[str, Any] | None] = ContextVar("reasonray_a2a_refused", default=None)
"""Set by `A2AServer.handle` around one request: where the executor leaves a refusal (the guard said no before
any run), so the request is answered with the HTTP status and JSON-RPC error instead of a task."""


class Refused(A2AError):
    """The guard refused the call before anything ran (ends the SDK's handling; `A2AServer.handle` answers)."""


class ReasoningExecutor(AgentExecutor):
    """Runs each A2A message through the JSON-RPC dispatcher, so the caller meets the same guard as on `POST /rpc`
    (roles per method and strategy, agent binding, rate limits, token budgets charged with what the run used, the
    audit record): a message naming a strategy (or skill) is one `reasoning.execute` run; any other message is a
    turn of the context's ReasonRay session (`session.create` on the context's first message, `session.turn`
    after). Progress goes out as status updates, the answer as an artifact. A refusal answers the request with
    HTTP 401/403/429 and no task. While a task runs, its replica watches the board for a cancel sent to any
    replica. `task_updater`, `unless_cancelled_elsewhere` and `unanswered` serve an executor plugged in around it."""

    WATCH_S = 0.5  # how often a running task looks for a cancel sent to another replica

    def __init__(self, rpc: Dispatcher, contexts: ContextSessions, board: Board) -> None:
        self.rpc = rpc
        self.contexts = contexts
        self.board = board

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id and context.context_id
        # what the message's metadata (else the request's) asks for (`_ASKED`), without what it leaves out
        sources = [json_format.MessageToDict(context.message.metadata), context.metadata]
        found = {
            k: next((s[n] for s in sources for n in names if isinstance(s.get(n), kind) and s[n]), None)
            for k, (kind, names) in _ASKED.items()
        }
        asked = {name: value for name, value in found.items() if value is not None}
        trace_id = run_trace_id(context)
        owner = owner_of(context.call_context)
        text = context.get_user_input()
        params: dict[str, Any]
        if "strategy" not in asked and "agent_id" not in asked:
            session_id = await self._session(owner, _context_of(context), asked.get("session"), trace_id)
            if isinstance(session_id, dict):  # session.create was refused or failed
                return await self.unanswered(context, event_queue, session_id, owner)
            method, params, doing = "session.turn", {"session_id": session_id, "message": text}, "continuing the context's session"
        else:
            method, params = "reasoning.execute", {"query": text, **{k: v for k, v in asked.items() if k != "session"}}
            doing = f"reasoning with {asked.get('strategy') or asked.get('agent_id')}"
        items = stream_call(self.rpc, method, params, trace_id)
        try:
            await anext(items)  # Admitted: the guard let the call run; a refused or invalid call raises before anything ran
        except RpcError as error:  # the stream ended with it
            return await self.unanswered(context, event_queue, error.body(), owner)
        updater = await self.task_updater(context, event_queue)
        await updater.start_work(updater.new_agent_message([new_text_part(f"{doing} (trace {trace_id})")]))
        run = await self.unless_cancelled_elsewhere(self._follow(items, updater), context.task_id)
        if run is None:  # the SDK ends the task
            await items.aclose()
            await updater.cancel()
            return
        outcome = run.result()
        if not isinstance(outcome, CallResult):
            return await self._not_answered(updater, outcome)
        result: ExecuteResult | TurnResult = outcome.value
        if isinstance(result, TurnResult) and result.status != "completed":
            tools = {"code": -32602, "message": "the session asks for client tools, which A2A cannot run; use session.* over /rpc"}
            return await self._not_answered(updater, tools)
        # camelCase keys: A2A's JSON serialization rule holds for metadata too
        if isinstance(result, TurnResult):
            metadata = {"traceId": trace_id, "sessionId": result.session_id, "turn": result.turn, "totalTokens": result.usage.total_tokens}
        else:
            metadata = {"traceId": trace_id, "strategyUsed": result.strategy_used, "totalTokens": result.metrics.total_tokens}
        await updater.add_artifact([new_text_part(result.answer or "")], name="answer", metadata=metadata, last_chunk=True)
        await updater.complete()

    @staticmethod
    async def task_updater(context: RequestContext, event_queue: EventQueue) -> TaskUpdater:
        """The updater of the message's task, the task enqueued first (submitted) when the message starts one."""
        assert context.task_id and context.context_id
        if context.current_task is None:
            history = [context.message] if context.message else []
            await event_queue.enqueue_event(new_task(context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED, history=history))
        return TaskUpdater(event_queue, context.task_id, _context_of(context))

    async def unless_cancelled_elsewhere(self, work: Coroutine[Any, Any, T], task_id: str) -> asyncio.Future[T] | None:
        """Runs `work` while watching the board for a cancel sent to another replica: its finished future, or
        None when the task was cancelled there (`work` stopped). Cancelled here (CancelTask on this replica, by
        the SDK), `work` stops too."""
        run = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(self._watch(task_id))
        try:
            await asyncio.wait({run, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            run.cancel()
            raise
        finally:
            watch.cancel()
        if run.done():
            return run
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        log.info("a2a.task_cancelled_elsewhere", task_id=task_id)
        return None

    async def _session(self, owner: str | None, context_id: str, spec: dict[str, Any] | None, trace_id: str) -> str | ErrorObject:
        """The session the context continues, created (owned by the caller) for its first message; or the
        JSON-RPC error of a refused or failed `session.create`."""
        current = await self.contexts.session_of(owner, context_id)
        if current is not None:
            try:
                state: SessionGetResult = await self.rpc.run("session.get", {"session_id": current}, trace_id)
                if state.status != "closed":
                    return current
            except RpcError as error:
                if error.code not in (NotFoundError.code, ForbiddenError.code):  # anything but "gone" (expired, deleted): say so
                    return error.body()
        try:
            created: SessionCreateResult = await self.rpc.run("session.create", spec or {}, trace_id)
        except RpcError as error:
            return error.body()
        return await self.contexts.bind(owner, context_id, created.session_id, replacing=current)

    @staticmethod
    async def _follow(items: AsyncIterator[Any], updater: TaskUpdater) -> CallResult | ErrorObject:
        """Status updates for the run's events, then its typed result, or its JSON-RPC error."""
        try:
            async for item in items:
                if isinstance(item, CallResult):
                    return item
                if isinstance(item, Event) and (line := _PROGRESS.get(type(item))) is not None:
                    await updater.update_status(TaskState.TASK_STATE_WORKING, updater.new_agent_message([new_text_part(line(item))]))
        except RpcError as error:
            return error.body()
        return {"code": -32603, "message": "the run ended without a result"}

    async def _watch(self, task_id: str) -> None:
        """Returns when the task was cancelled on another replica (the board says CANCELED)."""
        while True:
            await asyncio.sleep(self.WATCH_S)
            if await self.board.state(task_id) == TaskState.TASK_STATE_CANCELED:
                return

    async def unanswered(self, context: RequestContext, event_queue: EventQueue, error: Mapping[str, Any], owner: str | None) -> None:
        """Nothing ran. A refusal (401/403/429) answers the request itself (`REFUSED`); any other error, or a
        call outside `A2AServer.handle`, ends in a task that says why."""
        assert context.task_id and context.context_id
        holder = REFUSED.get()
        if holder is not None and a2a_refused(error):
            holder.update(error=error, task_id=context.task_id, owner=owner)
            raise Refused(error["message"])
        await self._not_answered(await self.task_updater(context, event_queue), error)

    @staticmethod
    async def _not_answered(updater: TaskUpdater, error: Mapping[str, Any]) -> None:
        """A refused caller (no run started) gets a `rejected` task, a run that failed a `failed` one; the status
        message says why and carries the error's code and type, and for a rate limit its `limit_name` and
        `retry_after_s`."""
        message = updater.new_agent_message([new_text_part(f"{error['message']} (code {error['code']})"[:2000])])  # why, and the code
        data = error.get("data") or {}
        message.metadata.update({"code": error["code"], **{camel: data[k] for k, camel in _REFUSAL_KEYS.items() if k in data}})
        await (updater.reject if a2a_refused(error) else updater.failed)(message)
        log.info("a2a.task_not_answered", task_id=updater.task_id, code=error["code"], error_type=data.get("error_type"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """The run's asyncio task was cancelled by the SDK (the run stops with it): say so."""
        assert context.task_id and context.context_id
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


CARD_MAX_AGE_S = 300
"""How long a client may keep the card without asking again: it changes only when the service is redeployed."""


class A2AServer:
    """The a2a-sdk request handler and JSON-RPC route, running tasks through the ingress's dispatcher `rpc` (and
    so through its guard when authentication is on), keeping them in `repo` and, while they run, on `board`
    (shared by every replica: a cancel or a resubscription reaches a task from any replica), for the ingress to
    mount. `refusal_headers` gives a refusal's extra HTTP headers (Retry-After and X-RateLimit-* for 429).
    `executor` (`[a2a] executor`, unset by default) names a `module:callable` that is given the `ReasoningExecutor`
    and returns the agent executor to run instead, wrapping it (a conformance run's scripted scenarios)."""

    def __init__(
        self,
        rpc: Dispatcher,
        catalogue: Catalogue,
        repo: Repository,
        version: str,
        *,
        bearer: bool = False,
        board: Board | None = None,
        refusal_headers: Callable[[dict[str, Any]], dict[str, str]] = lambda error: {},
        executor: str | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.version = version
        self.bearer = bearer
        self.board = board or TaskBoard()
        self.store = SharedTaskStore(repo, self.board)
        self.refusal_headers = refusal_headers
        reasoning = ReasoningExecutor(rpc, ContextSessions(repo), self.board)
        self.handler = DefaultRequestHandler(
            agent_executor=pkgutil.resolve_name(executor)(reasoning) if executor else reasoning,
            task_store=self.store,
            agent_card=self.card(""),
            event_stream=BoardEventStream(self.board),
        )
        [route] = create_jsonrpc_routes(self.handler, rpc_url=A2A_PATH, context_builder=CallerContextBuilder())
        self._endpoint = route.endpoint  # Starlette endpoint: Request in, Response (JSON or SSE) out
        # HTTP+JSON: the SDK's routes under the same URL (/a2a/message:send, /a2a/tasks/{id}...); its
        # `/{tenant}` mount is left out, it would match every path of the application
        rest = create_rest_routes(self.handler, context_builder=CallerContextBuilder(), path_prefix=A2A_PATH)
        self._rest = [r for r in rest if isinstance(r, Route)]

    async def handle(self, request: Request) -> Response:
        """The SDK's answer, or for a refused call the JSON-RPC error with its HTTP status (and headers)."""
        return await self._answer(self._endpoint, request)

    async def handle_rest(self, request: Request) -> Response:
        """An HTTP+JSON call (A2A's REST binding), answered by the SDK's route for its path and method; a 404 or
        405 in the binding's error shape when none takes it; a refused call as handle's, in that shape."""
        allowed: list[str] = []
        for route in self._rest:
            match, child = route.matches(request.scope)
            if match == Match.FULL:
                request.scope.update(child)
                response = await self._answer(route.endpoint, request, rest=True)
                if response.headers.get("content-type", "").startswith("application/a2a+json"):
                    response.headers["content-type"] = "application/json"  # what the HTTP+JSON binding names (A2A 11.1)
                return response
            if match == Match.PARTIAL and route.methods:
                allowed += sorted(route.methods)
        status, reason = (405, "METHOD_NOT_ALLOWED") if allowed else (404, "NOT_FOUND")
        message = f"{request.method} is not allowed on {request.url.path}" if allowed else f"no A2A operation at {request.url.path}"
        headers = {"Allow": ", ".join(dict.fromkeys(allowed))} if allowed else {}
        return JSONResponse({"error": {"code": status, "status": reason, "message": message}}, status_code=status, headers=headers)

    async def _answer(self, endpoint: Callable[[Request], Any], request: Request, rest: bool = False) -> Response:
        """The SDK's answer; when the guard refused the call, its JSON-RPC error with its HTTP status and headers, in
        the binding's shape (`rest`: HTTP+JSON's): the SDK filed the refused request as a failed task, which is deleted
        here (a refused call leaves none)."""
        holder: dict[str, Any] = {}
        token = REFUSED.set(holder)
        try:
            response: Response = await endpoint(request)
        finally:
            REFUSED.reset(token)
        if "error" not in holder:
            return response
        await self.store.repo.delete_a2a_task(holder["task_id"], holder["owner"])
        await self.board.forget(holder["task_id"])
        error, status = holder["error"], view_of(holder["error"]["code"]).http_status
        body: dict[str, Any]
        if rest:
            reason = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 429: "RESOURCE_EXHAUSTED"}[status]
            body = {"error": {"code": status, "status": reason, "message": error["message"], "details": [error]}}
        else:
            request_id = json.loads(bytes(response.body)).get("id") if isinstance(response, JSONResponse) else None
            body = {"jsonrpc": "2.0", "error": error, "id": request_id}
        return JSONResponse(body, status_code=status, headers=self.refusal_headers(error))

    def card(self, base_url: str) -> AgentCard:
        return agent_card(self.catalogue.describe(), base_url, self.version, bearer=self.bearer)

    def card_response(self, request: Request, modified: float) -> Response:
        """The card as the SDK serves it (camelCase JSON) with caching headers: Cache-Control, a weak ETag of its content,
        Last-Modified (`modified`: when this replica started serving it); 304 when If-None-Match names the ETag (weak
        comparison, RFC 9110 13.1.2)."""
        card = agent_card_to_dict(self.card(str(request.base_url)))
        digest = hashlib.sha256(json.dumps(card, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        age, stamp = f"public, max-age={CARD_MAX_AGE_S}", formatdate(modified, usegmt=True)
        headers = {"Cache-Control": age, "ETag": f'W/"{digest}"', "Last-Modified": stamp}
        candidates = [c.strip().removeprefix("W/") for c in request.headers.get("if-none-match", "").split(",") if c.strip()]
        if "*" in candidates or f'"{digest}"' in candidates:
            return Response(status_code=304, headers=headers)
        return JSONResponse(card, headers=headers)
