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

    @property
    def sampled(self) -> bool:
        """True when the reply is meant to vary between calls (temperature > 0 and no seed)."""
        return self.temperature > 0 and self.seed is None


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
