"""Step-back prompting (Zheng et al., 2023) as a ReasonRay strategy in its own package.

First the model steps back: it names the general principle or concept behind the question. Then it
answers the question with that principle in view. Nothing in ReasonRay refers to this package; it
is found through the `reasonray.strategies` entry point in this package's pyproject.toml.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.kernel.tags import extract_answer, strip_thinking
from reasonray.strategies.base import ReasoningResult, Strategy, StrategyConfig, StrategyContext

ABSTRACTION_PROMPT = (
    "Before solving, step back: state the general principle, formula or concept the question depends on. "
    "Think inside <thinking>...</thinking>, then give the principle in one or two sentences inside <answer>...</answer>."
)
ANSWER_PROMPT = (
    "Solve the problem using the principle given. Think step by step inside <thinking>...</thinking>, "
    "then give only the final answer inside <answer>...</answer>."
)


class StepBackConfig(StrategyConfig):
    abstraction_prompt: str = Field(
        ABSTRACTION_PROMPT, min_length=1, max_length=4000, description="Asks for the principle behind the question."
    )
    max_tokens: int = Field(1024, ge=16, le=32_768, description="Most tokens per call.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature of both calls.")


class StepBack(Strategy):
    name = "step_back"
    description = "Asks for the principle behind the question first, then answers with it in view (two calls)."
    Config = StepBackConfig
    extra_capabilities = ("reasoning.abstraction",)

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        cfg = self.parse_config(config)
        abstraction = await context.llm.complete(
            LLMRequest(messages=(system(cfg.abstraction_prompt), user(query)), max_tokens=cfg.max_tokens, temperature=cfg.temperature)
        )
        principle = extract_answer(abstraction.text) or strip_thinking(abstraction.text)
        solution = await context.llm.complete(
            LLMRequest(
                messages=(system(ANSWER_PROMPT), user(f"Principle: {principle}\n\nProblem: {query}")),
                max_tokens=cfg.max_tokens,
                temperature=cfg.temperature,
            )
        )
        answer = extract_answer(solution.text)
        return context.result(
            self.name,
            answer if answer is not None else strip_thinking(solution.text),
            principle=principle,
            answer_tagged=answer is not None,
        )
