"""Think, evaluate, refine: the iterative agent of the ReasoningBank system.

Each iteration the model solves (or, after the first, re-examines its previous attempt in the light
of the feedback), then an evaluator at temperature 0 scores the attempt from 0 to 1 with specific
feedback. The loop stops early when a score is above `threshold` (0.8), stops when an attempt
repeats an earlier one (the trajectory hash, answer and reasoning, was seen before: refining again
would loop), and otherwise runs `max_iterations` (3). The answer is the best-scored attempt's,
ties going to the earlier one. An evaluation whose score cannot be read (`<score>`, JSON where the
endpoint enforces a schema, "Score: 8/10", "80%") is unscored: it never stops the loop and never
beats a scored attempt. A refinement that holds no answer, or only talks about the review without
stating one, is degenerate and never chosen over a real attempt. All attempts, with their scores and
feedback, form the trajectory that memory learning sees.

A refinement or an evaluation that fails (the provider) costs that iteration, not the run: the loop stops
(`stop_reason: "failed"`, `failures` by error type) and the answer is the best of the attempts that
finished, an attempt whose evaluation failed counting as unscored; so a MaTTS attempt that runs refine keeps
its vote too. Only a first attempt that fails fails the run. Cancellation, the deadline and the caller's
budget (`RUN_ENDING`) fail it at once.

As it goes, the run's `progress` keeps the iterations done, the last draft (thinking stripped) with
its critique (score and feedback, once evaluated) and the best-scored answer so far: what
`error.data.partial` carries when the run fails part-way.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from reasonray.kernel.errors import ModelBehaviorError
from reasonray.kernel.events import IterationEnd
from reasonray.kernel.extraction import Extracted, find_answer, find_feedback, find_score, numeric_question
from reasonray.kernel.tags import normalize_answer, strip_thinking
from reasonray.memory.items import Trajectory
from reasonray.strategies.base import (
    ReasoningResult,
    Strategy,
    StrategyConfig,
    StrategyContext,
    ends_run,
    failure_kinds,
)
from reasonray.strategies.chain_of_thought import SYSTEM_PROMPT
from reasonray.strategies.output import ANSWER, CRITIQUE, ask, note_found_by

EVALUATE_PROMPT = (
    "You are a strict reviewer. Check the proposed solution to the problem step by step: is every step "
    "right, and does the answer solve the problem? Rate it from 0 to 1 inside <score>...</score> (1: certainly "
    "correct and complete, 0: wrong), then say specifically what to fix inside <feedback>...</feedback>."
)
REFINE_PROMPT = (
    "Carefully re-examine your previous attempt at the problem, including every reasoning step, in the light "
    "of the reviewer's feedback. If you find mistakes or inconsistencies, correct them; if everything is right, "
    "confirm your answer. Think step by step inside <thinking>...</thinking>, then give only the final answer "
    "inside <answer>...</answer>."
)
# The evaluation shows the attempt with its answer last; a re-examination adds the review.
EVALUATE_TEMPLATE = "Problem:\n{query}\n\nProposed solution:\n{solution}\nAnswer: {answer}"
REFINE_TEMPLATE = (
    "Problem:\n{query}\n\nPrevious attempt:\n{solution}\nAnswer: {answer}\n\nReviewer's score: {score}\nReviewer's feedback: {feedback}"
)
NO_FEEDBACK = "(none)"
UNSCORED = "(none)"
# a refinement that discusses the review instead of solving the problem again
REVIEW_TALK = re.compile(r"\b(?:review(?:er|er's)?|feedback|score[ds]?|critique|rating)\b", re.IGNORECASE)


class RefineConfig(StrategyConfig):
    max_iterations: int = Field(3, ge=1, le=10, description="Most think-evaluate-refine iterations.")
    threshold: float = Field(0.8, ge=0.0, le=1.0, description="A score above this stops early.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature of the first attempt (the evaluator uses 0).")
    refine_temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature of the re-examinations.")
    seed: int | None = Field(None, description="Seed of the attempts; attempt i uses seed + i.")
    max_tokens: int = Field(4096, ge=1, le=262_144, description="Most tokens per attempt.")
    evaluate_max_tokens: int = Field(1024, ge=16, le=32_768, description="Most tokens per evaluation.")


async def evaluate(query: str, text: str, answer: str, max_tokens: int, context: StrategyContext) -> tuple[float | None, str]:
    """A 0-1 score (None: unscored) and feedback for one attempt (temperature 0, so repeatable and cacheable)."""
    shown = lambda parts: EVALUATE_TEMPLATE.format(query=query, solution=parts[0], answer=parts[1])
    # an attempt that rambled to the context's end is shown cut (head and tail), so the review fits the context
    quoted = (strip_thinking(text), answer)
    completion, enforced = await ask(
        context, CRITIQUE, EVALUATE_PROMPT, shown, quoted, max_tokens=max_tokens, temperature=0.0, purpose="critique"
    )
    return find_score(completion.text, structured=enforced), find_feedback(completion.text, structured=enforced)


def degenerate(iteration: int, text: str, found: Extracted | None) -> bool:
    """An attempt with no answer, or a refinement that talks about the review without stating an answer."""
    if found is None or not found.answer.strip():
        return True
    return iteration > 1 and found.found_by in ("final_number", "whole_text") and bool(REVIEW_TALK.search(strip_thinking(text)))


def rank(attempt: dict[str, Any]) -> tuple[bool, bool, float, int]:
    """Real before degenerate, scored before unscored, higher scores first, then the earlier attempt."""
    score = attempt["score"]
    return (not attempt["degenerate"], score is not None, score or 0.0, -attempt["iteration"])


def trajectory_hash(text: str, answer: str) -> str:
    reasoning = " ".join(text.split()).lower()
    return hashlib.sha256(f"{normalize_answer(answer)}\x00{reasoning}".encode()).hexdigest()[:16]


class Refine(Strategy):
    name = "refine"
    description = "Think, evaluate (score and feedback), refine: up to 3 iterations, early stop above 0.8, loop detection."
    Config = RefineConfig
    extra_capabilities = ("reasoning.iterative", "reasoning.self_evaluation")

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        run = _Run(self.name, query, self.parse_config(config), context)
        # the documented partial shape from the start, so a failure before any draft still has every key
        context.progress.update(iterations=0, last_draft=None, last_answer=None, last_score=None, last_critique=None, answer=None)
        for iteration in range(1, run.cfg.max_iterations + 1):
            if (stop := await run.iteration(iteration)) != "continue":
                return run.finish(stop)
        return run.finish("max_iterations")


@dataclass
class _Run:
    """One refine run: its query, config and context, the attempts so far, their hashes and the failures met."""

    strategy: str
    query: str
    cfg: RefineConfig
    context: StrategyContext
    attempts: list[dict[str, Any]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # the attempts' trajectory hashes, for loop detection
    failures: list[Exception] = field(default_factory=list)

    async def iteration(self, iteration: int) -> str:
        """One attempt and its review, appended to `attempts`; the stop reason, or "continue"."""
        context, attempts = self.context, self.attempts
        before = context.llm.tally.prompt_tokens, context.llm.tally.completion_tokens
        try:
            completion, enforced = await self.attempt(iteration)
        except Exception as exc:
            if not attempts or ends_run(exc):
                raise  # nothing finished to answer with, or the run itself is over
            self.failures.append(exc)
            self.iteration_end(iteration, before, False, "failed")
            return "failed"
        text = completion.text
        found = find_answer(text, numeric=numeric_question(self.query), structured=enforced)
        answer = found.answer if found is not None else ""
        if found is not None:
            note_found_by(context, self.strategy, found, f"the answer of iteration {iteration}")
        context.progress.update(
            iterations=len(attempts), last_draft=strip_thinking(text), last_answer=answer, last_score=None, last_critique=None
        )
        digest = trajectory_hash(text, answer)
        if digest in self.seen:
            context.warn(self.strategy, "loop_detected", f"iteration {iteration} repeated an earlier attempt; refining stopped")
            self.iteration_end(iteration, before, True, "loop_detected")
            return "loop_detected"
        self.seen.add(digest)
        failed = False  # an evaluation that fails leaves the attempt standing, unscored
        try:
            score, feedback = await evaluate(self.query, text, answer, self.cfg.evaluate_max_tokens, context)
        except Exception as exc:
            if ends_run(exc):
                raise
            self.failures.append(exc)  # with no review there is nothing to refine on
            score, feedback, failed = None, "", True
        if score is None and not failed:
            context.warn(
                self.strategy,
                "unscored",
                f"the evaluator gave no readable score for iteration {iteration}; it stays unscored "
                "(it cannot stop the loop or beat a scored attempt)",
            )
        attempts.append(
            {
                "iteration": iteration,
                "text": text,
                "answer": answer,
                "score": score,
                "feedback": feedback,
                "hash": digest,
                "found_by": found.found_by if found is not None else None,
                "degenerate": degenerate(iteration, text, found),
            }
        )
        context.progress.update(
            iterations=len(attempts), last_score=score, last_critique=feedback, answer=max(attempts, key=rank)["answer"]
        )
        passed = score is not None and score > self.cfg.threshold and not attempts[-1]["degenerate"]  # a real attempt above it
        step = "failed" if failed else ("threshold" if passed else "continue")
        self.iteration_end(iteration, before, True, step)
        return step

    def finish(self, stop: str) -> ReasoningResult:
        """The best attempt's answer, with the whole trajectory kept for memory learning."""
        attempts = self.attempts
        best = max(attempts, key=rank)  # ties go to the earlier attempt
        if not best["answer"].strip():
            raise ModelBehaviorError(
                f"none of the {len(attempts)} attempt(s) held an answer (an empty <answer>, or nothing outside <thinking>); "
                "raise max_tokens or check the model",
                {"iterations": len(attempts), "stop_reason": stop},
            )
        shown = lambda score: "unscored" if score is None else f"{score:.2f}"
        self.context.trajectories.append(
            Trajectory(
                text="\n\n".join(
                    f"[attempt {a['iteration']}, score {shown(a['score'])}]\n{a['text']}\nReviewer: {a['feedback']}" for a in attempts
                ),
                answer=best["answer"],
                score=best["score"],
                selected=True,
            )
        )
        return self.context.result(
            self.strategy,
            best["answer"],
            iterations=len(attempts),
            stop_reason=stop,
            best_iteration=best["iteration"],
            best_score=best["score"],
            scores=[a["score"] for a in attempts],
            history=[{k: a[k] for k in ("iteration", "answer", "score", "feedback", "hash", "found_by", "degenerate")} for a in attempts],
            found_by=best["found_by"],
            unscored=sum(a["score"] is None for a in attempts),
            failures=failure_kinds(self.failures),
        )

    async def attempt(self, iteration: int) -> tuple[Any, bool]:
        """The first attempt, or a re-examination of the last attempt in the light of its review, the attempt and the
        review cut (head and tail) where the whole would not fit the model's context; and whether the schema was enforced."""
        query, cfg, last = self.query, self.cfg, self.attempts[-1] if self.attempts else None
        seed = None if cfg.seed is None else cfg.seed + iteration - 1
        temperature = cfg.temperature if last is None else cfg.refine_temperature
        if last is None:
            return await ask(self.context, ANSWER, SYSTEM_PROMPT, query, max_tokens=cfg.max_tokens, temperature=temperature, seed=seed)

        def shown(parts: tuple[str, ...]) -> str:
            solution, answer, feedback = parts
            score = UNSCORED if last["score"] is None else last["score"]
            return REFINE_TEMPLATE.format(query=query, solution=solution, answer=answer, score=score, feedback=feedback)

        quoted = (strip_thinking(last["text"]), last["answer"], last["feedback"] or NO_FEEDBACK)
        return await ask(self.context, ANSWER, REFINE_PROMPT, shown, quoted, max_tokens=cfg.max_tokens, temperature=temperature, seed=seed)

    def iteration_end(self, iteration: int, before: tuple[int, int], has_answer: bool, stop: str) -> None:
        t = self.context.llm.tally
        self.context.emit(
            IterationEnd(
                trace_id=self.context.trace_id,
                strategy=self.strategy,
                iteration=iteration,
                prompt_tokens=t.prompt_tokens - before[0],
                completion_tokens=t.completion_tokens - before[1],
                has_answer=has_answer,
                stop=stop,
            )
        )
