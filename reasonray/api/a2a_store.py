"""Where the A2A agent keeps its tasks and conversations: the sessions' store, each record owned.

The store is the one sessions use (`[store] url`): PostgreSQL (tables `a2a_tasks` and
`a2a_conversations`, `reasonray/kernel/migrations/0002.a2a.sql`) on a cluster, else files under
`<data_dir>/sessions/a2a/`. Every task and conversation records its owner, the caller's `sub` (none
while authentication is off), and every read names the owner: another principal's task reads, lists
and cancels exactly like a task that does not exist. A context is a conversation per owner, so a
stranger naming someone's `context_id` starts a conversation of its own (docs/interop.md).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import structlog
from a2a.auth.user import UnauthenticatedUser, User
from a2a.server.context import ServerCallContext
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.tasks import TaskStore
from a2a.types import a2a_pb2
from a2a.types.a2a_pb2 import Task
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from a2a.utils.task import ListTasksCursor, decode_list_tasks_cursor, encode_list_tasks_cursor
from google.protobuf import json_format
from pydantic import BaseModel, Field
from starlette.requests import Request

from reasonray.api.auth import CURRENT_PRINCIPAL
from reasonray.kernel.errors import SessionStateError
from reasonray.kernel.storage import write_atomic

log = structlog.get_logger(__name__)

SAVE_ATTEMPTS = 5  # a conversation saved by a concurrent task of the same context: reload and append again
KEPT_EXCHANGES = 32  # a conversation keeps its latest exchanges; a run is given fewer (a2a.HISTORY_TURNS)


class Repository(Protocol):
    """Owned A2A records as JSON; `reasonray.kernel.pgstore.PgStore` and `FileRepository` implement it."""

    async def save_a2a_task(
        self, task_id: str, owner: str | None, context_id: str, state: int, status_ns: int, task: dict[str, Any]
    ) -> bool: ...

    async def a2a_task(self, task_id: str, owner: str | None) -> dict[str, Any] | None: ...

    async def a2a_tasks(
        self,
        owner: str | None,
        *,
        context_id: str | None,
        state: int | None,
        since_ns: int | None,
        after: tuple[int, str] | None,
        limit: int,
    ) -> tuple[list[dict[str, Any]], int]: ...

    async def delete_a2a_task(self, task_id: str, owner: str | None) -> None: ...

    async def load_a2a_conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], int] | None: ...

    async def save_a2a_conversation(
        self, conversation_id: str, owner: str | None, context_id: str, exchanges: list[dict[str, Any]], version: int
    ) -> bool: ...


class FileRepository:
    """One JSON file per task (`tasks/`) and per conversation (`contexts/`) under `<sessions>/a2a/`, replaced
    atomically; writes that check an owner or a version hold one lock file (the processes of one machine).
    The file work runs in a thread (`_Files`), off the event loop, as it may wait for that lock."""

    def __init__(self, sessions_dir: Path) -> None:
        self.files = _Files(sessions_dir)

    async def save_a2a_task(
        self, task_id: str, owner: str | None, context_id: str, state: int, status_ns: int, task: dict[str, Any]
    ) -> bool:
        return await asyncio.to_thread(self.files.save_a2a_task, task_id, owner, context_id, state, status_ns, task)

    async def a2a_task(self, task_id: str, owner: str | None) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.files.a2a_task, task_id, owner)

    async def a2a_tasks(
        self,
        owner: str | None,
        *,
        context_id: str | None,
        state: int | None,
        since_ns: int | None,
        after: tuple[int, str] | None,
        limit: int,
    ) -> tuple[list[dict[str, Any]], int]:
        return await asyncio.to_thread(
            self.files.a2a_tasks, owner, context_id=context_id, state=state, since_ns=since_ns, after=after, limit=limit
        )

    async def delete_a2a_task(self, task_id: str, owner: str | None) -> None:
        await asyncio.to_thread(self.files.delete_a2a_task, task_id, owner)

    async def load_a2a_conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], int] | None:
        return await asyncio.to_thread(self.files.load_a2a_conversation, conversation_id)

    async def save_a2a_conversation(
        self, conversation_id: str, owner: str | None, context_id: str, exchanges: list[dict[str, Any]], version: int
    ) -> bool:
        return await asyncio.to_thread(self.files.save_a2a_conversation, conversation_id, owner, context_id, exchanges, version)


class _Files:
    """`FileRepository`'s synchronous file work."""

    def __init__(self, sessions_dir: Path) -> None:
        self.root = Path(sessions_dir) / "a2a"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _task_path(self, task_id: str) -> Path:
        return self.root / "tasks" / f"{_file_name(task_id)}.json"

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        return doc

    def save_a2a_task(self, task_id: str, owner: str | None, context_id: str, state: int, status_ns: int, task: dict[str, Any]) -> bool:
        path = self._task_path(task_id)
        with self._locked():
            stored = self._read(path)
            if stored is not None and stored["owner"] != owner:
                return False
            doc = {"owner": owner, "context_id": context_id, "state": state, "status_ns": status_ns, "task": task}
            write_atomic(path, json.dumps(doc).encode())
        return True

    def a2a_task(self, task_id: str, owner: str | None) -> dict[str, Any] | None:
        doc = self._read(self._task_path(task_id))
        return doc["task"] if doc is not None and doc["owner"] == owner else None

    def a2a_tasks(
        self,
        owner: str | None,
        *,
        context_id: str | None,
        state: int | None,
        since_ns: int | None,
        after: tuple[int, str] | None,
        limit: int,
    ) -> tuple[list[dict[str, Any]], int]:
        folder = self.root / "tasks"
        docs = [d for p in (folder.glob("*.json") if folder.is_dir() else []) if (d := self._read(p)) is not None]
        docs = [
            d
            for d in docs
            if d["owner"] == owner
            and (context_id is None or d["context_id"] == context_id)
            and (state is None or d["state"] == state)
            and (since_ns is None or d["status_ns"] >= since_ns)
        ]
        docs.sort(key=lambda d: (d["status_ns"], d["task"]["id"]), reverse=True)
        page = [d for d in docs if after is None or (d["status_ns"], d["task"]["id"]) < after][:limit]
        return [d["task"] for d in page], len(docs)

    def delete_a2a_task(self, task_id: str, owner: str | None) -> None:
        path = self._task_path(task_id)
        with self._locked():
            stored = self._read(path)
            if stored is not None and stored["owner"] == owner:
                path.unlink()

    def _conversation_path(self, conversation_id: str) -> Path:
        return self.root / "contexts" / f"{_file_name(conversation_id)}.json"

    def load_a2a_conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], int] | None:
        doc = self._read(self._conversation_path(conversation_id))
        return (doc["exchanges"], doc["version"]) if doc is not None else None

    def save_a2a_conversation(
        self, conversation_id: str, owner: str | None, context_id: str, exchanges: list[dict[str, Any]], version: int
    ) -> bool:
        path = self._conversation_path(conversation_id)
        with self._locked():
            stored = self._read(path)
            if (stored["version"] if stored is not None else 0) != version:
                return False
            doc = {"owner": owner, "context_id": context_id, "version": version + 1, "exchanges": exchanges}
            write_atomic(path, json.dumps(doc).encode())
        return True


def _file_name(ident: str) -> str:
    """A file name for any id: readable when the id is tame, a digest otherwise (no path tricks, no collisions)."""
    if ident and len(ident) <= 128 and all(c.isalnum() or c in "-_" for c in ident):
        return ident
    return "h-" + hashlib.sha256(ident.encode()).hexdigest()


def repository(store_url: str | None, sessions_dir: Path) -> Repository:
    """PostgreSQL when a store URL is configured (as for sessions), else files beside the sessions."""
    if store_url is None:
        return FileRepository(sessions_dir)
    from reasonray.kernel.pgstore import pg_store  # psycopg only where a URL is configured

    return pg_store(store_url)


# -- owners --------------------------------------------------------------------------------------------------


class PrincipalUser(User):
    """The verified caller as the a2a-sdk sees it: its `sub` is the user name every task is filed under."""

    def __init__(self, sub: str) -> None:
        self.sub = sub

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.sub


class CallerContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context with the caller the auth gate verified (`CURRENT_PRINCIPAL`) as its user."""

    def build_user(self, request: Request) -> User:
        principal = CURRENT_PRINCIPAL.get()
        return PrincipalUser(principal.sub) if principal is not None else UnauthenticatedUser()


def owner_of(context: ServerCallContext | None) -> str | None:
    """The owner of what a call creates and the only owner it reads: the caller's `sub`; None with auth off."""
    if context is None or not context.user.is_authenticated:
        return None
    return context.user.user_name


# -- the SDK's task store ------------------------------------------------------------------------------------


class OwnedTaskStore(TaskStore):
    """The a2a-sdk `TaskStore` over a repository, scoped to the caller: GetTask, ListTasks, CancelTask and
    resubscribing all read through `get` / `list`, so they never see another owner's task."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo

    async def save(self, task: Task, context: ServerCallContext | None = None) -> None:
        owner = owner_of(context)
        status_ns = task.status.timestamp.ToNanoseconds() if task.status.HasField("timestamp") else 0
        doc = json_format.MessageToDict(task)
        if not await self.repo.save_a2a_task(task.id, owner, task.context_id, task.status.state, status_ns, doc):
            log.warning("a2a.task_id_taken", task_id=task.id)  # the SDK makes task ids; nobody should reuse another's
            raise TaskNotFoundError(f"Task {task.id} not found")

    async def get(self, task_id: str, context: ServerCallContext | None = None) -> Task | None:
        doc = await self.repo.a2a_task(task_id, owner_of(context))
        return json_format.ParseDict(doc, Task()) if doc is not None else None

    async def list(self, params: a2a_pb2.ListTasksRequest, context: ServerCallContext | None = None) -> a2a_pb2.ListTasksResponse:
        after = None
        if params.page_token:
            cursor = decode_list_tasks_cursor(params.page_token)
            if cursor is None:
                raise InvalidParamsError(f"Invalid page token: {params.page_token}")
            after = (cursor.timestamp_ns or 0, cursor.task_id)
        size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        since = params.status_timestamp_after.ToNanoseconds() if params.HasField("status_timestamp_after") else None
        docs, total = await self.repo.a2a_tasks(
            owner_of(context),
            context_id=params.context_id or None,
            state=params.status or None,
            since_ns=since,
            after=after,
            limit=size + 1,  # one more than the page: whether another page follows
        )
        tasks = [json_format.ParseDict(d, Task()) for d in docs[:size]]
        following = ""
        if len(docs) > size:
            last = tasks[-1]
            stamp = last.status.timestamp.ToNanoseconds() if last.status.HasField("timestamp") else None
            following = encode_list_tasks_cursor(ListTasksCursor(timestamp_ns=stamp or None, task_id=last.id))
        return a2a_pb2.ListTasksResponse(tasks=tasks, next_page_token=following, page_size=size, total_size=total)

    async def delete(self, task_id: str, context: ServerCallContext | None = None) -> None:
        await self.repo.delete_a2a_task(task_id, owner_of(context))


# -- conversations -------------------------------------------------------------------------------------------


class Exchange(BaseModel):
    """One completed message of a context and its answer."""

    turn: int = Field(description="The exchange's place in its context, from 1.")
    question: str
    answer: str
    task_id: str
    trace_id: str = Field(description="The run that answered (its event log, logs and spans).")


def conversation_id(owner: str | None, context_id: str) -> str:
    """The conversation of `context_id` for `owner`: one per owner, so a context id is no key to someone else's."""
    return "a2a-" + hashlib.sha256(f"{owner or ''}\x00{context_id}".encode()).hexdigest()[:32]


class Conversations:
    """A context's conversation so far, and each completed exchange appended to it (optimistic concurrency)."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo

    async def exchanges(self, owner: str | None, context_id: str) -> list[Exchange]:
        found = await self.repo.load_a2a_conversation(conversation_id(owner, context_id))
        return [Exchange.model_validate(e) for e in found[0]] if found is not None else []

    async def append(self, owner: str | None, context_id: str, question: str, answer: str, task_id: str, trace_id: str) -> int:
        """Add an exchange after whatever the context holds now (concurrent tasks: in the order they end);
        returns its turn (1 for the first)."""
        ident = conversation_id(owner, context_id)
        for _ in range(SAVE_ATTEMPTS):
            found = await self.repo.load_a2a_conversation(ident)
            exchanges, version = found if found is not None else ([], 0)
            turn = exchanges[-1]["turn"] + 1 if exchanges else 1
            added = Exchange(turn=turn, question=question, answer=answer, task_id=task_id, trace_id=trace_id)
            kept = [*exchanges, added.model_dump()][-KEPT_EXCHANGES:]
            if await self.repo.save_a2a_conversation(ident, owner, context_id, kept, version):
                return turn
        raise SessionStateError(
            f"the conversation of context {context_id!r} kept changing while this answer was saved; send the message again",
            {"context_id": context_id},
        )
