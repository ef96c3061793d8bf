"""Chain of thought: one call that reasons inside `<thinking>` and answers inside `<answer>`.

Where the endpoint enforces a JSON schema the call asks for `{"reasoning", "answer"}` instead; a model
that ignores the format has its answer read from its prose (`found_by` says how). A reply cut inside its
thinking holds no answer: one more call continues that thinking with it closed (`thinking_budget=0`), so
the model answers from it (`answer_forced`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import Field

from reasonray.kernel.errors import ModelBehaviorError
from reasonray.kernel.extraction import find_answer, numeric_question
from reasonray.strategies.base import (
    ReasoningResult,
    Strategy,
    StrategyConfig,
    StrategyContext,
)
from reasonray.strategies.output import ANSWER, asking, note_found_by, structured

FORCED_ANSWER_TOKENS = 512
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
        enforced = structured(context)
        request = asking(ANSWER, cfg.system_prompt, query, enforced, max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=cfg.seed)
        completion = await context.llm.complete(request)
        forced = completion.thinking_unfinished
        if forced:  # unfinished thinking is never an answer: have the model close it and answer
            answer_now = msgspec.structs.replace(
                request,
                max_tokens=min(cfg.max_tokens, FORCED_ANSWER_TOKENS),
                continue_thinking=completion.reasoning or None,
                thinking_budget=0,
            )
            completion = await context.llm.complete(answer_now)
        found = (
            None if completion.thinking_unfinished else find_answer(completion.text, numeric=numeric_question(query), structured=enforced)
        )
        if found is None:
            unfinished = completion.thinking_unfinished
            why = "it ended still thinking, even when asked to answer" if unfinished else "an empty <answer>, or nothing outside <thinking>"
            fix = "it hit max_tokens: raise max_tokens" if completion.finish_reason == "length" else "check the model"
            raise ModelBehaviorError(
                f"the model's reply held no answer ({why}); {fix}",
                {"finish_reason": completion.finish_reason, "thinking_unfinished": unfinished, "answer_forced": forced},
            )
        note_found_by(context, self.name, found)
        return context.result(
            self.name,
            found.answer,
            found_by=found.found_by,
            answer_tagged=found.structured,
            finish_reason=completion.finish_reason,
            truncated=completion.finish_reason == "length",
            **({"answer_forced": True} if forced else {}),
        )
