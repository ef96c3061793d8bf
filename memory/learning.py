"""The learning loop of the ReasoningBank paper (arXiv 2509.25140): judge a trajectory, extract
memory items from it, and (for MaTTS) contrast several trajectories.

- Judging: a verifier gives the label when there is one (an expected answer, unit tests);
  otherwise an LLM judge at temperature 0 labels the trajectory success or failure.
- Extraction: separate prompts for successes ("why it worked") and failures ("why it failed and
  how to prevent it"), at most `max_items` items each, general rather than tied to the task.
  Items from failures carry error context (type, pattern, corrective guidance).
- Self-contrast (MaTTS parallel): all k trajectories in one prompt; at most `max_contrast_items`
  items on what the successes share and where the failures went wrong.
- Passive learning: a Q&A exchange that passes the quality thresholds becomes items too.
- Worked examples: when the model writes no usable item but a verifier accepted an attempt, that attempt
  is stored as a worked example (task, reasoning, answer), so a model too weak to follow the extraction
  format still leaves something that verifiably worked for the next similar task.

Model replies use tags (`<status>`, `<memory>` with `<title>`, `<description>`, `<content>` and,
for failures, `<error_type>`, `<failure_pattern>`, `<corrective_guidance>`); blocks that do not
parse or validate are skipped, never stored half-formed.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Literal

from pydantic import ValidationError

from reasonray.gateway.protocol import LLM, LLMRequest, system, user
from reasonray.kernel.errors import ModelBehaviorError
from reasonray.kernel.extraction import final_number
from reasonray.kernel.tags import extract_tag, normalize_answer
from reasonray.memory.items import (
    ErrorContext,
    MemoryEntry,
    MemoryItem,
    Outcome,
    SourceType,
    Trajectory,
)

Verifier = Callable[[str], Awaitable[bool]]
"""Checks an answer against ground truth (an expected answer, unit tests): True is a success."""

MAX_TRAJECTORY_CHARS = 12_000
TEXT_FIELDS = {"title": 200, "description": 500, "content": 4000}  # an item's text fields and the longest each is kept
ERROR_KEYS = ("error_type", "failure_pattern", "corrective_guidance")
MEMORY_BLOCK = re.compile(r"<memory>(.*?)</memory>", re.DOTALL)

JUDGE_PROMPT = (
    "You are an expert in evaluating whether an AI agent solved a task. You are given the task and the "
    "agent's trajectory: its reasoning and its final answer. Decide whether the final answer correctly and "
    "completely solves the task. Check the reasoning step by step for errors; an answer reached through a "
    "wrong step is a failure.\n"
    "Reply with your reasoning, then exactly one verdict: <status>success</status> or <status>failure</status>."
)

ITEM_FORMAT = (
    "Write each memory item as:\n"
    "<memory><title>a short name for the strategy or lesson</title>"
    "<description>one sentence summarising it</description>"
    "<content>1-3 sentences of actionable guidance</content>{error_fields}</memory>"
)
ERROR_FIELDS = (
    "<error_type>the kind of error</error_type><failure_pattern>what went wrong, in general terms</failure_pattern>"
    "<corrective_guidance>how to avoid it next time</corrective_guidance>"
)
GENERAL = (
    "Do not repeat similar or overlapping items. Do not mention the specific task, its numbers or its "
    "strings: write insights that carry over to other tasks."
)
SUCCESS_PROMPT = (
    "You are an expert in distilling reusable reasoning strategies. You are given a task and a trajectory "
    "that solved it successfully. First think about why the trajectory succeeded, then summarise the "
    "insights as at most {n} memory items. " + GENERAL + "\n" + ITEM_FORMAT.format(error_fields="")
)
FAILURE_PROMPT = (
    "You are an expert in learning from mistakes. You are given a task and a trajectory that failed to "
    "solve it. First reflect on why it failed, then summarise the lessons and the strategies that prevent "
    "this failure in future as at most {n} memory items, each with its error context. "
    + GENERAL
    + "\n"
    + ITEM_FORMAT.format(error_fields=ERROR_FIELDS)
)
CONTRAST_PROMPT = (
    "You are an expert in distilling reusable reasoning strategies. You are given a task and several "
    "trajectories that attempted it, each labelled success or failure. Compare and contrast them: what do "
    "the successful ones share, and where exactly did the failed ones go wrong? Summarise at most {n} memory "
    "items. Lessons from failures carry their error context. "
    + GENERAL
    + "\n"
    + ITEM_FORMAT.format(error_fields="")
    + "\nand for a lesson from a failure, add inside the memory: "
    + ERROR_FIELDS
)
PASSIVE_PROMPT = (
    "You are an expert in capturing knowledge. You are given a question and the answer it received. "
    "Extract the reusable knowledge in the answer as at most {n} memory items. " + GENERAL + "\n" + ITEM_FORMAT.format(error_fields="")
)

# What the prompts show: the task, then the trajectory (or several, numbered) with its final answer last.
JUDGE_TEMPLATE = "Task:\n{query}\n\nTrajectory:\n{trajectory}\n\nFinal answer: {answer}"
EXTRACT_TEMPLATE = "Task:\n{query}\n\nTrajectory ({outcome}):\n{trajectory}\n\nFinal answer: {answer}"
CONTRAST_ITEM = "Trajectory {number} ({outcome}):\n{trajectory}\nFinal answer: {answer}"
CONTRAST_TEMPLATE = "Task:\n{query}\n\n{trajectories}"
PASSIVE_TEMPLATE = "Question:\n{question}\n\nAnswer:\n{answer}"


@dataclass(frozen=True)
class Judgement:
    outcome: Outcome
    judged_by: Literal["verifier", "llm_judge"]


def passive_rejects(question: str, answer: str, min_answer_chars: int = 100) -> str | None:
    """Why an exchange is not worth learning from passively, or None when it is."""
    if len(answer.strip()) < min_answer_chars:
        return f"answer shorter than {min_answer_chars} characters"
    if len(question.strip()) < 10:
        return "question shorter than 10 characters"
    return None


def clip(text: str, limit: int = MAX_TRAJECTORY_CHARS) -> str:
    """Head and tail of a long trajectory, with the cut marked."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters omitted ...]\n{text[-half:]}"


def exact_verifier(expected: str) -> Verifier:
    """Success when the answer equals `expected` once normalised ("1,200.00" equals "1200"), or, for a numeric
    `expected`, when the answer's last number does: an untagged reply ("The larger is 52.") states its answer last,
    the way answer scorers read it, and judging it a failure would teach the memory the opposite of the truth."""
    want = normalize_answer(expected)
    numeric = normalize_answer(final_number(expected) or "") == want

    async def verify(answer: str) -> bool:
        if normalize_answer(answer) == want:
            return True
        last = final_number(answer) if numeric else None
        return last is not None and normalize_answer(last) == want

    return verify


@dataclass(eq=False)
class Learner:
    """Judges and extracts with one LLM (strategies' model, cache and retries included)."""

    llm: LLM
    _: KW_ONLY
    max_items: int = 3
    max_contrast_items: int = 5
    max_tokens: int = 2048
    worked_examples: bool = True

    async def _ask(self, instructions: str, content: str, purpose: str) -> str:
        request = LLMRequest(messages=(system(instructions), user(content)), max_tokens=self.max_tokens, temperature=0.0, purpose=purpose)
        return (await self.llm.complete(request)).text

    async def judge(self, query: str, trajectory: Trajectory, verifier: Verifier | None = None) -> Judgement:
        if verifier is not None:
            return Judgement("success" if await verifier(trajectory.answer) else "failure", "verifier")
        reply = await self._ask(
            JUDGE_PROMPT, JUDGE_TEMPLATE.format(query=query, trajectory=clip(trajectory.text), answer=trajectory.answer), "judge"
        )
        status = (extract_tag(reply, "status") or "").strip().lower()
        if status not in ("success", "failure"):
            raise ModelBehaviorError(
                "the judge gave no <status>success</status> or <status>failure</status> verdict",
                {"reply": reply[:500]},
            )
        return Judgement(status, "llm_judge")  # type: ignore[arg-type]

    async def _extract(
        self, prompt: str, content: str, source: SourceType, limit: int, *, require_error: bool = False, **common
    ) -> list[MemoryItem]:
        """Ask for items with `prompt`; the reply's usable ones, from `source`."""
        reply = await self._ask(prompt.format(n=limit), content, f"extract_{source}")
        drafts = [{k: extract_tag(body, k) for k in (*TEXT_FIELDS, *ERROR_KEYS, "tags")} for body in MEMORY_BLOCK.findall(reply)]
        usable = [d for d in drafts if all(d[k] for k in TEXT_FIELDS) and (all(d[k] for k in ERROR_KEYS) or not require_error)]
        items = []
        for d in usable[:limit]:  # a block that does not parse or validate is skipped, never stored half-formed
            error = ErrorContext(**{k: d[k] for k in ERROR_KEYS}) if all(d[k] for k in ERROR_KEYS) else None
            tags = [t.strip() for t in (d["tags"] or "").split(",") if t.strip()][:20]
            text = {k: d[k][:cap] for k, cap in TEXT_FIELDS.items()}
            with contextlib.suppress(ValidationError):
                items.append(MemoryItem(**text, error_context=error, pattern_tags=tags, source_type=source, **common))
        return items

    async def extract(self, query: str, trajectory: Trajectory, outcome: Outcome, **common) -> list[MemoryItem]:
        shown = EXTRACT_TEMPLATE.format(query=query, outcome=outcome, trajectory=clip(trajectory.text), answer=trajectory.answer)
        prompt = SUCCESS_PROMPT if outcome == "success" else FAILURE_PROMPT
        return await self._extract(prompt, shown, outcome, self.max_items, require_error=outcome == "failure", **common)

    async def contrast(self, query: str, judged: Sequence[tuple[Trajectory, Outcome]], **common) -> list[MemoryItem]:
        shown = "\n\n".join(
            CONTRAST_ITEM.format(number=i, outcome=outcome, trajectory=clip(t.text, MAX_TRAJECTORY_CHARS // len(judged)), answer=t.answer)
            for i, (t, outcome) in enumerate(judged, 1)
        )
        content = CONTRAST_TEMPLATE.format(query=query, trajectories=shown)
        return await self._extract(CONTRAST_PROMPT, content, "contrast", self.max_contrast_items, **common)

    async def passive(self, question: str, answer: str, **common) -> list[MemoryItem]:
        content = PASSIVE_TEMPLATE.format(question=question, answer=clip(answer))
        return await self._extract(PASSIVE_PROMPT, content, "passive", self.max_items, **common)

    async def learn(
        self,
        query: str,
        trajectories: Sequence[Trajectory],
        *,
        task_id: str,
        workspace: str,
        verifier: Verifier | None = None,
        domain: str | None = None,
    ) -> tuple[MemoryEntry, list[Judgement]]:
        """Judge every trajectory, then extract: one trajectory by its outcome, several by self-contrast."""
        if not trajectories:
            raise ValueError("learning needs at least one trajectory")
        judgements = [await self.judge(query, t, verifier) for t in trajectories]
        common = {"task_id": task_id, "workspace": workspace, "domain_category": domain}
        judged = list(zip(trajectories, judgements, strict=True))
        if len(trajectories) == 1:
            items = await self.extract(query, trajectories[0], judgements[0].outcome, **common)
            text = trajectories[0].text
        else:
            items = await self.contrast(query, [(t, j.outcome) for t, j in judged], **common)
            text = "\n\n".join(f"[trajectory {i} - {j.outcome}]\n{t.text}" for i, (t, j) in enumerate(judged, 1))
        verified = [t for t, j in judged if j.outcome == "success" and j.judged_by == "verifier"]
        if not items and verified and self.worked_examples:
            # a verified attempt stored as it was: what a model that writes no memory items still learns from
            worked = verified[0]
            items = [
                MemoryItem(
                    title="Worked example",
                    description=f"A solved task: {query if len(query) <= 480 else query[:477] + '...'}",
                    content=f"{clip(worked.text, 3000)}\nFinal answer: {worked.answer[:500]}",
                    pattern_tags=["worked-example"],
                    source_type="success",
                    **common,
                )
            ]
        chosen = [j for t, j in judged if t.selected] or judgements[-1:]
        outcome: Outcome = chosen[0].outcome  # the outcome of the answer the task returned
        entry = MemoryEntry(task_id=task_id, query=query, trajectory=text, outcome=outcome, judged_by=judgements[0].judged_by, items=items)
        return entry, judgements
