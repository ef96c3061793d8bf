"""The application's A2A task board in a named actor: every replica commits its tasks' states there and
publishes their events, so a cancel or a resubscription sent to any replica reaches a task running on another
(`reasonray.api.surfaces.a2a_tasks.TaskBoard`, docs/interop.md).

An async actor (event long polls wait without holding it); it keeps only live and just-ended tasks, in
memory: the durable copy of every task is in the store. After a restart a running task is adopted at its
next write.
"""

from __future__ import annotations

from typing import Any

import ray
from tenacity import retry, retry_if_exception_type, stop_after_attempt

from reasonray.actors import unwrap
from reasonray.actors.lifecycle import Fingerprinted, NamedActor, fingerprint
from reasonray.api.surfaces.a2a_tasks import TaskBoard
from reasonray.kernel.errors import RunCancelledError


@ray.remote(num_cpus=0, max_restarts=-1)
class TaskBoardActor(TaskBoard, Fingerprinted):
    """TaskBoard run by Ray: its methods are the actor's."""

    def __init__(self, fp: str) -> None:
        super().__init__()
        self._fingerprint = fp


@retry(retry=retry_if_exception_type(RunCancelledError), stop=stop_after_attempt(3), reraise=True)
async def _call(method: Any, *args: Any) -> Any:
    """One board call. A task outlives the HTTP request that started it, but Ray cancels the calls a replica made
    while serving a request when that request is cancelled (its client went away): such a call is sent again."""
    return await unwrap(method.remote(*args))


class RayTaskBoard:
    """`reasonray.api.surfaces.a2a_tasks.Board` over the application's board actor."""

    def __init__(self, actor: NamedActor) -> None:
        self.actor = actor  # not started at deploy time ([server] prestart off): started by its first use

    async def commit(self, task_id: str, owner: str | None, prev_version: int, state: int, doc: dict[str, Any]) -> int:
        return await _call(self.actor.handle.commit, task_id, owner, prev_version, state, doc)

    async def get(self, task_id: str, owner: str | None) -> tuple[dict[str, Any], int] | None:
        return await _call(self.actor.handle.get, task_id, owner)

    async def state(self, task_id: str) -> int | None:
        return await _call(self.actor.handle.state, task_id)

    async def forget(self, task_id: str) -> None:
        await _call(self.actor.handle.forget, task_id)

    async def publish(self, task_id: str, version: int, event: dict[str, Any]) -> None:
        await _call(self.actor.handle.publish, task_id, version, event)

    async def events(self, task_id: str, cursor: int, wait_s: float) -> tuple[list[dict[str, Any]], int] | None:
        return await _call(self.actor.handle.events, task_id, cursor, wait_s)


def task_board(app_name: str, start: bool = True) -> RayTaskBoard:
    """Deploy time: the application's board (one per application, whatever its settings), started now or at its
    first use."""
    return RayTaskBoard(NamedActor(TaskBoardActor, f"{app_name}-a2a-board", fingerprint("a2a-board", 1)).deploy(start))
