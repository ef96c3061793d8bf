"""What tests/unit/test_thinking_forms.py and bench/thinking_forms.py both run: the forms a server hands thinking
over in, the strategies with their configurations, the model name for each form, and a client that keeps every
request and completion."""

from __future__ import annotations

from typing import Any

from reasonray.gateway.openai_client import OpenAILLM
from reasonray.gateway.protocol import Completion, LLMRequest
from reasonray.kernel.config import ReasoningSettings

FORMS = ["plain", "field", "r1", "hidden"]
STRATEGIES: dict[str, dict[str, Any]] = {
    "chain_of_thought": {},
    "bounded_context": {},
    "react": {},
    "tree_of_thought": {"breadth": 2, "depth": 2},
    "self_consistency": {"samples": 3},
    "refine": {"max_iterations": 2},
    "matts": {"k": 2},
}
REASONING = ReasoningSettings(enabled_strategies=list(STRATEGIES), default_strategy="chain_of_thought")
# an R1 distill served without a reasoning parser: its name says it thinks in its text
MODEL = {"plain": "simulated", "field": "simulated", "r1": "deepseek-r1-distill-qwen-7b", "hidden": "simulated"}


class Recorded:
    """The client, keeping every request and completion: what each chunk thought, what each turn was shown."""

    def __init__(self, inner: OpenAILLM) -> None:
        self.inner = inner
        self.calls: list[tuple[LLMRequest, Completion]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, request: LLMRequest) -> Completion:
        completion = await self.inner.complete(request)
        self.calls.append((request, completion))
        return completion
