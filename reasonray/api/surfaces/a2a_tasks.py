"""Where the A2A agent keeps its tasks and contexts: the sessions' store, each record owned; and the task
board every replica shares while tasks run.

The records are kept where sessions are (`[store] url`), by `reasonray.stores.a2a`. Every task and context records its owner, the caller's `sub` (none
while authentication is off), and every read names the owner: another principal's task reads, lists
and cancels exactly like a task that does not exist. A context is bound to one ReasonRay session per
owner, so a stranger naming someone's `context_id` starts a session of its own (docs/interop.md).

`TaskBoard` holds what is running: each task's state with a version and its events. `SharedTaskStore`
and `BoardEventStream` give it to the a2a-sdk as its versioned task store and cross-replica event
stream, so a cancel or a resubscription reaches a task running on another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from a2a.auth.user import User
from a2a.server.agent_execution.active_task import TERMINAL_TASK_STATES
from a2a.server.cluster import ConcurrentTaskModificationError, StoredTask, TaskEventStream, TaskVersion, VersionedEvent, VersionedTaskStore
from a2a.server.context import ServerCallContext
from a2a.server.routes.common import StarletteUser
from a2a.types import a2a_pb2
from a2a.types.a2a_pb2 import Task
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from a2a.utils.proto_utils import to_stream_response
from a2a.utils.task import ListTasksCursor, decode_list_tasks_cursor, encode_list_tasks_cursor
from google.protobuf import json_format
from starlette.authentication import SimpleUser

from reasonray.kernel.errors import SessionStateError
from reasonray.stores.a2a import Repository, TaskQuery

log = structlog.get_logger(__name__)

SAVE_ATTEMPTS = 5  # a context bound by a concurrent message of the same context: reload and look again


# -- owners --------------------------------------------------------------------------------------------------


def principal_user(sub: str) -> User:
    """The verified caller as the a2a-sdk sees it: its `sub` is the user name every task is filed under."""
    return StarletteUser(SimpleUser(sub))


def owner_of(context: ServerCallContext | None) -> str | None:
    """The owner of what a call creates and the only owner it reads: the caller's `sub`; None with auth off."""
    return context.user.user_name if context is not None and context.user.is_authenticated else None


# -- contexts: one ReasonRay session each ------------------------------------------------------------------


def conversation_id(owner: str | None, context_id: str) -> str:
    """The record of `context_id` for `owner`: one per owner, so a context id is no key to someone else's."""
    return "a2a-" + hashlib.sha256(f"{owner or ''}\x00{context_id}".encode()).hexdigest()[:32]


class ContextSessions:
    """Which ReasonRay session an A2A context continues, per owner (the record `conversation_id` names holds
    `{"session_id": ...}`). The first message of a context creates the session and binds it here; a
    concurrent first message that loses the race uses the winner's session."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo

    async def session_of(self, owner: str | None, context_id: str) -> str | None:
        found = await self.repo.load_a2a_conversation(conversation_id(owner, context_id))
        if found is None or not found[0]:
            return None
        session_id = found[0][0].get("session_id")
        return session_id if isinstance(session_id, str) else None

    async def bind(self, owner: str | None, context_id: str, session_id: str, *, replacing: str | None = None) -> str:
        """Bind `session_id` to the context (or in place of `replacing`, a session that is gone); returns the
        session the context continues afterwards: `session_id`, or the one a concurrent message bound first."""
        ident = conversation_id(owner, context_id)
        for _ in range(SAVE_ATTEMPTS):
            found = await self.repo.load_a2a_conversation(ident)
            records, version = found if found is not None else ([], 0)
            current = records[0].get("session_id") if records else None
            if current is not None and current != replacing:
                return str(current)
            if await self.repo.save_a2a_conversation(ident, owner, context_id, [{"session_id": session_id}], version):
                return session_id
        raise SessionStateError(
            f"the session of context {context_id!r} kept changing while this message was bound to it; send the message again",
            {"context_id": context_id},
        )


# -- live tasks shared by every replica ------------------------------------------------------------------------

CONFLICT = 0  # `TaskBoard.commit`: the write is stale (or the task already ended)
NOT_YOURS = -1  # `TaskBoard.commit`: another owner's task
TERMINAL = frozenset(TERMINAL_TASK_STATES)  # completed, failed, canceled, rejected: the SDK's own list
ENDED_KEPT_S = 300.0  # an ended task's entry (and events) stays this long, for late resubscribers and cancels
MAX_EVENTS = 2000  # events kept per task (the oldest dropped first)
ENDING_S = 2.0  # a task that ended less than this ago may still publish its last event


@dataclass(slots=True)
class _Live:
    owner: str | None
    version: int = 0
    state: int = 0
    doc: dict[str, Any] = field(default_factory=dict)
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))  # the newest, the oldest dropped first
    published: int = 0  # events published in all: the sequence number of the next one
    ended_at: float | None = None


class TaskBoard:
    """The live A2A tasks of an application, as every replica sees them: each task's latest state with a version
    (compare-and-set, so a cancel from any replica wins over the running replica's next write), and its events
    in order (a resubscriber on any replica tails them). One per application: in-process here, in a named actor
    on Ray (`reasonray.actors.a2a_board`). The store keeps the durable copy of each task; the board only what is
    running or just ended."""

    def __init__(self) -> None:
        self.tasks: dict[str, _Live] = {}
        self._changed = asyncio.Condition()

    async def commit(self, task_id: str, owner: str | None, prev_version: int, state: int, doc: dict[str, Any]) -> int:
        """Store the task's new state; its new version, CONFLICT when `prev_version` is stale or the task ended
        (a cancel skips the version check), NOT_YOURS when another owner's."""
        now = time.monotonic()  # tasks that ended more than ENDED_KEPT_S ago go first
        for ended in [t for t, live in self.tasks.items() if live.ended_at is not None and now - live.ended_at > ENDED_KEPT_S]:
            del self.tasks[ended]
        live = self.tasks.get(task_id)
        if live is None:  # new here (or the board restarted): adopt it
            live = self.tasks[task_id] = _Live(owner)
        elif live.owner != owner:
            return NOT_YOURS
        elif live.state in TERMINAL or (state != a2a_pb2.TaskState.TASK_STATE_CANCELED and prev_version != live.version):
            return CONFLICT
        live.version += 1
        live.state, live.doc = state, doc
        if state in TERMINAL:
            live.ended_at = now
        async with self._changed:
            self._changed.notify_all()
        return live.version

    async def get(self, task_id: str, owner: str | None) -> tuple[dict[str, Any], int] | None:
        live = self.tasks.get(task_id)
        return (live.doc, live.version) if live is not None and live.owner == owner and live.doc else None

    async def state(self, task_id: str) -> int | None:
        """The task's state as last committed (the running replica watches it for a cancel); None: unknown."""
        live = self.tasks.get(task_id)
        return live.state if live is not None else None

    async def forget(self, task_id: str) -> None:
        self.tasks.pop(task_id, None)

    async def publish(self, task_id: str, version: int, event: dict[str, Any]) -> None:
        live = self.tasks.get(task_id)
        if live is None:
            return
        live.events.append({"version": version, "event": event})
        live.published += 1
        async with self._changed:
            self._changed.notify_all()

    async def events(self, task_id: str, cursor: int, wait_s: float) -> tuple[list[dict[str, Any]], int] | None:
        """Events from sequence number `cursor` on, waiting up to `wait_s` for one; with the next cursor.
        None: the board does not know the task (ended long ago, or never ran here)."""
        deadline = time.monotonic() + wait_s
        while True:
            live = self.tasks.get(task_id)
            if live is None:
                return None
            end, first = live.published, live.published - len(live.events)
            # an ending is committed just before its event is published: wait for that event, unless it ended a while ago
            ended_a_while_ago = live.ended_at is not None and time.monotonic() - live.ended_at > ENDING_S
            if cursor < end or ended_a_while_ago or time.monotonic() >= deadline:
                return list(itertools.islice(live.events, max(cursor, first) - first, None)), end
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - time.monotonic()))


class Board(Protocol):
    """`TaskBoard`'s methods, awaited: in this process, or on the application's board actor."""

    async def commit(self, task_id: str, owner: str | None, prev_version: int, state: int, doc: dict[str, Any]) -> int: ...

    async def get(self, task_id: str, owner: str | None) -> tuple[dict[str, Any], int] | None: ...

    async def state(self, task_id: str) -> int | None: ...

    async def forget(self, task_id: str) -> None: ...

    async def publish(self, task_id: str, version: int, event: dict[str, Any]) -> None: ...

    async def events(self, task_id: str, cursor: int, wait_s: float) -> tuple[list[dict[str, Any]], int] | None: ...


def _version(version: TaskVersion) -> int:
    value = version._value
    return value if isinstance(value, int) else 0


class SharedTaskStore(VersionedTaskStore):
    """The a2a-sdk's versioned task store over the board (what is live, versioned) and a repository (the durable
    copy, scoped to the caller: GetTask, ListTasks, CancelTask and resubscribing all read through `get` / `list`, so
    they never see another owner's task): the SDK's request handler then cancels a task running on another replica
    by writing CANCELED here, and the running replica's next write (or its watcher, `a2a.ReasoningExecutor`) sees it."""

    def __init__(self, repo: Repository, board: Board) -> None:
        self.repo = repo
        self.board = board

    async def save(
        self, task: Task, *, event: Any, prev: Task | None, prev_version: TaskVersion, context: ServerCallContext
    ) -> TaskVersion:
        owner, doc = owner_of(context), json_format.MessageToDict(task)
        version = await self.board.commit(task.id, owner, _version(prev_version), task.status.state, doc)
        if version == CONFLICT:
            raise ConcurrentTaskModificationError(task.id)
        status_ns = task.status.timestamp.ToNanoseconds() if task.status.HasField("timestamp") else 0
        if version == NOT_YOURS or not await self.repo.save_a2a_task(task.id, owner, task.context_id, task.status.state, status_ns, doc):
            log.warning("a2a.task_id_taken", task_id=task.id)  # the SDK makes task ids; nobody should reuse another's
            raise TaskNotFoundError(f"Task {task.id} not found")
        return TaskVersion(version)

    async def get(self, task_id: str, context: ServerCallContext) -> StoredTask | None:
        live = await self.board.get(task_id, owner_of(context))
        if live is not None:
            return StoredTask(json_format.ParseDict(live[0], Task()), TaskVersion(live[1]))
        doc = await self.repo.a2a_task(task_id, owner_of(context))
        return StoredTask(json_format.ParseDict(doc, Task()), TaskVersion.MISSING) if doc is not None else None

    async def list(self, params: a2a_pb2.ListTasksRequest, context: ServerCallContext) -> a2a_pb2.ListTasksResponse:
        after = None
        if params.page_token:
            cursor = decode_list_tasks_cursor(params.page_token)
            if cursor is None:
                raise InvalidParamsError(f"Invalid page token: {params.page_token}")
            after = (cursor.timestamp_ns or 0, cursor.task_id)
        size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        since = params.status_timestamp_after.ToNanoseconds() if params.HasField("status_timestamp_after") else None
        docs, total = await self.repo.a2a_tasks(
            TaskQuery(
                owner_of(context),
                context_id=params.context_id or None,
                state=params.status or None,
                since_ns=since,
                after=after,
                limit=size + 1,  # one more than the page: whether another page follows
            )
        )
        tasks = [json_format.ParseDict(d, Task()) for d in docs[:size]]
        following = ""
        if len(docs) > size:
            last = tasks[-1]
            stamp = last.status.timestamp.ToNanoseconds() if last.status.HasField("timestamp") else None
            following = encode_list_tasks_cursor(ListTasksCursor(timestamp_ns=stamp or None, task_id=last.id))
        return a2a_pb2.ListTasksResponse(tasks=tasks, next_page_token=following, page_size=size, total_size=total)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        if await self.repo.a2a_task(task_id, owner_of(context)) is not None:
            await self.board.forget(task_id)
        await self.repo.delete_a2a_task(task_id, owner_of(context))


class BoardEventStream(TaskEventStream):
    """The a2a-sdk's cross-replica event stream over the board: the running replica publishes each event, a
    replica serving a resubscription tails them (long polls of `POLL_S`)."""

    POLL_S = 10.0

    def __init__(self, board: Board) -> None:
        self.board = board

    async def publish(self, task_id: str, event: VersionedEvent) -> None:
        response = to_stream_response(event.event)
        await self.board.publish(task_id, _version(event.version), json_format.MessageToDict(response))

    async def subscribe(self, task_id: str, *, after: TaskVersion) -> AsyncGenerator[VersionedEvent, None]:
        cursor = 0
        while True:
            found = await self.board.events(task_id, cursor, self.POLL_S)
            if found is None:
                return
            items, cursor = found
            for item in items:
                response = json_format.ParseDict(item["event"], a2a_pb2.StreamResponse())
                event = getattr(response, response.WhichOneof("payload") or "task")  # the task, message or update it carries
                yield VersionedEvent(event=event, version=TaskVersion(item["version"]))
            if not items and (await self.board.state(task_id)) in TERMINAL:
                return

    async def destroy(self, task_id: str) -> None:
        return None  # the board drops ended tasks itself, after ENDED_KEPT_S
