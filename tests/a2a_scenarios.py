"""The A2A TCK's scripted scenarios, plugged into the A2A surface as its agent executor for conformance runs
(`[a2a] executor = "tests.a2a_scenarios:ScenarioExecutor"`; tests/integration/test_a2a_tck.py).

The TCK drives its system under test in-band: a message whose `messageId` starts with a scenario's prefix
(`tck-artifact-text`, `tck-input-required`, `tck-stream-001`...) must get exactly that scenario's events
(the TCK's `scenarios/core_operations.feature` and `streaming.feature`). `SCENARIOS` holds them as data, one
row per prefix; `scenario_for` picks the row of a message id (the longest prefix wins, so
`tck-artifact-file-url` is not taken for `tck-artifact-file`), and `play` turns a script into the a2a-sdk's
task events. The same events serve SendMessage and SendStreamingMessage on both bindings. `ScenarioExecutor`
wraps ReasonRay's executor: a scenario's message id plays its script, any other message reasons as usual.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any, Literal, assert_never

import structlog
from a2a.helpers.proto_helpers import new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types.a2a_pb2 import Part, TaskState
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Value

from reasonray.api.jsonrpc import Call, error_for
from reasonray.api.surfaces.a2a import ReasoningExecutor, run_trace_id
from reasonray.api.surfaces.a2a_tasks import owner_of

log = structlog.get_logger(__name__)

# -- parts ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A text part."""

    text: str


@dataclass(frozen=True)
class File:
    """A file part: its bytes inline (`raw`) or where to fetch them (`url`)."""

    filename: str
    media_type: str
    raw: bytes | None = None
    url: str | None = None

    def __post_init__(self) -> None:
        if (self.raw is None) == (self.url is None):
            raise ValueError(f"file part {self.filename!r}: give its bytes (raw) or its url, not both or neither")


@dataclass(frozen=True)
class Data:
    """A structured data part (a JSON object)."""

    value: dict[str, Any]


PartSpec = Text | File | Data

# -- what a scenario does ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """The task moves to `state`, with an agent message saying `text` if given."""

    state: Literal["working", "input_required", "completed"]
    text: str | None = None


@dataclass(frozen=True)
class Emit:
    """An artifact, or one chunk of it: chunks naming the same `artifact` share its id."""

    parts: tuple[PartSpec, ...]
    artifact: str = "output"
    append: bool = False
    last_chunk: bool = True


@dataclass(frozen=True)
class Wait:
    """The task stays as it is for `seconds` (a long-running task, for resubscription)."""

    seconds: float


@dataclass(frozen=True)
class Reject:
    """The task ends `rejected`, its status message saying `reason`."""

    reason: str


Step = Status | Emit | Wait | Reject


@dataclass(frozen=True)
class Script:
    """A task driven by these steps, in order."""

    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Reply:
    """A direct Message saying `text`, instead of a task."""

    text: str


Scenario = Script | Reply

RESUBSCRIBE_WAIT_S = 4.0
"""How long the resubscription scenario's task stays working: twice the TCK's default `TCK_STREAMING_TIMEOUT`
(2 s), which its requirements ask for."""

OUTPUT_FILE = File("output.txt", "text/plain", raw=b"tck")


def _streamed(*steps: Step) -> Script:
    """A streaming scenario: working, these steps, completed."""
    return Script((Status("working"), *steps, Status("completed")))


SCENARIOS: dict[str, Scenario] = {
    # core_operations.feature
    "tck-complete-task": Script((Status("completed", "Hello from TCK"),)),
    "tck-artifact-text": Script((Emit((Text("Generated text content"),)), Status("completed"))),
    "tck-artifact-file": Script((Emit((OUTPUT_FILE,)), Status("completed"))),
    "tck-artifact-file-url": Script((Emit((File("output.txt", "text/plain", url="https://example.com/output.txt"),)), Status("completed"))),
    "tck-artifact-data": Script((Emit((Data({"key": "value", "count": 42}),)), Status("completed"))),
    "tck-message-response": Reply("Direct message response"),
    "tck-input-required": Script((Status("input_required"),)),
    "tck-reject-task": Script((Reject("rejected"),)),
    # streaming.feature
    "tck-stream-001": _streamed(Emit((Text("Stream hello from TCK"),))),
    "tck-stream-002": Script((Status("completed"),)),
    "tck-stream-003": _streamed(Emit((Text("Stream task lifecycle"),))),
    "tck-stream-ordering-001": _streamed(Emit((Text("Ordered output"),))),
    "tck-stream-artifact-text": _streamed(Emit((Text("Streamed text content"),))),
    "tck-stream-artifact-file": _streamed(Emit((OUTPUT_FILE,))),
    "tck-stream-artifact-chunked": _streamed(
        Emit((Text("chunk-1 "),), artifact="chunked", last_chunk=False),
        Emit((Text("chunk-2"),), artifact="chunked", append=True),
    ),
    "test-resubscribe-message-id": _streamed(Wait(RESUBSCRIBE_WAIT_S)),
}


def scenario_for(message_id: str) -> Scenario | None:
    """The scenario whose prefix starts `message_id` (the longest such prefix); None: no scenario, reason."""
    prefixes = [p for p in SCENARIOS if message_id.startswith(p)]
    return SCENARIOS[max(prefixes, key=len)] if prefixes else None


# -- playing a script ---------------------------------------------------------------------------------------------

_STATES = {
    "working": TaskState.TASK_STATE_WORKING,
    "input_required": TaskState.TASK_STATE_INPUT_REQUIRED,
    "completed": TaskState.TASK_STATE_COMPLETED,
}


def part_of(spec: PartSpec) -> Part:
    """The a2a-sdk part of a part spec."""
    match spec:
        case Text(text):
            return Part(text=text)
        case File(filename, media_type, raw, url):
            return (
                Part(raw=raw, filename=filename, media_type=media_type)
                if raw is not None
                else Part(url=url, filename=filename, media_type=media_type)
            )
        case Data(value):
            return Part(data=json_format.ParseDict(value, Value()))
        case _:
            assert_never(spec)


async def play(script: Script, updater: TaskUpdater) -> None:
    """The script's steps as the task's events (the task itself already enqueued)."""
    artifact_ids: dict[str, str] = {}
    for step in script.steps:
        match step:
            case Status(state, text):
                message = updater.new_agent_message([Part(text=text)]) if text is not None else None
                await updater.update_status(_STATES[state], message)
            case Emit(parts, artifact, append, last_chunk):
                artifact_id = artifact_ids.setdefault(artifact, uuid.uuid4().hex)
                await updater.add_artifact(
                    [part_of(p) for p in parts], artifact_id=artifact_id, name=artifact, append=append, last_chunk=last_chunk
                )
            case Wait(seconds):
                await asyncio.sleep(seconds)
            case Reject(reason):
                await updater.reject(updater.new_agent_message([Part(text=reason)]))
            case _:
                assert_never(step)


# -- the executor -------------------------------------------------------------------------------------------------


class ScenarioExecutor(AgentExecutor):
    """ReasonRay's executor with the TCK's scenarios in front: a message whose id names a scenario is admitted by
    the guard as the `reasoning.execute` run it stands in for, then played into its task (or answered as a direct
    Message); the task is stored, owned, listed and cancelled like any other. Any other message reasons."""

    def __init__(self, reasoning: ReasoningExecutor) -> None:
        self.reasoning = reasoning

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id
        scenario = scenario_for(context.message.message_id)
        if scenario is None:
            return await self.reasoning.execute(context, event_queue)
        owner = owner_of(context.call_context)
        refusal = await self._admitted_as_run(context.get_user_input(), run_trace_id(context))
        if refusal is not None:
            return await self.reasoning.unanswered(context, event_queue, refusal, owner)
        log.info("a2a.scenario", task_id=context.task_id, message_id=context.message.message_id)
        match scenario:
            case Reply(reply):
                await event_queue.enqueue_event(new_text_message(reply, context_id=context.context_id))
            case Script():
                updater = await self.reasoning.task_updater(context, event_queue)
                if await self.reasoning.unless_cancelled_elsewhere(play(scenario, updater), context.task_id) is None:
                    await updater.cancel()
            case _:
                assert_never(scenario)

    async def _admitted_as_run(self, text: str, trace_id: str) -> dict[str, Any] | None:
        """What the guard says to a `reasoning.execute` run of `text` by this caller, without running it: None
        when it lets it through (or no guard is installed), else the JSON-RPC error of its refusal. Its roles,
        rate limits and audit record apply to a scenario as to the run the message would otherwise start."""
        rpc = self.reasoning.rpc
        if rpc.guard is None:
            return None
        method = rpc.methods["reasoning.execute"]

        async def nothing_to_run() -> None:
            return None

        try:
            await rpc.guard(
                Call(trace_id=trace_id, method="reasoning.execute", access=method.access),
                method.params.model_construct(query=text),
                nothing_to_run,
            )
        except Exception as exc:
            return error_for(exc).body()
        return None

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await self.reasoning.cancel(context, event_queue)
