"""The simulated model as an in-process LLM: the same engine as the HTTP server, with its latency
model, for unit tests, notebooks and benchmarks that should not measure HTTP. In a reasoning mode its
replies are read as the OpenAI-compatible client reads the server's (`gateway.replies`): the thinking
in `reasoning`, none shown in the hidden form, unfinished thinking never an answer."""

from __future__ import annotations

import asyncio
import time

from reasonray.gateway.protocol import Completion, LLMRequest, Usage
from reasonray.gateway.replies import read_choice, settle
from reasonray.gateway.simulator.engine import MODEL_NAME, SimulatedModel
from reasonray.gateway.simulator.reasoning import handed_over
from reasonray.gateway.tokens import counter_for_model


class SimulatedLLM:
    """Satisfies the LLM protocol by asking a SimulatedModel directly."""

    model = MODEL_NAME

    def __init__(self, model: SimulatedModel | None = None, *, ttft_ms: float = 0.0, tokens_per_second: float = 0.0) -> None:
        self.engine = model or SimulatedModel(counter_for_model(MODEL_NAME))
        self.ttft_ms = ttft_ms
        self.tokens_per_second = tokens_per_second

    async def complete(self, request: LLMRequest) -> Completion:
        started = time.perf_counter()
        response = self.engine.respond(request)
        form = self.engine.reasoning_plan(request).form  # respond has checked the request's directives
        delay = self.ttft_ms / 1000 + (response.completion_tokens / self.tokens_per_second if self.tokens_per_second else 0.0)
        if delay:
            await asyncio.sleep(delay)
        usage = Usage(response.prompt_tokens, response.completion_tokens, response.reasoning_tokens)
        choices = []
        for c in response.choices:  # read as the client reads the server's reply in `form` (an R1 model thinks in its text)
            content, reasoning = handed_over(c.reasoning, c.text, c.thinking_unfinished, form)
            read = read_choice(
                content, reasoning, c.finish_reason, thinks=form == "r1", tool_calls=c.tool_calls, stop_sequence=c.stop_reason
            )
            choices.append(read)
        return Completion(
            choices=settle(choices, usage),
            usage=usage,
            model=MODEL_NAME,
            latency_ms=(time.perf_counter() - started) * 1000,
            simulated=True,
        )
