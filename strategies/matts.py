"""MaTTS, memory-aware test-time scaling (from the ReasoningBank paper).

Wraps any enabled strategy (`base_strategy`, chain of thought by default):

- parallel: k attempts of the base strategy at once, each sampled with its own seed, as branches
  of the context's fan-out (Ray tasks behind Serve, so they take about the time of one and a
  cluster spreads them);
- sequential: one attempt, then k - 1 rounds in which the model re-examines its previous attempt.

The answer is the best attempt's: by judge score (each attempt scored 0-1 at temperature 0, the
scores fanned out too) or by self-contrast (one call compares all attempts and picks one). Every
attempt is reported as a trajectory, so a memory-aware run learns by self-contrast across all k
(at most 5 items). With k = 1 or `enabled = false` it is a single run of the base strategy.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from typing import Any, Literal

from pydantic import Field

from reasonray.gateway.protocol import Completion, LLMRequest, system, user
from reasonray.kernel.errors import InvalidParamsError
from reasonray.kernel.tags import extract_answer, extract_tag, strip_thinking
from reasonray.memory.items import Trajectory
from reasonray.strategies.base import (
    Failed,
    ReasoningResult,
    ReasoningStrategy,
    Strategy,
    StrategyConfig,
    StrategyContext,
)
from reasonray.strategies.refine import evaluate

REEXAMINE_PROMPT = (
    "Carefully re-examine your previous attempt at the problem, including every reasoning step. Check whether "
    "each step is right and whether the answer addresses the problem. If you find inconsistencies, correct them; "
    "if everything is right, confirm your answer. Think step by step inside <thinking>...</thinking>, then give "
    "only the final answer inside <answer>...</answer>."
)
SELECT_PROMPT = (
    "Several candidate solutions to the problem follow. Compare them step by step and decide which one is "
    "correct and best reasoned. Reply with the number of the best candidate inside <vote>...</vote>."
)

# The re-examination shows the previous attempt with its answer last; the selection numbers the attempts.
REEXAMINE_TEMPLATE = "Problem:\n{query}\n\nPrevious attempt:\n{solution}\nAnswer: {answer}"
CANDIDATE = "Candidate {number}:\n{solution}\nAnswer: {answer}"
SELECT_TEMPLATE = "Problem:\n{query}\n\n{candidates}"


class MattsConfig(StrategyConfig):
    enabled: bool = Field(True, description="false: a single run of the base strategy.")
    mode: Literal["parallel", "sequential"] = Field("parallel", description="k attempts at once, or one attempt re-examined k - 1 times.")
    k: int = Field(3, ge=1, le=5, description="Attempts (1 runs the base strategy once).")
    base_strategy: str = Field("chain_of_thought", pattern=r"^[a-z_][a-z0-9_]*$", description="The enabled strategy each attempt runs.")
    base_config: dict[str, Any] = Field(default_factory=dict, description="Config of the base strategy (its own schema).")
    selection: Literal["judge", "contrast"] = Field("judge", description="judge: best 0-1 score; contrast: one call compares all attempts.")
    temperature: float = Field(
        0.7, gt=0.0, le=2.0, description="Sampling temperature of parallel attempts (when the base strategy takes one)."
    )
    seed: int = Field(0, ge=0, description="Seed of the first parallel attempt; attempt i uses seed + i.")
    judge_max_tokens: int = Field(1024, ge=16, le=32_768, description="Most tokens per judge or selector call.")


class _Recording:
    """The context's LLM, keeping the text of each reply: one attempt's trajectory."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self.replies: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    async def complete(self, request: LLMRequest) -> Completion:
        completion = await self._llm.complete(request)
        self.replies.append(completion.text)
        return completion


async def attempt(strategy: ReasoningStrategy, query: str, config: dict[str, Any], context: StrategyContext) -> dict[str, str]:
    """One run of the base strategy: its answer and the text of its LLM replies."""
    recording = _Recording(context.llm)
    # its own trajectories and progress: the base strategy's partial shape is not matts' (the attempts are)
    own = dataclasses.replace(context, llm=recording, trajectories=[], progress={})
    result = await strategy.reason(query, context=own, config=config)
    return {"answer": result.answer, "text": "\n\n".join(recording.replies) or result.answer}


async def score(query: str, text: str, answer: str, max_tokens: int, context: StrategyContext) -> float:
    value, _ = await evaluate(query, text, answer, max_tokens, context)
    return value or 0.0


class Matts(Strategy):
    name = "matts"
    description = "Memory-aware test-time scaling: k attempts of a base strategy in parallel (Ray tasks) or in sequence, best one selected."
    Config = MattsConfig
    extra_capabilities = ("reasoning.parallel", "reasoning.test_time_scaling", "reasoning.composite")

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        cfg = self.parse_config(config)
        if cfg.base_strategy == self.name:
            raise InvalidParamsError("matts cannot use matts as its base_strategy; choose e.g. chain_of_thought or refine")
        base, base_config = context.resolve(cfg.base_strategy, cfg.base_config)
        k = cfg.k if cfg.enabled else 1
        started = time.perf_counter()
        if k == 1:
            attempts = [await attempt(base, query, base_config, context)]
        elif cfg.mode == "parallel":
            settled: dict[int, dict[str, str] | Failed] = {}

            def arrived(index: int, outcome: dict[str, str] | Failed) -> None:
                settled[index] = outcome
                self._note_progress(context, k, [o for _, o in sorted(settled.items()) if not isinstance(o, Failed)])

            self._note_progress(context, k, [])
            outcomes = await context.fan_out_settled(
                [partial(attempt, base, query, self._diverse(base, base_config, cfg, i)) for i in range(k)],
                label=f"{self.name}.attempt",
                arrived=arrived,
            )
            attempts = [o for o in outcomes if not isinstance(o, Failed)]
            if failed := [o.error for o in outcomes if isinstance(o, Failed)]:
                raise failed[0]
        else:
            attempts = await self._sequential(base, base_config, query, k, context)
        attempts_ms = round((time.perf_counter() - started) * 1000, 1)
        started = time.perf_counter()
        scores: list[float | None] = [None] * len(attempts)
        if len(attempts) == 1:
            chosen = 0
        elif cfg.selection == "judge":
            judged = await context.fan_out(
                [partial(score, query, a["text"], a["answer"], cfg.judge_max_tokens) for a in attempts], label=f"{self.name}.judge"
            )
            scores = list(judged)
            chosen = max(range(len(attempts)), key=lambda i: (judged[i], -i))  # ties go to the earlier attempt
        else:
            chosen = await self._contrast(query, attempts, cfg, context)
        for i, a in enumerate(attempts):
            context.trajectories.append(Trajectory(text=a["text"], answer=a["answer"], score=scores[i], selected=i == chosen))
        return context.result(
            self.name,
            attempts[chosen]["answer"],
            mode=cfg.mode,
            k=len(attempts),
            fallback=len(attempts) == 1,
            base_strategy=cfg.base_strategy,
            selection=cfg.selection if len(attempts) > 1 else "single",
            selected=chosen,
            answers=[a["answer"] for a in attempts],
            scores=scores,
            attempts_ms=attempts_ms,
            selection_ms=round((time.perf_counter() - started) * 1000, 1),
        )

    @staticmethod
    def _diverse(base: ReasoningStrategy, config: dict[str, Any], cfg: MattsConfig, index: int) -> dict[str, Any]:
        """Attempt `index`'s config: sampled with its own seed when the base strategy takes them."""
        fields = set(getattr(getattr(base, "Config", None), "model_fields", {}))
        diverse = dict(config)
        if "temperature" in fields:
            diverse["temperature"] = cfg.temperature
        if "seed" in fields:
            diverse["seed"] = cfg.seed + index
        return diverse

    async def _sequential(
        self, base: ReasoningStrategy, config: dict[str, Any], query: str, k: int, context: StrategyContext
    ) -> list[dict[str, str]]:
        attempts = [await attempt(base, query, config, context)]
        self._note_progress(context, k, attempts)
        for _ in range(k - 1):
            last = attempts[-1]
            completion = await context.llm.complete(
                LLMRequest(
                    messages=(
                        system(REEXAMINE_PROMPT),
                        user(REEXAMINE_TEMPLATE.format(query=query, solution=strip_thinking(last["text"]), answer=last["answer"])),
                    ),
                    max_tokens=4096,
                    temperature=0.0,
                )
            )
            answer = extract_answer(completion.text)
            attempts.append({"answer": answer if answer is not None else strip_thinking(completion.text), "text": completion.text})
            self._note_progress(context, k, attempts)
        return attempts

    @staticmethod
    def _note_progress(context: StrategyContext, k: int, attempts: list[dict[str, str]]) -> None:
        """The branches finished so far (their answers), for `error.data.partial` should a later call fail."""
        context.progress.update(
            k=k,
            branches_finished=len(attempts),
            answers=[a["answer"] for a in attempts],
            answer=attempts[0]["answer"] if attempts else None,  # unjudged: the first finished branch
        )

    async def _contrast(self, query: str, attempts: list[dict[str, str]], cfg: MattsConfig, context: StrategyContext) -> int:
        shown = "\n\n".join(
            CANDIDATE.format(number=i, solution=strip_thinking(a["text"]), answer=a["answer"]) for i, a in enumerate(attempts, 1)
        )
        completion = await context.llm.complete(
            LLMRequest(
                messages=(system(SELECT_PROMPT), user(SELECT_TEMPLATE.format(query=query, candidates=shown))),
                max_tokens=cfg.judge_max_tokens,
                temperature=0.0,
                purpose="choose",
            )
        )
        raw = (extract_tag(completion.text, "vote") or "").strip()
        return int(raw) - 1 if raw.isdigit() and 1 <= int(raw) <= len(attempts) else 0
