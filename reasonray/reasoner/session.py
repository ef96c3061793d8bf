"""The pipeline around the reasoner: session creation, routing of new turns and
client re-entry, provider population and restoration, and persistence through a repository.

Every request loads the session from the repository, so whichever process serves it (a fresh
session host after an eviction, a crash or a restart) continues exactly where the last one saved.
A turn's outcome is saved atomically: a completed turn, a hand-off to the client (exit mode 2), or
a failed turn (status idle again, the failure noted in the conversation). Re-entry results that do
not match the pending calls change nothing, so the client can send them again.

With passive learning on (`[memory] passive_learning`), a completed turn's exchange (the user's
message and the answer) is offered to the ReasoningBank after the turn is saved: learning that
fails or is skipped changes nothing in the session and is reported in the turn's `memory`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import msgspec
import structlog
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from reasonray.gateway.observed import ObservedLLM
from reasonray.gateway.protocol import LLM, Message
from reasonray.kernel import errors
from reasonray.kernel.errors import (
    NotFoundError,
    ReasonRayError,
    ReentryError,
    SessionStateError,
)
from reasonray.kernel.events import Event, EventRecorder, LLMInvocation, RecordMode, event_log_path
from reasonray.memory.loop import MemoryLoop, MemoryReport
from reasonray.reasoner.executor import MODE_TOOL, ToolExecutor
from reasonray.reasoner.providers import ContextProviders, ModeSpec, ModeState, SubmittedResult, ToolLedger
from reasonray.reasoner.reasoner import Completed, TurnReasoner
from reasonray.reasoner.tools import ClientTool, ToolBox
from reasonray.reasoner.trace import TurnStarted
from reasonray.stores.runs import RunIndex, RunRecord
from reasonray.stores.sessions import SessionStore, StoredSession

log = structlog.get_logger(__name__)

SESSION_ID = r"^[A-Za-z0-9_-]{8,64}$"
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant working through a conversation. Use the tools when they help; "
    "think inside <thinking>...</thinking> and give your final reply inside <answer>...</answer>."
)
Status = Literal["idle", "awaiting_client_tools", "closed"]


class SessionSpec(BaseModel):
    """What `session.create` takes: the session's modes, tools and bootstrap."""

    model_config = ConfigDict(extra="forbid")

    mode: str = Field("default", min_length=1, max_length=64, description="The mode the session starts in.")
    modes: dict[str, ModeSpec] | None = Field(None, description="Every mode by name; omitted: one mode with all tools.")
    server_tools: list[str] = Field(default_factory=list, description="Server tools by name (see session.tools).")
    client_tools: list[ClientTool] = Field(
        default_factory=list, max_length=64, description="Tools the client runs, as OpenAI function schemas."
    )
    bootstrap: str | None = Field(None, max_length=20_000, description="Welcome / initialisation text for the first turn (turn-scoped).")
    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, min_length=1, max_length=20_000, description="The session's system prompt.")
    max_llm_calls: int | None = Field(None, ge=1, le=64, description="Most LLM calls per turn; omitted: the server's default.")

    @model_validator(mode="after")
    def _consistent(self) -> SessionSpec:
        modes = self.modes or {self.mode: ModeSpec()}
        if self.mode not in modes:
            raise ValueError(f"mode {self.mode!r} is not one of the modes given ({', '.join(sorted(modes))})")
        client = [t.name for t in self.client_tools]
        clash = sorted((set(client) & set(self.server_tools)) | ({MODE_TOOL} & set(client)))
        if clash or len(set(client)) != len(client):
            raise ValueError(f"tool names must be unique across server and client tools (and not {MODE_TOOL!r}): {clash or client}")
        known = set(client) | set(self.server_tools)
        for name, spec in modes.items():
            if unknown := sorted(set(spec.tools or []) - known):
                raise ValueError(f"mode {name!r} lists tools the session does not have: {unknown}")
        return self


class SessionState(StoredSession):
    """A session as the repository stores it."""

    status: Status
    created_at: AwareDatetime
    updated_at: AwareDatetime
    spec: SessionSpec
    providers: dict[str, Any]
    turn: int = 0
    turn_llm_calls: int = 0
    turn_trace_id: str | None = None
    trace: list[dict[str, Any]] = Field(default_factory=list)
    last_answer: str | None = None
    last_error: dict[str, Any] | None = None
    # the request id of the last turn or re-entry whose outcome is saved, and that outcome ({"result": ...}
    # or {"error": ...}): a retry of that request (its host died before answering) gets it back, never a second run
    last_request_id: str | None = None
    last_outcome: dict[str, Any] | None = None


SessionRepository = SessionStore[SessionState]


def trim_history(history: list[Message], cap: int) -> None:
    """Keep the newest `cap` messages ([limits] max_session_history), without a tool result or a tool call
    at the front whose other half was cut (the next prompt would break the chat protocol)."""
    del history[:-cap]
    while history and (history[0].role == "tool" or history[0].tool_calls):
        del history[0]


class TurnUsage(BaseModel):
    """Tokens the LLM calls of one `session.turn` or `session.resume` call used (what token budgets are charged)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int = Field(0, description="Of completion_tokens, those the model spent thinking.")


class TurnResult(BaseModel):
    """What `session.turn` and `session.resume` return."""

    session_id: str
    turn: int = Field(description="The turn's number, from 1.")
    status: Literal["completed", "awaiting_client_tools"] = Field(description="Exit mode 1 or exit mode 2.")
    answer: str | None = Field(None, description="The final answer (exit mode 1).")
    pending_tool_calls: list[dict[str, Any]] = Field(
        default_factory=list, description="Client calls to run (exit mode 2): tool_call_id, name, arguments."
    )
    mode: str = Field(description="The session's mode after the turn.")
    llm_calls: int = Field(description="LLM calls the turn has made so far.")
    trace: list[dict[str, Any]] = Field(description="The turn's CompositionTrace, in order.")
    usage: TurnUsage = Field(
        default_factory=TurnUsage,
        description="Tokens this call's LLM calls used: a resumption counts only its own (a retried call answers with the first's).",
    )
    memory: MemoryReport | None = Field(
        None,
        description="Passive learning from the completed turn ([memory] passive_learning): 'captured' with the stored ids, or why it was skipped.",
    )


@dataclass(eq=False)
class SessionPipeline:
    repository: SessionRepository
    llm: LLM
    toolbox: ToolBox
    _: KW_ONLY
    data_dir: Path | None = None
    default_max_llm_calls: int = 8
    passive: MemoryLoop | None = None  # learns from completed turns; None: passive learning is off
    runs: RunIndex | None = None  # every turn (and each resumption) indexed with its event log; None: not indexed
    record: RecordMode = "full"  # [events] record: full text, sizes and hashes, or no event log
    max_history: int = 200  # messages kept per session ([limits] max_session_history)

    # -- routing: create, new turn, re-entry, inspection, close ----------------------------------------
    async def create(self, spec: SessionSpec, session_id: str | None = None) -> SessionState:
        self.toolbox.select(spec.server_tools)  # unknown names: InvalidParamsError listing what exists
        modes = spec.modes or {spec.mode: ModeSpec()}
        bootstrap = [text for text in (spec.bootstrap, modes[spec.mode].bootstrap) if text]
        providers = ContextProviders(spec.system_prompt, ModeState(spec.mode, modes), bootstrap=bootstrap)
        now = datetime.now(UTC)
        state = SessionState(
            session_id=session_id or uuid.uuid4().hex, status="idle", created_at=now, updated_at=now, spec=spec, providers=providers.dump()
        )
        await self.repository.save(state)
        log.info("session.created", session_id=state.session_id, mode=spec.mode)
        return state

    async def turn(self, session_id: str, message: str, trace_id: str, request_id: str | None = None) -> TurnResult:
        state = await self.require(session_id)
        if request_id is not None and state.last_request_id == request_id:
            return _replayed(state)
        _expect(state, "idle")
        providers = ContextProviders.load(state.providers)
        providers.history.append(Message(role="user", content=message))
        # the oldest messages go first: a long-lived session neither grows its file nor its prompts without end
        trim_history(providers.history, self.max_history)
        providers.ledger = ToolLedger()  # a fresh ledger per turn
        state = state.model_copy(
            update={
                "turn": state.turn + 1,
                "turn_llm_calls": 0,
                "turn_trace_id": trace_id,
                "trace": [],
                "last_error": None,
                "last_request_id": request_id,
            }
        )
        trace: list[Event] = [TurnStarted(trace_id=trace_id, strategy="session", turn=state.turn, mode=providers.mode.mode)]
        return await self._run(state, providers, trace, resume=False)

    async def resume(self, session_id: str, results: list[SubmittedResult], trace_id: str, request_id: str | None = None) -> TurnResult:
        state = await self.require(session_id)
        if request_id is not None and state.last_request_id == request_id:
            return _replayed(state)
        _expect(state, "awaiting_client_tools")
        providers = ContextProviders.load(state.providers)
        providers.ledger.submit(results)  # the pipeline populates ToolResults for client tools
        return await self._run(state.model_copy(update={"last_request_id": request_id}), providers, [], resume=True)

    async def close(self, session_id: str) -> dict[str, Any]:
        state = await self.require(session_id)
        if state.status != "closed":
            await self._save(state.model_copy(update={"status": "closed"}))
        return {"session_id": session_id, "status": "closed"}

    # -- one run of the reasoner, and its outcome saved -----------------------------------------------
    async def _run(self, state: SessionState, providers: ContextProviders, trace: list[Event], *, resume: bool) -> TurnResult:
        trace_id = state.turn_trace_id or state.session_id
        log_path = event_log_path(self.data_dir, trace_id) if self.data_dir else None
        recorder = EventRecorder(log_path, keep=False, mode=self.record)
        started = time.time()

        def emit(event: Event) -> None:
            recorder(event)
            if not isinstance(event, LLMInvocation):  # full text goes to the event log, not the trace
                trace.append(event)

        tools = {t.name: t for t in self.toolbox.select(state.spec.server_tools)}
        executor = ToolExecutor(tools, {t.name: t for t in state.spec.client_tools}, providers, emit, trace_id, "session")
        llm = ObservedLLM(self.llm, emit, trace_id=trace_id, strategy="session")
        max_llm_calls = state.spec.max_llm_calls or self.default_max_llm_calls
        reasoner = TurnReasoner(
            llm, providers, executor, emit, trace_id, "session", max_llm_calls=max_llm_calls, llm_calls=state.turn_llm_calls
        )
        outcome, error = "error", None
        try:
            exit_ = await (reasoner.resume() if resume else reasoner.run())
        except ReasonRayError as exc:
            error = type(exc).__name__
            # a failed turn ends: the session is idle again, the failure noted for the model and the client; a refused
            # re-entry changes nothing, so that the client can send the right results
            if not isinstance(exc, ReentryError):
                self._answered(providers, f"(This turn failed: {exc.message})")
                providers.ledger = ToolLedger()
                failure = {"error_type": error, "message": exc.message}
                last_error, last_outcome = {**failure, **exc.data}, _outcome(state, error={**failure, "data": exc.data})
                await self._save_turn(state, providers, reasoner, trace, status="idle", last_error=last_error, last_outcome=last_outcome)
                exc.data.setdefault("usage", _usage(reasoner).model_dump())  # a failed turn's tokens count towards budgets too
            raise _in_session(exc, state) from None
        else:
            answer = exit_.answer if isinstance(exit_, Completed) else None
            if completed := answer is not None:
                self._answered(providers, answer)
            status = "completed" if completed else "awaiting_client_tools"
            result = TurnResult(
                session_id=state.session_id,
                turn=state.turn,
                status=status,
                answer=answer,
                pending_tool_calls=_pending(providers),  # none once the turn is completed
                mode=providers.mode.mode,
                llm_calls=reasoner.llm_calls,
                trace=[*state.trace, *msgspec.to_builtins(trace)],
                usage=_usage(reasoner),
            )
            saved = {"last_answer": answer or state.last_answer, "last_outcome": _outcome(state, result=result)}
            await self._save_turn(state, providers, reasoner, trace, status="idle" if completed else status, **saved)
            outcome = "ok" if completed else status
            if completed and self.passive is not None:
                result = await self._learn_passively(state, providers, trace, emit, trace_id, result)
            return result
        finally:
            recorder.close()
            if self.runs is not None:
                run = RunRecord(
                    trace_id=trace_id,
                    kind="session",
                    strategy="session",
                    status=outcome,
                    **_usage(reasoner).model_dump(include={"prompt_tokens", "completion_tokens"}),
                    started_at=datetime.fromtimestamp(started, UTC),
                    elapsed_ms=int((time.time() - started) * 1000),
                    error=error,
                )
                try:
                    await self.runs.record(run, log_path)
                except Exception as exc:  # the turn's outcome is saved; only its index entry is missing
                    log.warning("session.run_not_indexed", trace_id=trace_id, error=f"{type(exc).__name__}: {exc}"[:300])

    def _answered(self, providers: ContextProviders, answer: str) -> None:
        """The turn's last word joins the conversation, which keeps its cap in what is saved too."""
        providers.history.append(Message(role="assistant", content=answer))
        trim_history(providers.history, self.max_history)

    async def _learn_passively(
        self, state: SessionState, providers: ContextProviders, trace: list[Event], emit: Any, trace_id: str, result: TurnResult
    ) -> TurnResult:
        """Offer the completed turn's exchange to passive learning; its steps join the saved trace."""
        assert self.passive is not None and result.answer is not None
        question = next(m.content for m in reversed(providers.history) if m.role == "user")
        report = self.passive.report(None, f"{state.session_id}-turn-{state.turn}")
        learned_from = len(trace)
        llm = ObservedLLM(self.llm, emit, trace_id=trace_id, strategy="session")
        await self.passive.passive(report, llm, emit, question or "", result.answer)
        steps = msgspec.to_builtins(trace[learned_from:])
        learned = result.model_copy(update={"memory": report, "trace": [*result.trace, *steps]})
        try:
            saved = await self.require(state.session_id)
            await self._save(saved.model_copy(update={"trace": [*saved.trace, *steps], "last_outcome": _outcome(state, result=learned)}))
        except OSError as exc:  # the turn is saved; only its learning steps are missing from the stored trace
            log.warning("session.learning_steps_not_saved", session_id=state.session_id, error=f"{type(exc).__name__}: {exc}")
        return learned

    async def _save_turn(
        self, state: SessionState, providers: ContextProviders, reasoner: TurnReasoner, trace: list[Event], **update: Any
    ) -> None:
        """The turn's outcome saved: its providers, its LLM calls so far, its trace and `update`."""
        turn = {"providers": providers.dump(), "turn_llm_calls": reasoner.llm_calls, "trace": [*state.trace, *msgspec.to_builtins(trace)]}
        await self._save(state.model_copy(update={**turn, **update}))

    async def require(self, session_id: str) -> SessionState:
        """The session's saved state; NotFoundError when there is none."""
        state = await self.repository.load(session_id)
        if state is None:
            raise NotFoundError(f"no session {session_id!r}; create one with session.create", {"session_id": session_id})
        return state

    async def _save(self, state: SessionState) -> None:
        await self.repository.save(state.model_copy(update={"updated_at": datetime.now(UTC)}))


def _view(state: SessionState) -> dict[str, Any]:
    """What session.get shows of a session."""
    providers = ContextProviders.load(state.providers)
    return {
        "session_id": state.session_id,
        "status": state.status,
        "mode": providers.mode.mode,
        "turn": state.turn,
        "created_at": state.created_at.isoformat(),
        "updated_at": state.updated_at.isoformat(),
        "pending_tool_calls": _pending(providers),
        "messages": len(providers.history),
        "last_answer": state.last_answer,
        "last_error": state.last_error,
        "trace": state.trace,
        "server_tools": state.spec.server_tools,
        "client_tools": [t.name for t in state.spec.client_tools],
    }


def _outcome(state: SessionState, *, result: TurnResult | None = None, error: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What a retry of the request gets back; nothing for calls without a request id (in-process callers)."""
    if state.last_request_id is None:
        return None
    return {"result": result.model_dump(mode="json")} if result is not None else {"error": error}


def _replayed(state: SessionState) -> TurnResult:
    """The saved outcome of a request that already ran: its result, or its error raised again."""
    outcome = state.last_outcome or {}
    if "result" in outcome:
        log.info("session.request_replayed", session_id=state.session_id, turn=state.turn)
        # the usage stays: a replay answers the retry of a call whose first answer was lost, so nothing charged it yet
        return TurnResult.model_validate(outcome["result"])
    error = outcome.get("error") or {"error_type": "ReasonRayError", "message": "the request failed", "data": {}}
    kind = getattr(errors, error["error_type"], None)
    if not (isinstance(kind, type) and issubclass(kind, ReasonRayError)):
        kind = ReasonRayError
    raise _in_session(kind(error["message"], dict(error["data"])), state)


def _usage(reasoner: TurnReasoner) -> TurnUsage:
    tally = reasoner.llm.tally  # type: ignore[attr-defined]  # the ObservedLLM of SessionPipeline._reasoner
    counts = {key: getattr(tally, key) for key in ("prompt_tokens", "completion_tokens", "reasoning_tokens")}
    return TurnUsage(**counts, total_tokens=tally.prompt_tokens + tally.completion_tokens)


def _in_session(exc: ReasonRayError, state: SessionState) -> ReasonRayError:
    """The same error, naming the session and its turn."""
    exc.message = f"session {state.session_id!r}, turn {state.turn}: {exc.message}"
    exc.data.setdefault("session_id", state.session_id)
    exc.args = (exc.message,)
    return exc


def _pending(providers: ContextProviders) -> list[dict[str, Any]]:
    return [{"tool_call_id": e.tool_call_id, "name": e.tool, "arguments": _json_or_text(e.arguments)} for e in providers.ledger.pending()]


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _expect(state: SessionState, status: Status) -> None:
    """SessionStateError unless the session is in `status` (reading or closing a closed session is fine: only
    turns and re-entries expect)."""
    data = {"session_id": state.session_id, "status": state.status}
    if state.status == status:
        return
    if state.status == "closed":
        raise SessionStateError(f"session {state.session_id!r} is closed; create a new one with session.create", data)
    if state.status == "awaiting_client_tools":
        ids = [e["tool_call_id"] for e in _pending(ContextProviders.load(state.providers))]
        raise SessionStateError(
            f"session {state.session_id!r} is waiting for the results of client tool calls {', '.join(ids)}; "
            "send them with session.resume before a new turn",
            {**data, "pending_tool_call_ids": ids},
        )
    raise SessionStateError(f"session {state.session_id!r} has no pending client tool calls; send a new turn with session.turn", data)


def submitted(results: list[dict[str, Any]]) -> list[SubmittedResult]:
    """`session.resume`'s tool_results as the ledger takes them."""
    return [SubmittedResult(r["tool_call_id"], r["content"], r.get("is_error", False)) for r in results]


class Sessions:
    """The session API's backend over a pipeline: everything in this process (`LocalSessions`, tests and notebooks), or
    turns, re-entries and close on the session hosts (`actors/session.py`'s `RaySessions` overrides those three)."""

    def __init__(self, pipeline: SessionPipeline) -> None:
        self.pipeline = pipeline

    async def create(self, spec: SessionSpec) -> dict[str, Any]:
        shown = _view(await self.pipeline.create(spec))
        return {key: shown[key] for key in ("session_id", "status", "mode", "server_tools", "client_tools")}

    async def turn(self, session_id: str, message: str, trace_id: str) -> dict[str, Any]:
        return (await self.pipeline.turn(session_id, message, trace_id)).model_dump(mode="json")

    async def resume(self, session_id: str, results: list[dict[str, Any]], trace_id: str) -> dict[str, Any]:
        return (await self.pipeline.resume(session_id, submitted(results), trace_id)).model_dump(mode="json")

    async def get(self, session_id: str) -> dict[str, Any]:
        return _view(await self.pipeline.require(session_id))

    async def close(self, session_id: str) -> dict[str, Any]:
        return await self.pipeline.close(session_id)

    def tools(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.pipeline.toolbox.tools.values()]


LocalSessions = Sessions  # in this process, the base itself
