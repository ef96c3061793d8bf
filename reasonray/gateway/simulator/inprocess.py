"""The simulated model as an in-process LLM: the same engine as the HTTP server, with its latency
model, for unit tests, notebooks and benchmarks that should not measure HTTP."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from reasonray.gateway.protocol import Choice, Completion, FinishReason, LLMRequest, Usage
from reasonray.gateway.simulator.engine import MODEL_NAME, SimulatedModel
from reasonray.gateway.tokens import counter_for_model


class SimulatedLLM:
    """Satisfies the LLM protocol by asking a SimulatedModel directly."""

    def __init__(self, model: SimulatedModel | None = None, *, ttft_ms: float = 0.0, tokens_per_second: float = 0.0) -> None:
        self.engine = model or SimulatedModel(counter_for_model(MODEL_NAME))
        self.ttft_ms = ttft_ms
        self.tokens_per_second = tokens_per_second

    @property
    def model(self) -> str:
        return MODEL_NAME

    async def complete(self, request: LLMRequest) -> Completion:
        started = time.perf_counter()
        response = self.engine.respond(request)
        delay = self.ttft_ms / 1000 + (response.completion_tokens / self.tokens_per_second if self.tokens_per_second else 0.0)
        if delay:
            await asyncio.sleep(delay)
        return Completion(
            choices=tuple(
                Choice(text=c.text, finish_reason=cast(FinishReason, c.finish_reason), tool_calls=c.tool_calls, stop_sequence=c.stop_reason)
                for c in response.choices
            ),
            usage=Usage(response.prompt_tokens, response.completion_tokens),
            model=MODEL_NAME,
            latency_ms=(time.perf_counter() - started) * 1000,
            simulated=True,
        )
