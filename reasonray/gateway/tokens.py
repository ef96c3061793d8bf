"""Token counting with tiktoken, offline through TIKTOKEN_CACHE_DIR, with a documented estimate.

When no encoding can be loaded (no network and no cached BPE file), counting falls back to an
estimate of one token per 4 characters (the rule of thumb OpenAI documents for English text), and
says so once in the log. The simulated model counts with the same functions, so the usage it
reports agrees with what strategies count.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from reasonray.gateway.protocol import Message

if TYPE_CHECKING:
    import tiktoken

log = structlog.get_logger(__name__)

CHARS_PER_TOKEN_ESTIMATE = 4
# OpenAI's chat format: every message costs 3 tokens of framing, a name 1 more, and every reply
# is primed with 3 (the cookbook's `num_tokens_from_messages`).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
DEFAULT_ENCODING = "cl100k_base"


class TokenCounter(Protocol):
    """Counts and cuts text in tokens of one encoding."""

    @property
    def encoding_name(self) -> str: ...

    def count(self, text: str) -> int: ...

    def head(self, text: str, n: int) -> str:
        """The first `n` tokens of `text`."""
        ...

    def tail(self, text: str, n: int) -> str:
        """The last `n` tokens of `text`."""
        ...


class TiktokenCounter:
    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self._enc = encoding

    @property
    def encoding_name(self) -> str:
        return self._enc.name

    def count(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, tokens: list[int]) -> str:
        return self._enc.decode(tokens)

    def head(self, text: str, n: int) -> str:
        tokens = self.encode(text)
        return text if len(tokens) <= n else self._enc.decode(tokens[: max(n, 0)])

    def tail(self, text: str, n: int) -> str:
        tokens = self.encode(text)
        return text if len(tokens) <= n else self._enc.decode(tokens[len(tokens) - max(n, 0) :])


class EstimateCounter:
    """One token per CHARS_PER_TOKEN_ESTIMATE characters, rounded up."""

    encoding_name = "estimate"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / CHARS_PER_TOKEN_ESTIMATE)

    def head(self, text: str, n: int) -> str:
        return text[: max(n, 0) * CHARS_PER_TOKEN_ESTIMATE]

    def tail(self, text: str, n: int) -> str:
        keep = max(n, 0) * CHARS_PER_TOKEN_ESTIMATE
        return text[len(text) - keep :] if keep < len(text) else text


@functools.lru_cache(maxsize=8)
def _load(encoding_name: str) -> TokenCounter:
    import tiktoken

    try:
        return TiktokenCounter(tiktoken.get_encoding(encoding_name))
    except Exception as exc:  # tiktoken raises whatever its download raised
        log.warning(
            "tokenizer.fallback_estimate",
            encoding=encoding_name,
            reason=f"{type(exc).__name__}: {exc}"[:300],
            hint="set TIKTOKEN_CACHE_DIR to a folder holding the BPE files to count exactly",
            chars_per_token=CHARS_PER_TOKEN_ESTIMATE,
        )
        return EstimateCounter()


def counter_for_model(model: str) -> TokenCounter:
    """The counter for a model: its tiktoken encoding, cl100k_base for unknown names, else the estimate."""
    import tiktoken

    try:
        return _load(tiktoken.encoding_name_for_model(model))
    except KeyError:
        return _load(DEFAULT_ENCODING)


def openai_message(m: Message) -> dict[str, Any]:
    """A message as the chat completions API takes it (and as a server's chat template then sees it)."""
    # an assistant's tool calls come with no text: "" rather than null, which llama-cpp-python's server refuses (500)
    out: dict[str, Any] = {"role": m.role, "content": m.content if m.content is not None else ""}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
    return out | {name: value for name in ("tool_call_id", "name") if (value := getattr(m, name))}


def count_messages(counter: TokenCounter, messages: Iterable[Message], tools: Sequence[dict[str, Any]] = ()) -> int:
    """Prompt tokens of a chat request: exactly, when the counter can render the model's own chat template
    (`count_chat`: the server's template and tokenizer, as it will count them); otherwise as OpenAI's chat
    format counts them, plus whatever framing the counter has learned the model's server adds (its `framing`:
    chat-template markers, an injected system prompt) and the tools' JSON."""
    messages = tuple(messages)
    exact = getattr(counter, "count_chat", None)
    if callable(exact):
        counted = exact(messages, tools)
        if counted is not None:
            return int(counted)
    framing = getattr(counter, "framing", None)
    total = REPLY_PRIMING_TOKENS + (int(framing(messages)) if callable(framing) else 0)
    for m in messages:
        total += TOKENS_PER_MESSAGE + counter.count(m.role)
        if m.content:
            total += counter.count(m.content)
        if m.name:
            total += TOKENS_PER_NAME + counter.count(m.name)
        for call in m.tool_calls:
            total += counter.count(call.name) + counter.count(call.arguments)
    if tools:
        total += counter.count(json.dumps(list(tools)))
    return total


def counter_of(llm: object) -> TokenCounter:
    """The counter an LLM stack counts with (its endpoint's model tokens, `tokens`), else tiktoken's for its model name."""
    tokens = getattr(llm, "tokens", None)
    if tokens is not None and hasattr(tokens, "count") and hasattr(tokens, "tail"):
        return tokens  # type: ignore[no-any-return]  # a TokenCounter by duck type
    return counter_for_model(str(getattr(llm, "model", "")))
