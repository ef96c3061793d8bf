"""Chain of thought: one call that reasons inside `<thinking>` and answers inside `<answer>`."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.kernel.errors import ModelBehaviorError
from reasonray.kernel.tags import extract_answer, strip_thinking
from reasonray.strategies.base import (
    ReasoningResult,
    Strategy,
    StrategyConfig,
    StrategyContext,
)

SYSTEM_PROMPT = (
    "Solve the user's problem. Think step by step inside <thinking>...</thinking>, "
    "then give only the final answer inside <answer>...</answer>."
)


class ChainOfThoughtConfig(StrategyConfig):
    max_tokens: int = Field(4096, ge=1, le=262_144, description="Most tokens the model may generate.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature; 0 is repeatable and cacheable.")
    seed: int | None = Field(None, description="Sampling seed; a seeded call is repeatable and cacheable.")
    system_prompt: str = Field(SYSTEM_PROMPT, min_length=1, max_length=20_000, description="Instructions sent as the system message.")


class ChainOfThought(Strategy):
    name = "chain_of_thought"
    description = "One LLM call that reasons step by step, then answers. Cheapest and fastest."
    Config = ChainOfThoughtConfig
    extra_capabilities = ("reasoning.single_call",)

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        cfg = self.parse_config(config)
        completion = await context.llm.complete(
            LLMRequest(
                messages=(system(cfg.system_prompt), user(query)),
                max_tokens=cfg.max_tokens,
                temperature=cfg.temperature,
                seed=cfg.seed,
            )
        )
        tagged = extract_answer(completion.text)
        answer = tagged if tagged is not None else strip_thinking(completion.text)
        if not answer.strip():
            raise ModelBehaviorError(
                "the model's reply held no answer (an empty <answer>, or nothing outside <thinking>)"
                + ("; it hit max_tokens: raise max_tokens" if completion.finish_reason == "length" else "; check the model"),
                {"finish_reason": completion.finish_reason},
            )
        return context.result(
            self.name,
            answer,
            answer_tagged=tagged is not None,
            finish_reason=completion.finish_reason,
            truncated=completion.finish_reason == "length",
        )
