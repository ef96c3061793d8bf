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
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    """How hard a reasoning model should think: sent as `reasoning_effort` where the model takes it, otherwise turned
    into a `thinking_budget` by the gateway (docs/reasoning-models.md)."""
    thinking_budget: int | None = None
    """Most tokens the model may spend thinking before it must answer: the server's own control where it has one,
    otherwise budget forcing (the thinking is stopped at the budget, closed, and continued into an answer)."""
    min_thinking: int | None = None
    """Fewest thinking tokens: thinking that closes earlier is extended ("Wait") where the endpoint can continue it."""
    continue_thinking: str | None = None
    """Thinking to continue from (prefix continuation): the reply carries on this text as the model's own thinking,
    as bounded context's Delethink mode does from chunk to chunk. None: a fresh reply."""
    logprobs: int | None = None
    """Ask for token log-probabilities: None, none; 0, the chosen tokens' only; k > 0, also the k likeliest
    alternatives per token (OpenAI's `logprobs` / `top_logprobs`). Endpoints that refuse it answer without them."""
    extra_body: dict[str, Any] | None = None
    """Fields passed through to the endpoint's JSON body as they are (e.g. `chat_template_kwargs`), over `[llm] extra_body`."""
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
    """Every token generated, the thinking included (a reasoning model's hidden thinking too)."""
    reasoning_tokens: int = 0
    """The part of `completion_tokens` spent thinking (visible or hidden)."""


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error"]


class Choice(msgspec.Struct, frozen=True):
    text: str
    """The answer text, thinking removed (whatever form the server handed the thinking over in)."""
    finish_reason: FinishReason = "stop"
    tool_calls: tuple[ToolCall, ...] = ()
    stop_sequence: str | None = None  # which stop sequence ended the text, when the provider says
    reasoning: str = ""
    """The model's thinking behind `text`, as text (empty when the model thinks out of sight or not at all)."""
    token_logprobs: tuple[float, ...] = ()
    """The log-probability of each answer token, when the request asked for `logprobs` and the endpoint gave them."""
    top_logprobs: tuple[tuple[float, ...], ...] = ()
    """Per answer token, the log-probabilities of the likeliest alternatives (when `logprobs` > 0 was asked)."""
    thinking_unfinished: bool = False
    """The reply ended inside its thinking (cut by `max_tokens` before the thinking closed): `text` is then empty,
    and `reasoning` holds the thinking so far. Unfinished thinking is never an answer."""


class Completion(msgspec.Struct, frozen=True):
    """What came back, plus how it came back (latency, cache hit, attempts, simulated or not)."""

    choices: tuple[Choice, ...]
    usage: Usage
    model: str
    latency_ms: float = 0.0
    cached: bool = False
    attempts: int = 1
    simulated: bool = False
    thinking_control: str = ""
    """How the call's thinking budget or effort was held: "native" (the server's control), "forced" (budget forcing by
    prefix continuation), "continued" (the reply continued `continue_thinking`, no budget), "unsupported" (the endpoint can
    do neither: only room was made), "" (none was asked)."""

    @property
    def text(self) -> str:
        return self.choices[0].text

    @property
    def finish_reason(self) -> FinishReason:
        return self.choices[0].finish_reason

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return self.choices[0].tool_calls

    @property
    def reasoning(self) -> str:
        return self.choices[0].reasoning

    @property
    def thinking_unfinished(self) -> bool:
        return self.choices[0].thinking_unfinished


@runtime_checkable
class LLM(Protocol):
    """An async chat model. `model` names what answers, for cache keys and metrics."""

    @property
    def model(self) -> str: ...

    async def complete(self, request: LLMRequest) -> Completion: ...


def system(content: str) -> Message:
    return Message(role="system", content=content)


def with_system_note(messages: tuple[Message, ...], note: str) -> tuple[Message, ...]:
    """`messages` with `note` added to their system message (one of its own first where they have none)."""
    if messages and messages[0].role == "system":
        return (msgspec.structs.replace(messages[0], content=f"{messages[0].content or ''}\n\n{note}"), *messages[1:])
    return (system(note), *messages)


def user(content: str) -> Message:
    return Message(role="user", content=content)
