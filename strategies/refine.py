"""Think, evaluate, refine: the iterative agent of the ReasoningBank system.

Each iteration the model solves (or, after the first, re-examines its previous attempt in the light
of the feedback), then an evaluator at temperature 0 scores the attempt from 0 to 1 with specific
feedback. The loop stops early when a score is above `threshold` (0.8), stops when an attempt
repeats an earlier one (the trajectory hash, answer and reasoning, was seen before: refining again
would loop), and otherwise runs `max_iterations` (3). The answer is the best-scored attempt's,
ties going to the later one. All attempts, with their scores and feedback, form the trajectory
that memory learning sees.

As it goes, the run's `progress` keeps the iterations done, the last draft (thinking stripped) with
its critique (score and feedback, once evaluated) and the best-scored answer so far: what
`error.data.partial` carries when the run fails part-way.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from pydantic import Field

from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.kernel.errors import ModelBehaviorError
from reasonray.kernel.events import IterationEnd, RunWarning
from reasonray.kernel.tags import (
    extract_answer,
    extract_tag,
    normalize_answer,
    strip_thinking,
)
from reasonray.memory.items import Trajectory
from reasonray.strategies.base import (
    ReasoningResult,
    Strategy,
    StrategyConfig,
    StrategyContext,
)
from reasonray.strategies.chain_of_thought import SYSTEM_PROMPT

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
SCORE = re.compile(r"[01](?:\.\d+)?|\.\d+")


class RefineConfig(StrategyConfig):
    max_iterations: int = Field(3, ge=1, le=10, description="Most think-evaluate-refine iterations.")
    threshold: float = Field(0.8, ge=0.0, le=1.0, description="A score above this stops early.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature of the first attempt (the evaluator uses 0).")
    refine_temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature of the re-examinations.")
    seed: int | None = Field(None, description="Seed of the attempts; attempt i uses seed + i.")
    max_tokens: int = Field(4096, ge=1, le=262_144, description="Most tokens per attempt.")
    evaluate_max_tokens: int = Field(1024, ge=16, le=32_768, description="Most tokens per evaluation.")


def parse_score(text: str) -> float | None:
    raw = extract_tag(text, "score")
    found = SCORE.search(raw or "")
    return min(max(float(found.group(0)), 0.0), 1.0) if found else None


async def evaluate(query: str, text: str, answer: str, max_tokens: int, context: StrategyContext) -> tuple[float | None, str]:
    """A 0-1 score and feedback for one attempt (temperature 0, so repeatable and cacheable)."""
    completion = await context.llm.complete(
        LLMRequest(
            messages=(system(EVALUATE_PROMPT), user(EVALUATE_TEMPLATE.format(query=query, solution=strip_thinking(text), answer=answer))),
            max_tokens=max_tokens,
            temperature=0.0,
            purpose="critique",
        )
    )
    return parse_score(completion.text), (extract_tag(completion.text, "feedback") or "").strip()


def trajectory_hash(text: str, answer: str) -> str:
    reasoning = " ".join(text.split()).lower()
    return hashlib.sha256(f"{normalize_answer(answer)}\x00{reasoning}".encode()).hexdigest()[:16]


class Refine(Strategy):
    name = "refine"
    description = "Think, evaluate (score and feedback), refine: up to 3 iterations, early stop above 0.8, loop detection."
    Config = RefineConfig
    extra_capabilities = ("reasoning.iterative", "reasoning.self_evaluation")

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        cfg = self.parse_config(config)
        attempts: list[dict[str, Any]] = []
        seen: set[str] = set()
        # the documented partial shape from the start, so a failure before any draft still has every key
        context.progress.update(iterations=0, last_draft=None, last_answer=None, last_score=None, last_critique=None, answer=None)
        stop = "max_iterations"
        for iteration in range(1, cfg.max_iterations + 1):
            if attempts:
                last = attempts[-1]
                messages = (
                    system(REFINE_PROMPT),
                    user(
                        REFINE_TEMPLATE.format(
                            query=query,
                            solution=strip_thinking(last["text"]),
                            answer=last["answer"],
                            score=last["score"],
                            feedback=last["feedback"] or NO_FEEDBACK,
                        )
                    ),
                )
            else:
                messages = (system(SYSTEM_PROMPT), user(query))
            before = context.llm.tally.prompt_tokens, context.llm.tally.completion_tokens
            completion = await context.llm.complete(
                LLMRequest(
                    messages=messages,
                    max_tokens=cfg.max_tokens,
                    temperature=cfg.refine_temperature if attempts else cfg.temperature,
                    seed=None if cfg.seed is None else cfg.seed + iteration - 1,
                )
            )
            text = completion.text
            answer = extract_answer(text)
            if answer is None:
                answer = strip_thinking(text)
            context.progress.update(
                iterations=len(attempts), last_draft=strip_thinking(text), last_answer=answer, last_score=None, last_critique=None
            )
            digest = trajectory_hash(text, answer)
            if digest in seen:
                stop = "loop_detected"
                context.emit(
                    RunWarning(
                        trace_id=context.trace_id,
                        strategy=self.name,
                        code="loop_detected",
                        message=f"iteration {iteration} repeated an earlier attempt; refining stopped",
                    )
                )
                self._iteration_end(context, iteration, before, True, stop)
                break
            seen.add(digest)
            score, feedback = await evaluate(query, text, answer, cfg.evaluate_max_tokens, context)
            if score is None:
                context.emit(
                    RunWarning(
                        trace_id=context.trace_id,
                        strategy=self.name,
                        code="unscored",
                        message=f"the evaluator gave no <score> for iteration {iteration}; counted as 0",
                    )
                )
            attempts.append(
                {"iteration": iteration, "text": text, "answer": answer, "score": score or 0.0, "feedback": feedback, "hash": digest}
            )
            best_so_far = max(reversed(attempts), key=lambda a: a["score"])
            context.progress.update(iterations=len(attempts), last_score=score, last_critique=feedback, answer=best_so_far["answer"])
            passed = (score or 0.0) > cfg.threshold
            self._iteration_end(context, iteration, before, True, "threshold" if passed else "continue")
            if passed:
                stop = "threshold"
                break
        best = max(reversed(attempts), key=lambda a: a["score"])  # ties go to the later attempt
        if not best["answer"].strip():
            raise ModelBehaviorError(
                f"none of the {len(attempts)} attempt(s) held an answer (an empty <answer>, or nothing outside <thinking>); "
                "raise max_tokens or check the model",
                {"iterations": len(attempts), "stop_reason": stop},
            )
        context.trajectories.append(
            Trajectory(
                text="\n\n".join(
                    f"[attempt {a['iteration']}, score {a['score']:.2f}]\n{a['text']}\nReviewer: {a['feedback']}" for a in attempts
                ),
                answer=best["answer"],
                score=best["score"],
                selected=True,
            )
        )
        return context.result(
            self.name,
            best["answer"],
            iterations=len(attempts),
            stop_reason=stop,
            best_iteration=best["iteration"],
            best_score=best["score"],
            scores=[a["score"] for a in attempts],
            history=[{k: a[k] for k in ("iteration", "answer", "score", "feedback", "hash")} for a in attempts],
        )

    def _iteration_end(self, context: StrategyContext, iteration: int, before: tuple[int, int], has_answer: bool, stop: str) -> None:
        t = context.llm.tally
        context.emit(
            IterationEnd(
                trace_id=context.trace_id,
                strategy=self.name,
                iteration=iteration,
                prompt_tokens=t.prompt_tokens - before[0],
                completion_tokens=t.completion_tokens - before[1],
                has_answer=has_answer,
                stop=stop,
            )
        )
