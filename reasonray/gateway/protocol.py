"""The narrow LLM protocol every strategy talks to: one request in, provider-neutral parts out.

Cache, retries, the circuit breaker and the simulated model all satisfy this same protocol, so a
strategy never knows which of them it is talking to.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(msgspec.Struct, frozen=True):
    """A function call the model asked for (OpenAI function-calling format)."""

    id: str
    name: str
    arguments: str  # JSON text, exactly as the model produced it


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """One chat message."""

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


class LLMRequest(msgspec.Struct, frozen=True, omit_defaults=True):
    """Everything that changes what the model answers."""

    messages: tuple[Message, ...]
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    n: int = 1
    seed: int | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    """OpenAI's `tool_choice`: "none", "auto", "required" or {"type": "function", "function": {"name": ...}}."""
    response_format: dict[str, Any] | None = None
    """OpenAI's `response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}): sent
    only to endpoints that enforce it; others are asked in the prompt and their output is validated."""
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    purpose: str | None = None
    """What the call is for, from `PURPOSES` (None: answer the conversation). Real models never see it:
    an OpenAI-compatible endpoint gets it as the `X-ReasonRay-Purpose` header, which they ignore; the
    simulated model replies by it (docs/simulator.md), so it never has to recognise a prompt's wording."""

    @property
    def sampled(self) -> bool:
        """True when the reply is meant to vary between calls (temperature > 0 and no seed)."""
        return self.temperature > 0 and self.seed is None


PURPOSE_HEADER = "X-ReasonRay-Purpose"
PURPOSES: dict[str, str] = {
    "final_answer": "answer now from what the prompt shows: only <answer>...</answer>",
    "summarize": "compress the reasoning shown into a carryover for the next chunk",
    "propose": "the next step of the solution shown (<step>), or its final answer (<answer>)",
    "score": "a 0-1 score of the solution shown (<score>)",
    "critique": "a 0-1 score of the solution shown and what to fix (<score>, <feedback>)",
    "choose": "the number of the best of the numbered candidates shown (<vote>)",
    "judge": "whether the attempt shown solved its task (<status>success</status> or failure)",
    "extract_success": "memory items from an attempt that succeeded (<memory>)",
    "extract_failure": "memory items, with their error context, from an attempt that failed (<memory>)",
    "extract_contrast": "memory items contrasting the numbered attempts shown (<memory>)",
    "extract_passive": "memory items from a question and the answer it received (<memory>)",
}
"""The purposes ReasonRay's own calls declare, and what each asks of the model."""


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error"]


class Choice(msgspec.Struct, frozen=True):
    text: str
    finish_reason: FinishReason = "stop"
    tool_calls: tuple[ToolCall, ...] = ()
    stop_sequence: str | None = None  # which stop sequence ended the text, when the provider says


class Completion(msgspec.Struct, frozen=True):
    """What came back, plus how it came back (latency, cache hit, attempts, simulated or not)."""

    choices: tuple[Choice, ...]
    usage: Usage
    model: str
    latency_ms: float = 0.0
    cached: bool = False
    attempts: int = 1
    simulated: bool = False

    @property
    def text(self) -> str:
        return self.choices[0].text

    @property
    def finish_reason(self) -> FinishReason:
        return self.choices[0].finish_reason

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return self.choices[0].tool_calls


@runtime_checkable
class LLM(Protocol):
    """An async chat model. `model` names what answers, for cache keys and metrics."""

    @property
    def model(self) -> str: ...

    async def complete(self, request: LLMRequest) -> Completion: ...


def system(content: str) -> Message:
    return Message(role="system", content=content)


def user(content: str) -> Message:
    return Message(role="user", content=content)
