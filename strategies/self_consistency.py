"""Self-consistency (Wang et al., 2022): sample several chains of thought, answer with the majority.

Each chain is one chain-of-thought call at a temperature above zero with its own seed (seeds
`seed`, `seed + 1`, ...), so a run is repeatable and its calls are cacheable, yet the chains differ.
The chains run concurrently through the context's fan-out (Ray tasks behind Serve). Answers are
compared after `normalize_answer` ("1,200.00" and "1200" agree); the most frequent one wins, ties
going to the answer reached first in chain order. `agreement` is the winner's share of the chains
that finished. A chain's answer is read however the model gave it (`<answer>`, JSON where the
endpoint enforces a schema, "The answer is: 76", a final number for numeric questions: `found_by`
counts each way); a chain whose whole reply is its only answer votes only when no chain stated one.

Adaptive consistency (Aggarwal et al., 2023; `adaptive`): the chains are launched in waves, each the
fewest further chains that could settle the vote if they all agreed with its leader, and sampling
stops once no remaining chain could change the winner (or, with `stop_confidence`, once the Beta
posterior that the leader beats the runner-up reaches it). Chain i keeps seed `seed + i`, so an
adaptive run's chains are the first ones of the fixed run's, cache entries included.

DeepConf (Fu et al., 2025; `confidence`): each chain asks for token log-probabilities; its confidence
is its lowest group confidence (the weakest window of `confidence_window` tokens, a token's confidence
being the negated mean of its top-k log-probabilities, or its own log-probability where the endpoint
gives no alternatives). `weight` weights each vote by it, `filter` keeps the most confident
`keep_top` share of the chains and weights their votes. Without log-probabilities the vote is plain.

A chain that fails costs its vote, not the run: the run votes over the chains that finished and says
how many did (`samples_finished`, `samples_failed`, `failures` by error type); it fails only when no
chain finished, with the first failure's error. Cancellation, the deadline and the caller's budget
(`RUN_ENDING`) fail the whole run at once, whichever chain meets them. As each chain finishes, the
run's `progress` holds the finished chains' answers and their vote (`answer`: the majority so far,
which `degraded_answers` may return instead), so a run stopped part-way keeps them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import Any, Literal

from pydantic import Field, model_validator

from reasonray.kernel.errors import ModelBehaviorError
from reasonray.kernel.extraction import find_answer, numeric_question
from reasonray.kernel.tags import normalize_answer
from reasonray.strategies.base import (
    Failed,
    ReasoningResult,
    Strategy,
    StrategyConfig,
    StrategyContext,
    failure_kinds,
)
from reasonray.strategies.chain_of_thought import SYSTEM_PROMPT
from reasonray.strategies.output import ANSWER, ask


@dataclass(frozen=True)
class Chain:
    """One finished chain: its answer (None: its reply held none), how it was found, and its confidences."""

    answer: str | None
    found_by: str | None
    top_confidence: float | None = None  # lowest group of -mean top-k log-probabilities (None: no alternatives came back)
    token_confidence: float | None = None  # lowest group of the chosen tokens' log-probabilities (None: none came back)


class SelfConsistencyConfig(StrategyConfig):
    samples: int = Field(5, ge=1, le=20, description="Chains of thought to sample (at most, when adaptive); the majority answer wins.")
    temperature: float = Field(0.7, gt=0.0, le=2.0, description="Sampling temperature of each chain (above 0, or all chains agree).")
    seed: int = Field(0, ge=0, description="Seed of the first chain; chain i uses seed + i, so runs repeat.")
    max_tokens: int = Field(4096, ge=1, le=262_144, description="Most tokens each chain may generate.")
    system_prompt: str = Field(SYSTEM_PROMPT, min_length=1, max_length=20_000, description="Instructions for each chain.")
    adaptive: bool = Field(False, description="Sample in waves and stop once further chains cannot change the vote (Adaptive-Consistency).")
    stop_confidence: float | None = Field(
        None,
        gt=0.5,
        lt=1.0,
        description="adaptive: also stop once the Beta posterior that the leader beats the runner-up reaches this (the paper: 0.95).",
    )
    confidence: Literal["off", "weight", "filter"] = Field(
        "off", description="DeepConf: weight votes by chain confidence, or keep the most confident chains and weight theirs."
    )
    keep_top: float = Field(0.9, gt=0.0, le=1.0, description="filter: the share of voting chains kept, most confident first.")
    confidence_top_k: int = Field(5, ge=2, le=20, description="Alternatives per token asked for, for token confidence.")
    confidence_window: int = Field(2048, ge=1, le=262_144, description="Tokens per group of the lowest group confidence.")

    @model_validator(mode="after")
    def _adaptive_votes_unweighted(self) -> SelfConsistencyConfig:
        if self.adaptive and self.confidence != "off":
            raise ValueError("adaptive stops on the unweighted vote, so it cannot be combined with confidence weighting")
        if self.stop_confidence is not None and not self.adaptive:
            raise ValueError("stop_confidence applies to adaptive sampling: set adaptive to true")
        return self


def lowest_group(values: tuple[float, ...] | list[float], window: int) -> float:
    """The lowest mean over any `window` consecutive values (the mean of all when there are fewer)."""
    window = min(window, len(values))
    sums = list(accumulate(values, initial=0.0))  # a window's sum is the difference of two running sums
    return min(b - a for a, b in zip(sums, sums[window:], strict=False)) / window


async def sample_chain(query: str, cfg: SelfConsistencyConfig, seed: int, context: StrategyContext) -> Chain:
    """One sampled chain's answer, how it was found and, when asked for and given, its confidences."""
    logprobs = cfg.confidence_top_k if cfg.confidence != "off" else None
    completion, enforced = await ask(
        context, ANSWER, cfg.system_prompt, query, max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed, logprobs=logprobs
    )
    found = find_answer(completion.text, numeric=numeric_question(query), structured=enforced)
    answer, found_by = (found.answer, found.found_by) if found else (None, None)
    if cfg.confidence == "off":
        return Chain(answer, found_by)
    # its lowest group confidence by its top-k log-probabilities (DeepConf's token confidence: the negated mean of the
    # k likeliest tokens' log-probabilities, high where the model was sure), and by its chosen tokens'
    tops, chosen, window = completion.choices[0].top_logprobs, completion.choices[0].token_logprobs, cfg.confidence_window
    top = lowest_group([-sum(t) / len(t) for t in tops], window) if tops and all(len(t) >= 2 for t in tops) else None
    return Chain(answer, found_by, top, lowest_group(chosen, window) if chosen else None)


def ballots(chains: list[Chain]) -> list[str | None]:
    """The answer each chain votes with (None: it does not vote). A chain whose whole reply is its only answer
    votes only when no chain stated an answer: prose rarely matches prose, and must not outvote a stated answer."""
    stated = any(c.answer is not None and c.found_by != "whole_text" for c in chains)
    return [c.answer if c.answer and (not stated or c.found_by != "whole_text") else None for c in chains]


def beta_confidence(leader: int, runner_up: int) -> float:
    """P(p > 1/2) for p ~ Beta(leader + 1, runner_up + 1): Adaptive-Consistency's posterior that the leading answer
    beats the runner-up (exact for integer counts: a binomial tail)."""
    n = leader + runner_up + 1
    return sum(math.comb(n, j) for j in range(leader + 1)) / 2**n


def decided(counts: list[int], remaining: int, stop_confidence: float | None) -> str | None:
    """Why sampling may stop now: `vote_decided` (no remaining chain can change the winner) or `confident`."""
    leader, runner_up = ([*counts, 0, 0])[:2]
    if leader > runner_up + remaining:
        return "vote_decided"
    if stop_confidence is not None and leader > 0 and beta_confidence(leader, runner_up) >= stop_confidence:
        return "confident"
    return None


def next_wave(counts: list[int], remaining: int, stop_confidence: float | None) -> int:
    """The fewest further chains that could stop sampling (if they all agreed with the leader): each is needed
    whatever they answer, so a wave never pays for a chain the vote turns out not to need."""
    for extra in range(1, remaining):
        grown = sorted([(counts[0] if counts else 0) + extra, *counts[1:]], reverse=True)
        if decided(grown, remaining - extra, stop_confidence):
            return extra
    return remaining


@dataclass(frozen=True)
class Vote:
    """The winner of a vote and what decided it."""

    answer: str
    votes: dict[str, int]
    details: dict[str, Any]


def vote(chains: list[Chain], cfg: SelfConsistencyConfig, *, weighed: bool = True) -> Vote | None:
    """The winning answer (as its first chain wrote it), plainly or (`weighed`, as `cfg` asks) weighted by confidence;
    None when no chain voted."""
    voting = ballots(chains)
    answered = [(i, normalize_answer(a)) for i, a in enumerate(voting) if a]
    if not answered:
        return None
    votes = Counter(norm for _, norm in answered)
    weights = {norm: float(n) for norm, n in votes.items()}
    details: dict[str, Any] = {"confidence": cfg.confidence}
    weight_of = confidence_weight([chains[i] for i, _ in answered]) if weighed and cfg.confidence != "off" else None
    if cfg.confidence != "off":
        details |= {"confidence_used": weight_of is not None, "confidence_fallback": None if weight_of else "no_logprobs"}
    if weight_of is not None:
        kept = answered
        if cfg.confidence == "filter":
            ranked = sorted(answered, key=lambda v: -weight_of(chains[v[0]]))  # stable: ties keep chain order
            kept = sorted(ranked[: max(1, math.ceil(cfg.keep_top * len(ranked)))])
        weights = {norm: sum(weight_of(chains[i]) for i, n in kept if n == norm) for _, norm in kept}
        details |= {
            "confidences": [round(weight_of(c), 4) if a else None for c, a in zip(chains, voting, strict=True)],
            "weighted_votes": {norm: round(w, 4) for norm, w in sorted(weights.items(), key=lambda kv: -kv[1])},
            "kept": len(kept),
        }
    winner = max(weights, key=weights.__getitem__)  # first-seen order breaks ties: the earliest chain's answer wins
    answer = next(voting[i] or "" for i, norm in answered if norm == winner)
    return Vote(answer, dict(votes.most_common()), details)


def confidence_weight(chains: list[Chain]) -> Callable[[Chain], float] | None:
    """How much each voting chain's vote weighs: its top-k confidence (positive, DeepConf's) when every voter has
    one, else the geometric mean probability of its weakest window of chosen tokens; None when a voter has neither."""
    if all(c.top_confidence is not None for c in chains):
        return lambda c: c.top_confidence or 0.0
    if all(c.token_confidence is not None for c in chains):
        return lambda c: math.exp(c.token_confidence or 0.0)
    return None


class SelfConsistency(Strategy):
    name = "self_consistency"
    description = "Several sampled chains of thought in parallel; the majority answer wins, with its agreement."
    Config = SelfConsistencyConfig
    extra_capabilities = ("reasoning.parallel", "reasoning.voting")

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        cfg = self.parse_config(config)
        outcomes, stop = await self._sample(query, cfg, context)
        chains = [o for o in outcomes if not isinstance(o, Failed)]
        failures = [o.error for o in outcomes if isinstance(o, Failed)]
        if not chains:
            raise failures[0]  # no chain finished: nothing to vote over
        won = vote(chains, cfg)
        if won is None:
            raise ModelBehaviorError(
                f"none of the {len(chains)} sampled chains gave an answer (each reply was empty or only <thinking>); "
                "raise max_tokens or check the model",
                {"samples": cfg.samples, "samples_finished": len(chains)},
            )
        winner = normalize_answer(won.answer)
        return context.result(
            self.name,
            won.answer,
            samples=cfg.samples,
            samples_used=len(outcomes),
            samples_finished=len(chains),
            samples_failed=len(failures),
            failures=failure_kinds(failures),
            stop_reason=stop,
            answered=sum(won.votes.values()),
            votes=won.votes,
            agreement=round(won.votes.get(winner, 0) / len(chains), 4),
            answers=[normalize_answer(a) if a else None for a in ballots(chains)],
            found_by=dict(Counter(c.found_by for c in chains if c.found_by is not None)),  # how many answers were found each way
            **won.details,
        )

    async def _sample(self, query: str, cfg: SelfConsistencyConfig, context: StrategyContext) -> tuple[list[Chain | Failed], str]:
        """Every chain at once, or (adaptive) in waves until the vote is decided; the outcomes in chain order, and
        why sampling stopped."""
        settled: dict[int, Chain | Failed] = {}

        def arrived(index: int, outcome: Chain | Failed) -> None:  # `index` counts from the wave's first chain
            settled[len(outcomes) + index] = outcome  # the wave's chains join `outcomes` when it ends
            self._note_progress(context, cfg, [settled[i] for i in sorted(settled)])

        self._note_progress(context, cfg, [])
        outcomes: list[Chain | Failed] = []
        while (remaining := cfg.samples - len(outcomes)) > 0:
            wave = remaining
            if cfg.adaptive:  # on the votes of stated answers only: a whole-text vote can still be voided by a later stated one
                stated = Counter(
                    normalize_answer(o.answer) for o in outcomes if isinstance(o, Chain) and o.answer and o.found_by != "whole_text"
                )
                counts = sorted(stated.values(), reverse=True)
                if why := decided(counts, remaining, cfg.stop_confidence):
                    return outcomes, why
                wave = next_wave(counts, remaining, cfg.stop_confidence)
            chains = [partial(sample_chain, query, cfg, cfg.seed + i) for i in range(len(outcomes), len(outcomes) + wave)]
            outcomes += await context.fan_out_settled(chains, label=f"{self.name}.sample", arrived=arrived)
        return outcomes, "all_samples"

    @staticmethod
    def _note_progress(context: StrategyContext, cfg: SelfConsistencyConfig, outcomes: list[Chain | Failed]) -> None:
        """The chains settled so far (in chain order) and their vote, for `error.data.partial`."""
        chains = [o for o in outcomes if not isinstance(o, Failed)]
        won = vote(chains, cfg, weighed=False)  # the plain majority so far
        context.progress.update(
            samples=cfg.samples,
            samples_finished=len(chains),
            samples_failed=len(outcomes) - len(chains),
            answers=[normalize_answer(a) if a else None for a in ballots(chains)],
            votes=won.votes if won else {},
            answer=won.answer if won else None,
        )
