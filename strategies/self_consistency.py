"""Self-consistency (Wang et al., 2022): sample several chains of thought, answer with the majority.

Each chain is one chain-of-thought call at a temperature above zero with its own seed (seeds
`seed`, `seed + 1`, ...), so a run is repeatable and its calls are cacheable, yet the chains differ.
The chains run concurrently through the context's fan-out (Ray tasks behind Serve). Answers are
compared after `normalize_answer` ("1,200.00" and "1200" agree); the most frequent one wins, ties
going to the answer reached first in chain order. `agreement` is the winner's share of the chains.
A chain's answer is read however the model gave it (`<answer>`, JSON where the endpoint enforces a
schema, "The answer is: 76", a final number for numeric questions: `found_by` counts each way); a
chain whose whole reply is its only answer votes only when no chain stated one.

A chain that fails (the provider, the budget) does not take the others with it: when any chain
failed, the run fails with that chain's error. As each chain finishes, the run's `progress` holds the
finished chains' answers and their vote (`answer`: the majority so far, which `degraded_answers` may
return instead), so a run stopped by its deadline or a cancellation keeps them as well.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

from pydantic import Field

from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.kernel.errors import ModelBehaviorError
from reasonray.kernel.extraction import find_answer, numeric_question
from reasonray.kernel.tags import normalize_answer
from reasonray.strategies.base import (
    Failed,
    ReasoningResult,
    Strategy,
    StrategyConfig,
    StrategyContext,
)
from reasonray.strategies.chain_of_thought import SYSTEM_PROMPT
from reasonray.strategies.output import ANSWER, found_by_counts, shaped, structured

Sample = tuple[str, str]
"""A chain's answer and how it was found (`found_by`)."""


class SelfConsistencyConfig(StrategyConfig):
    samples: int = Field(5, ge=1, le=20, description="Chains of thought to sample; the majority answer wins.")
    temperature: float = Field(0.7, gt=0.0, le=2.0, description="Sampling temperature of each chain (above 0, or all chains agree).")
    seed: int = Field(0, ge=0, description="Seed of the first chain; chain i uses seed + i, so runs repeat.")
    max_tokens: int = Field(4096, ge=1, le=262_144, description="Most tokens each chain may generate.")
    system_prompt: str = Field(SYSTEM_PROMPT, min_length=1, max_length=20_000, description="Instructions for each chain.")


async def sample_chain(query: str, cfg: SelfConsistencyConfig, seed: int, context: StrategyContext) -> Sample | None:
    """One sampled chain's answer and how it was found, or None when its reply held none."""
    enforced = structured(context)
    request = LLMRequest(
        messages=(system(cfg.system_prompt), user(query)), max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed
    )
    completion = await context.llm.complete(shaped(request, ANSWER, enforced))
    found = find_answer(completion.text, numeric=numeric_question(query), structured=enforced)
    return None if found is None else (found.answer, found.found_by)


def ballots(outcomes: list[Sample | None]) -> list[str | None]:
    """The answer each chain votes with (None: it does not vote). A chain whose whole reply is its only answer
    votes only when no chain stated an answer: prose rarely matches prose, and must not outvote a stated answer."""
    stated = any(o is not None and o[1] != "whole_text" for o in outcomes)
    return [o[0] if o is not None and o[0] and (not stated or o[1] != "whole_text") else None for o in outcomes]


class SelfConsistency(Strategy):
    name = "self_consistency"
    description = "Several sampled chains of thought in parallel; the majority answer wins, with its agreement."
    Config = SelfConsistencyConfig
    extra_capabilities = ("reasoning.parallel", "reasoning.voting")

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        cfg = self.parse_config(config)
        chains = [partial(sample_chain, query, cfg, cfg.seed + i) for i in range(cfg.samples)]
        settled: dict[int, Sample | Failed | None] = {}

        def arrived(index: int, outcome: Sample | Failed | None) -> None:
            settled[index] = outcome
            self._note_progress(context, cfg, [settled[i] for i in sorted(settled)])

        self._note_progress(context, cfg, [])
        outcomes = await context.fan_out_settled(chains, label=f"{self.name}.sample", arrived=arrived)
        if failures := [o.error for o in outcomes if isinstance(o, Failed)]:
            raise failures[0]
        samples = [o for o in outcomes if not isinstance(o, Failed)]
        voting = ballots(samples)
        answered = [(a, normalize_answer(a)) for a in voting if a]
        if not answered:
            raise ModelBehaviorError(
                f"none of the {cfg.samples} sampled chains gave an answer (each reply was empty or only <thinking>); "
                "raise max_tokens or check the model",
                {"samples": cfg.samples},
            )
        votes = Counter(norm for _, norm in answered)
        winner = max(votes, key=votes.__getitem__)  # a Counter keeps first-seen order, so ties go to the earliest
        answer = next(a for a, norm in answered if norm == winner)
        return context.result(
            self.name,
            answer,
            samples=cfg.samples,
            answered=len(answered),
            votes=dict(votes.most_common()),
            agreement=round(votes[winner] / cfg.samples, 4),
            answers=[normalize_answer(a) if a else None for a in voting],
            found_by=found_by_counts([s[1] if s else None for s in samples]),
        )

    @staticmethod
    def _note_progress(context: StrategyContext, cfg: SelfConsistencyConfig, outcomes: list[Sample | Failed | None]) -> None:
        """The chains settled so far (in chain order) and their vote, for `error.data.partial`."""
        samples = [o for o in outcomes if not isinstance(o, Failed)]
        voting = ballots(samples)
        answered = [(a, normalize_answer(a)) for a in voting if a]
        votes = Counter(norm for _, norm in answered)
        leader = max(votes, key=votes.__getitem__, default=None)
        context.progress.update(
            samples=cfg.samples,
            samples_finished=len(samples),
            samples_failed=len(outcomes) - len(samples),
            answers=[normalize_answer(a) if a else None for a in voting],
            votes=dict(votes.most_common()),
            answer=next((a for a, norm in answered if norm == leader), None),
        )
