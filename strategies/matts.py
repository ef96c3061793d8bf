"""MaTTS, memory-aware test-time scaling (from the ReasoningBank paper).

Wraps any enabled strategy (`base_strategy`, chain of thought by default):

- parallel: k attempts of the base strategy at once, each sampled with its own seed, as branches
  of the context's fan-out (Ray tasks behind Serve, so they take about the time of one and a
  cluster spreads them);
- sequential: one attempt, then k - 1 rounds in which the model re-examines its previous attempt.

The answer is the best attempt's: by judge score (each attempt scored 0-1 at temperature 0) or by
self-contrast (one call compares all attempts and picks one). When every attempt gives the same
answer there is nothing to choose: no judge or contrast call is made. In parallel mode judging rides
along with the attempts: as soon as two finished attempts disagree, each finished attempt is judged
(a branch of its own) while the others still run, so a run that must judge pays about one judge call
after its slowest attempt, and one whose attempts agree pays none. A judge reply with no readable
score is unscored: it never beats a scored attempt, and when no attempt is scored the majority
answer wins (ties to the earlier attempt). An attempt cut by max_tokens whose answer is only its last number or
its whole text stated none: it is degenerate, chosen (by judge or contrast) only when every attempt is. A prompt
quoting attempts is fitted to the model's context (`context_fit`). Every attempt is reported as a trajectory, so a
memory-aware run learns by self-contrast across all k (at most 5 items). With k = 1 or
`enabled = false` it is a single run of the base strategy: as configured, or (k = 1 with `single_attempt =
"sampled"`) sampled like one attempt of k > 1, so a curve over k does not also change the temperature.

An attempt that fails costs its place, not the run: the answer is chosen among the attempts that finished
(`branches_finished`, `branches_failed`, `failures` by error type), and the run fails only when none did,
with the first failure's error. A re-examination that fails ends the sequence with the attempts before it; a
judge that fails leaves its attempt unscored; a contrast call that fails leaves the majority answer.
Cancellation, the deadline and the caller's budget (`RUN_ENDING`) fail the whole run at once. The result's
`attempts` logs every attempt in order (its normalized answer, its judge score, whether it was chosen, or how it
failed), so an evaluation can derive majority@k, judge-selected@k and oracle pass@k for every k up to k from
one run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from pydantic import Field

from reasonray.gateway.protocol import Completion, LLMRequest
from reasonray.kernel.errors import InvalidParamsError, OverloadedError, error_type_of
from reasonray.kernel.extraction import find_answer, find_choice, numeric_question
from reasonray.kernel.tags import normalize_answer, strip_thinking
from reasonray.memory.items import Trajectory
from reasonray.strategies.base import (
    Failed,
    ReasoningResult,
    ReasoningStrategy,
    Strategy,
    StrategyConfig,
    StrategyContext,
    ends_run,
    failure_kinds,
)
from reasonray.strategies.output import ANSWER, VOTE, ask
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
WEAK = ("final_number", "whole_text")  # found in a reply that stated no answer


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
    single_attempt: Literal["base", "sampled"] = Field(
        "base",
        description="k = 1: base runs the base strategy as configured (greedy for chain of thought); sampled runs it as "
        "attempt 0 of k > 1 (at temperature, seed seed), so a curve over k varies k alone.",
    )


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


async def attempt(
    strategy: ReasoningStrategy, query: str, config: dict[str, Any], context: StrategyContext, *, index: int = 0
) -> dict[str, Any]:
    """Attempt `index`: one run of the base strategy, its answer, the text of its LLM replies and how its answer was found."""
    recording = _Recording(context.llm)
    # its own trajectories and progress: the base strategy's partial shape is not matts' (the attempts are)
    own = dataclasses.replace(context, llm=recording, trajectories=[], progress={})
    result = await strategy.reason(query, context=own, config=config)
    specific = result.metrics.strategy_specific
    found_by = specific.get("found_by") if isinstance(specific.get("found_by"), str) else ""
    return attempted(index, result.answer, "\n\n".join(recording.replies) or result.answer, found_by, specific.get("truncated") is True)


def attempted(index: int, answer: str, text: str, found_by: str, truncated: bool) -> dict[str, Any]:
    """An attempt as the run keeps it; cut by max_tokens with an answer that is only its last number or its whole
    text, it never stated one: it is degenerate."""
    return {"index": index, "answer": answer, "text": text, "found_by": found_by, "degenerate": truncated and found_by in WEAK}


def judge_selected(logged: list[dict[str, Any]]) -> int | None:
    """The attempt (its `index`) a judged run would choose among these entries of its `attempts` log, e.g. its
    first k: the first finished one when their answers agree, else by `pick` over their judge scores; None when
    none finished. What judge-selected@k is, computed the way the run itself chooses."""
    finished = [e for e in logged if e["failed"] is None]
    if not finished:
        return None
    attempts = [{"answer": e["answer"] or "", "degenerate": e["degenerate"]} for e in finished]
    chosen = 0 if len(attempts) == 1 or agree(attempts) else pick(attempts, [e["score"] for e in finished])
    return int(finished[chosen]["index"])


def agree(attempts: list[dict[str, Any]]) -> bool:
    """Every attempt gave the same (normalized, non-empty) answer: there is nothing to choose between."""
    answers = {normalize_answer(a["answer"]) for a in attempts}
    return len(answers) == 1 and "" not in answers


def pick(attempts: list[dict[str, Any]], scores: list[float | None]) -> int:
    """The chosen attempt: one with an answer before one without, a stated answer before a degenerate one (see
    `attempted`), scored before unscored, the higher score, then the answer more attempts share, then the earlier attempt."""
    counts = Counter(normalize_answer(a["answer"]) for a in attempts)

    def rank(i: int) -> tuple[bool, bool, bool, float, int, int]:
        answer = attempts[i]["answer"]
        return (
            bool(answer.strip()),
            not attempts[i].get("degenerate", False),
            scores[i] is not None,
            scores[i] or 0.0,
            counts[normalize_answer(answer)],
            -i,
        )

    return max(range(len(attempts)), key=rank)


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
        run = _Run(self.name, query, cfg, context, base, base_config, k)
        started = time.perf_counter()
        try:
            if k == 1:
                sampled = cfg.enabled and cfg.single_attempt == "sampled"
                attempts = [await attempt(base, query, run.diverse(0) if sampled else base_config, context)]
            elif cfg.mode == "parallel":
                attempts = await run.parallel(judging=cfg.selection == "judge")
            else:
                attempts = await run.sequential()
            attempts_ms = round((time.perf_counter() - started) * 1000, 1)
            started = time.perf_counter()
            scores: list[float | None] = [None] * len(attempts)
            if len(attempts) == 1:
                chosen, selection = 0, "single"
            elif agree(attempts):
                chosen, selection = 0, "agreement"  # every attempt says the same: judging could not change the answer
            elif cfg.selection == "judge":
                scores = await run.judged(attempts)
                chosen = pick(attempts, scores)
                selection = "judge" if any(s is not None for s in scores) else "majority"
            else:
                chosen, selection = await run.contrast(attempts)
        finally:
            for task in run.judges.values():
                task.cancel()  # judging started for attempts that turned out to agree, or a failed run
        for i, a in enumerate(attempts):
            context.trajectories.append(Trajectory(text=a["text"], answer=a["answer"], score=scores[i], selected=i == chosen))
        return context.result(
            self.name,
            attempts[chosen]["answer"],
            mode=cfg.mode,
            k=k,
            fallback=k == 1,
            base_strategy=cfg.base_strategy,
            selection=selection,
            selected=chosen,
            answers=[a["answer"] for a in attempts],
            scores=scores,
            judged=sum(s is not None for s in scores),
            unscored=sum(s is None for s in scores) if selection in ("judge", "majority") else 0,
            judges_failed=len(run.judge_failed) if cfg.selection == "judge" else int(bool(run.judge_failed)),
            branches_finished=len(attempts),
            branches_failed=len(run.failed),
            failures=failure_kinds(list(run.failed.values())),
            attempts=run.log(attempts, scores, chosen, judged=selection != "agreement" and cfg.selection == "judge"),
            found_by=attempts[chosen]["found_by"] or None,
            attempts_ms=attempts_ms,
            selection_ms=round((time.perf_counter() - started) * 1000, 1),
        )


@dataclass
class _Run:
    """One MaTTS run: its query, config and context, the base strategy its attempts run, and what failed on the way."""

    strategy: str
    query: str
    cfg: MattsConfig
    context: StrategyContext
    base: ReasoningStrategy
    base_config: dict[str, Any]
    k: int
    judges: dict[int, asyncio.Task[float | None]] = field(default_factory=dict)  # attempt index -> its judge call
    failed: dict[int, Exception] = field(default_factory=dict)  # attempt index -> its error
    judge_failed: set[int] = field(default_factory=set)  # positions in the attempts whose judge (or contrast) failed

    async def parallel(self, *, judging: bool) -> list[dict[str, Any]]:
        """The k attempts that finished (their errors go to `failed`). `judging`: judging starts as soon as two
        finished attempts disagree: each finished attempt (and each one finishing later) gets its judge while the
        slower attempts still run."""
        settled: dict[int, dict[str, Any] | Failed] = {}

        def arrived(index: int, outcome: dict[str, Any] | Failed) -> None:
            settled[index] = outcome
            finished = {i: o for i, o in sorted(settled.items()) if not isinstance(o, Failed)}
            self.note_progress(list(finished.values()), len(settled) - len(finished))
            # a failed attempt starts no judging; a finished one starts it once two finished attempts disagree
            if judging and not isinstance(outcome, Failed) and (self.judges or not agree(list(finished.values()))):
                for a in finished.values():
                    self.judge(a)

        self.note_progress([])
        outcomes = await self.context.fan_out_settled(
            [partial(attempt, self.base, self.query, self.diverse(i), index=i) for i in range(self.k)],
            label=f"{self.strategy}.attempt",
            arrived=arrived,
        )
        self.failed.update({i: o.error for i, o in enumerate(outcomes) if isinstance(o, Failed)})
        finished = [o for o in outcomes if not isinstance(o, Failed)]
        if not finished:
            raise self.failed[0]  # no attempt finished: nothing to choose from
        return finished

    def judge(self, a: dict[str, Any]) -> asyncio.Task[float | None]:
        """One attempt's judge call, started now as a branch of its own unless it was started before."""
        if (started := self.judges.get(a["index"])) is not None:
            return started

        async def judged() -> float | None:
            # the judge's 0-1 score (None: its reply held no readable score, so the attempt stays unscored)
            call = partial(evaluate, self.query, a["text"], a["answer"], self.cfg.judge_max_tokens)
            [(value, _)] = await self.context.fan_out([call], label=f"{self.strategy}.judge")
            return value

        task = self.judges[a["index"]] = asyncio.ensure_future(judged())
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # a failure is read where it is awaited
        return task

    async def judged(self, attempts: list[dict[str, Any]]) -> list[float | None]:
        """Every attempt's score: the judges started alongside the attempts, and the rest started now. A judge
        the fan-out refused while the attempts held its slots (OverloadedError) is asked again now they are free;
        a judge that fails leaves its attempt unscored (its position in `attempts` goes to `judge_failed`)."""
        outcomes: list[float | BaseException | None] = list(await asyncio.gather(*map(self.judge, attempts), return_exceptions=True))
        scores: list[float | None] = []
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, OverloadedError):
                del self.judges[attempts[i]["index"]]  # ask again
                [outcome] = await asyncio.gather(self.judge(attempts[i]), return_exceptions=True)
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception) or ends_run(outcome):
                    raise outcome
                self.judge_failed.add(i)  # the attempt stays unscored
                outcome = None
            scores.append(outcome)
        return scores

    def log(self, attempts: list[dict[str, Any]], scores: list[float | None], chosen: int, *, judged: bool) -> list[dict[str, Any]]:
        """Every attempt in attempt order: its normalized answer, its judge's verdict (`scored`, `unscored`: a reply
        with no readable score, `failed`; None when the finished attempts were not judged), its score, whether it was
        chosen, and for an attempt that failed, its error type instead."""
        blank = {"index": None, "answer": None, "found_by": None, "degenerate": False, "judge": None, "score": None, "chosen": False}
        log = {i: {**blank, "index": i, "failed": error_type_of(exc)} for i, exc in self.failed.items()}
        for position, a in enumerate(attempts):
            scored = "scored" if scores[position] is not None else "unscored"
            verdict = "failed" if position in self.judge_failed else (scored if judged and len(attempts) > 1 else None)
            log[a["index"]] = {
                "index": a["index"],
                "answer": normalize_answer(a["answer"]) or None,
                "found_by": a["found_by"] or None,
                "degenerate": a["degenerate"],
                "judge": verdict,
                "score": scores[position],
                "chosen": position == chosen,
                "failed": None,
            }
        return [log[i] for i in sorted(log)]

    def diverse(self, index: int) -> dict[str, Any]:
        """Attempt `index`'s config: sampled with its own seed when the base strategy takes them."""
        fields = set(getattr(getattr(self.base, "Config", None), "model_fields", {}))
        sampled = {"temperature": self.cfg.temperature, "seed": self.cfg.seed + index}
        return {**self.base_config, **{k: v for k, v in sampled.items() if k in fields}}

    async def sequential(self) -> list[dict[str, Any]]:
        """The first attempt and up to k - 1 re-examinations; one that fails (its error goes to `failed`) ends the
        sequence with the attempts before it."""
        query, context = self.query, self.context
        attempts = [await attempt(self.base, query, self.base_config, context)]
        self.note_progress(attempts)
        for index in range(1, self.k):
            last = attempts[-1]
            shown = lambda parts: REEXAMINE_TEMPLATE.format(query=query, solution=parts[0], answer=parts[1])
            # an attempt that rambled to the context's end is shown cut (head and tail), so the re-examination fits
            try:
                quoted = (strip_thinking(last["text"]), last["answer"])
                completion, enforced = await ask(context, ANSWER, REEXAMINE_PROMPT, shown, quoted, max_tokens=4096, temperature=0.0)
            except Exception as exc:
                if ends_run(exc):
                    raise
                self.failed[index] = exc
                self.note_progress(attempts, len(self.failed))
                break
            found = find_answer(completion.text, numeric=numeric_question(query), structured=enforced)
            answer, found_by = (found.answer, found.found_by) if found else ("", "")
            attempts.append(attempted(index, answer, completion.text, found_by, completion.finish_reason == "length"))
            self.note_progress(attempts)
        return attempts

    def note_progress(self, attempts: list[dict[str, Any]], failed: int = 0) -> None:
        """The branches finished so far (their answers), for `error.data.partial` should a later call fail."""
        self.context.progress.update(
            k=self.k,
            branches_finished=len(attempts),
            branches_failed=failed,
            answers=[a["answer"] for a in attempts],
            answer=attempts[0]["answer"] if attempts else None,  # unjudged: the first finished branch
        )

    async def contrast(self, attempts: list[dict[str, Any]]) -> tuple[int, str]:
        """The attempt one comparing call picks; the majority answer when its reply names no candidate, or when the call
        fails (every attempt goes to `judge_failed` then)."""
        query, cfg, context = self.query, self.cfg, self.context

        def shown(parts: tuple[str, ...]) -> str:
            candidates = (
                CANDIDATE.format(number=i, solution=parts[2 * i - 2], answer=parts[2 * i - 1]) for i in range(1, len(attempts) + 1)
            )
            return SELECT_TEMPLATE.format(query=query, candidates="\n\n".join(candidates))

        # the candidates share the context: each one that would not fit its share is shown cut (head and tail)
        parts = tuple(piece for a in attempts for piece in (strip_thinking(a["text"]), a["answer"]))
        try:
            completion, enforced = await ask(
                context, VOTE, SELECT_PROMPT, shown, parts, max_tokens=cfg.judge_max_tokens, temperature=0.0, purpose="choose"
            )
        except Exception as exc:
            if ends_run(exc):
                raise
            self.judge_failed.update(range(len(attempts)))
            return pick(attempts, [None] * len(attempts)), "majority"
        chosen = find_choice(completion.text, len(attempts), structured=enforced)
        if chosen is None or (attempts[chosen]["degenerate"] and not all(a["degenerate"] for a in attempts)):
            return pick(attempts, [None] * len(attempts)), "majority"  # no choice, or a ramble chosen over a stated answer
        return chosen, "contrast"
