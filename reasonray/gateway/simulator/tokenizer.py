"""The tokenizers the simulated model counts with: ReasonRay's own (tiktoken's cl100k_base, OpenAI's chat
framing) by default, or, when it imitates a small local model, one that counts as such a model does.

`digits` is cl100k_base with every digit a token of its own (as gpt2-style BPEs such as SmolLM2's split
numbers) and ChatML framing (`<|im_start|>role\\n...<|im_end|>\\n`, one token per special marker, and the
system prompt such a template injects when a request has none). So the usage it reports differs from what
ReasonRay counts on its own, by about as much as a real small model's does; `/extras/tokenize` serves the
same count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from reasonray.gateway.protocol import Message
from reasonray.gateway.tokens import TokenCounter, count_messages, counter_for_model

TOKENIZERS = ("cl100k_base", "digits")
DIGIT = re.compile(r"(\d)")
# What SmolLM2's chat template writes when a conversation has no system message of its own.
INJECTED_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class EncodingCounter(TokenCounter, Protocol):
    """A counter that can also list token ids and turn them back into text (for `/extras/tokenize`)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


class SimTokenizer:
    """Counts prompts and text for the simulated model, and lists token ids for its tokenize endpoint."""

    def __init__(self, name: str = "cl100k_base") -> None:
        if name not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {name!r}; use one of {', '.join(TOKENIZERS)}")
        base = counter_for_model("simulated")
        if name != "cl100k_base" and not hasattr(base, "encode"):  # tiktoken's file is missing: only the estimate
            raise ValueError(f"the {name!r} tokenizer needs tiktoken's cl100k_base file (set TIKTOKEN_CACHE_DIR)")
        self.name = name
        self._base = base

    @property
    def encoding_name(self) -> str:
        return self.name

    @property
    def _ids(self) -> EncodingCounter:
        if not hasattr(self._base, "encode"):
            raise ValueError("token ids need tiktoken's cl100k_base file (set TIKTOKEN_CACHE_DIR); only counts are estimated")
        return self._base  # type: ignore[return-value]

    def encode(self, text: str) -> list[int]:
        if self.name == "cl100k_base":
            return self._ids.encode(text)
        return [token for piece in DIGIT.split(text) if piece for token in self._ids.encode(piece)]

    def decode(self, tokens: list[int]) -> str:
        return self._ids.decode(tokens)

    def count(self, text: str) -> int:
        if self.name == "cl100k_base":
            return self._base.count(text)
        return sum(self._base.count(piece) for piece in DIGIT.split(text) if piece)

    def head(self, text: str, n: int) -> str:
        if self.name == "cl100k_base":
            return self._base.head(text, n)
        tokens = self.encode(text)
        return text if len(tokens) <= n else self.decode(tokens[: max(n, 0)])

    def tail(self, text: str, n: int) -> str:
        if self.name == "cl100k_base":
            return self._base.tail(text, n)
        tokens = self.encode(text)
        return text if len(tokens) <= n else self.decode(tokens[len(tokens) - max(n, 0) :])

    def prompt_tokens(self, messages: Iterable[Message]) -> int:
        """What a chat request's prompt costs: OpenAI's framing for cl100k_base, ChatML's for `digits`."""
        messages = list(messages)
        if self.name == "cl100k_base":
            return count_messages(self, messages)
        if not any(m.role == "system" for m in messages):
            messages.insert(0, Message(role="system", content=INJECTED_SYSTEM_PROMPT))
        total = 1 + self.count("assistant\n")  # <|im_start|>assistant\n primes the reply
        for m in messages:
            body = f"{m.role}\n{m.content or ''}" + "".join(c.name + c.arguments for c in m.tool_calls)
            total += 3 + self.count(body)  # <|im_start|> ... <|im_end|> \n
        return total
