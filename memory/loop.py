"""Memory-aware runs: retrieve memories into a run's prompts, then learn from the run.

Any strategy can run memory-aware. Before it starts, the task is embedded and the best memories
of the workspace go into every system prompt of the run (`ObservedLLM.guidance`), with the
instruction to decide whether each applies and lessons from failures flagged as warnings. After
it ends, with `learn`, the run's trajectories are judged (a verifier when the request gives an
expected answer, else the LLM judge), memory items are extracted (self-contrast when the strategy
reported several attempts, as MaTTS does) and stored with the trace. Passive learning, when
configured, does the same for good Q&A exchanges of runs that did not ask to learn.

Learning happens after the answer exists: if it fails, the run still returns its answer, with
`learn_error` saying why, and nothing half-written is stored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field

from reasonray.gateway.observed import ObservedLLM
from reasonray.kernel.config import MemorySettings
from reasonray.kernel.events import (
    EventSink,
    LLMInvocation,
    MemoryLearning,
    MemoryRetrieval,
    RunWarning,
)
from reasonray.memory.items import (
    WORKSPACE,
    MemoryItem,
    Trajectory,
    format_memory_block,
)
from reasonray.memory.learning import (
    Learner,
    Verifier,
    exact_verifier,
    passive_rejects,
)
from reasonray.memory.service import MemoryClient

log = structlog.get_logger(__name__)


class MemoryParams(BaseModel):
    """The `memory` parameter of reasoning.execute."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Retrieve memories into the run's prompts.")
    workspace: str | None = Field(None, pattern=WORKSPACE, description="Workspace to read (and learn into); default: the server's.")
    top_k: int | None = Field(None, ge=1, le=20, description="Past tasks whose memories are retrieved (server default: 1).")
    learn: bool = Field(False, description="After the run: judge it, extract memory items and store them.")
    task_id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Identifies the task; its own memories are never retrieved for it. Default: the trace id.",
    )
    expected_answer: str | None = Field(
        None, max_length=10_000, description="Ground truth: the verifier labels the run instead of the LLM judge."
    )
    domain: str | None = Field(
        None, max_length=100, description="The task's domain: matching lessons from failures rank higher; stored items get it."
    )
    min_similarity: float | None = Field(None, ge=0, le=1, description="Override of the server's similarity floor.")


class RetrievedSummary(BaseModel):
    id: str
    title: str
    warning: bool
    composite: float
    similarity: float


class MemoryReport(BaseModel):
    workspace: str
    task_id: str
    retrieved: list[RetrievedSummary] = Field(default_factory=list, description="Memories put into the run's prompts.")
    stored: list[str] = Field(default_factory=list, description="Ids of the memories learned from this run.")
    outcome: str | None = Field(None, description="success or failure, when the run was judged.")
    judged_by: str | None = Field(None, description="verifier or llm_judge.")
    learn_error: str | None = Field(None, description="Why learning failed; the answer stands.")
    passive: str | None = Field(None, description="Passive learning: 'captured', or why the exchange was skipped.")


@dataclass(eq=False)
class MemoryLoop:
    client: MemoryClient
    settings: MemorySettings

    def report(self, params: MemoryParams | None, trace_id: str) -> MemoryReport:
        workspace = (params.workspace if params else None) or self.settings.default_workspace
        return MemoryReport(workspace=workspace, task_id=(params.task_id if params else None) or trace_id)

    async def retrieve(self, params: MemoryParams, report: MemoryReport, llm: ObservedLLM, emit: EventSink, query: str) -> None:
        started = time.perf_counter()
        options = params.model_dump(include={"top_k", "domain", "min_similarity"})
        found = await self.client.retrieve(query, report.workspace, exclude_task_ids=[report.task_id], **options)
        items = [MemoryItem.model_validate(r["memory"]) for r in found]
        llm.guidance = format_memory_block(items) or None
        report.retrieved = [  # of the scores, the summary keeps the composite and the similarity
            RetrievedSummary(id=str(i.id), title=i.title, warning=i.is_warning, **r["scores"]) for i, r in zip(items, found, strict=False)
        ]
        emit(
            MemoryRetrieval(
                **_about(llm, report),
                memories=[r.model_dump() for r in report.retrieved],
                latency_ms=round((time.perf_counter() - started) * 1000, 3),
            )
        )

    async def learn(
        self,
        params: MemoryParams,
        report: MemoryReport,
        llm: ObservedLLM,
        emit: EventSink,
        query: str,
        trajectories: list[Trajectory],
        verifier: Verifier | None = None,
    ) -> None:
        llm.guidance = None  # the judge and the extractor see the task, not the memories
        if verifier is None and params.expected_answer is not None:
            verifier = exact_verifier(params.expected_answer)
        try:
            entry, _ = await self._learner(llm).learn(
                query, trajectories, task_id=report.task_id, workspace=report.workspace, verifier=verifier, domain=params.domain
            )
            stored = await self.client.store_entry(entry.model_dump(mode="json"), report.workspace)
        except Exception as exc:  # the answer stands; say why nothing was learned
            report.learn_error = f"{type(exc).__name__}: {exc}"[:500]
            emit(RunWarning(trace_id=llm.trace_id, strategy=llm.strategy, code="learning_failed", message=report.learn_error))
            log.warning("memory.learning_failed", trace_id=llm.trace_id, error=report.learn_error)
            return
        report.outcome, report.judged_by = entry.outcome, entry.judged_by
        report.stored = [i["id"] for i in stored["items"]]
        emit(_learning(llm, report, outcome=entry.outcome, judged_by=entry.judged_by, trajectories=len(trajectories), source="judged"))

    async def passive(self, report: MemoryReport, llm: ObservedLLM, emit: EventSink, query: str, answer: str) -> None:
        """Learn from a good exchange nobody asked to learn from (passive learning)."""
        why_not = passive_rejects(query, answer, self.settings.passive_min_answer_chars)
        if why_not is None:
            llm.guidance = None
            try:
                items = await self._learner(llm).passive(query, answer, task_id=report.task_id, workspace=report.workspace)
                if not items:
                    why_not = "the extractor found nothing reusable"
                else:
                    stored = await self.client.store_items(
                        [i.model_dump(mode="json") for i in items], report.workspace, [query] * len(items)
                    )
                    report.stored = [i["id"] for i in stored]
            except Exception as exc:
                why_not = f"learning failed: {type(exc).__name__}: {exc}"[:300]
        report.passive = "captured" if why_not is None else f"skipped: {why_not}"
        try:
            await self.client.record_passive(why_not is None)
        except Exception as exc:  # statistics only: the answer stands
            log.warning("memory.stats_not_recorded", error=f"{type(exc).__name__}: {exc}"[:300])
        if why_not is None:
            emit(_learning(llm, report, outcome="success", judged_by="passive", trajectories=1, source="passive"))

    def _learner(self, llm: ObservedLLM) -> Learner:
        s = self.settings
        return Learner(
            llm, max_items=s.max_items_per_trajectory, max_contrast_items=s.max_contrast_items, worked_examples=s.worked_examples
        )


def _about(llm: ObservedLLM, report: MemoryReport) -> dict[str, Any]:
    """The run and the task a memory event is about."""
    return {"trace_id": llm.trace_id, "strategy": llm.strategy, "workspace": report.workspace, "task_id": report.task_id}


def _learning(llm: ObservedLLM, report: MemoryReport, **fields: Any) -> MemoryLearning:
    """The event of what the run's learning stored."""
    return MemoryLearning(**_about(llm, report), stored=report.stored, **fields)


@dataclass(eq=False)
class TrajectoryCapture:
    """Wraps a run's event sink to keep the text of its LLM replies: the trajectory, when the strategy reports none.
    The replies' text is `Choice.text` (LLM_INVOCATION's `responses`): a reasoning model's thinking, in the event's
    `reasoning`, is never fed to the judge and the extraction."""

    sink: EventSink
    replies: list[str] = field(default_factory=list)

    def __call__(self, event: Any) -> None:
        if isinstance(event, LLMInvocation) and event.responses:
            self.replies.append(event.responses[0])
        self.sink(event)

    def trajectory(self, answer: str) -> Trajectory:
        return Trajectory(text="\n\n".join(self.replies) or answer, answer=answer, selected=True)
