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
from typing import Any

from reasonray.gateway.protocol import Message
from reasonray.gateway.tokens import count_messages, counter_for_model

TOKENIZERS = ("cl100k_base", "digits")
DIGIT = re.compile(r"(\d)")
# What SmolLM2's chat template writes when a conversation has no system message of its own.
INJECTED_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class SimTokenizer:
    """Counts prompts and text for the simulated model, and lists token ids for its tokenize endpoint."""

    def __init__(self, name: str = "cl100k_base") -> None:
        if name not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {name!r}; use one of {', '.join(TOKENIZERS)}")
        self._base: Any = counter_for_model("simulated")  # tiktoken's counter, which also encodes, or the estimate
        if name != "cl100k_base" and not hasattr(self._base, "encode"):  # tiktoken's file is missing: only the estimate
            raise ValueError(f"the {name!r} tokenizer needs tiktoken's cl100k_base file (set TIKTOKEN_CACHE_DIR)")
        self.name = self.encoding_name = name

    def _pieces(self, text: str) -> list[str]:
        """What the base encoding counts apart: the text, or for `digits` the text with every digit on its own."""
        return [text] if self.name == "cl100k_base" else [piece for piece in DIGIT.split(text) if piece]

    def encode(self, text: str) -> list[int]:
        return [token for piece in self._pieces(text) for token in self._ids.encode(piece)]

    def decode(self, tokens: list[int]) -> str:
        return str(self._ids.decode(tokens))

    @property
    def _ids(self) -> Any:
        if not hasattr(self._base, "encode"):
            raise ValueError("token ids need tiktoken's cl100k_base file (set TIKTOKEN_CACHE_DIR); only counts are estimated")
        return self._base

    def count(self, text: str) -> int:
        return sum(int(self._base.count(piece)) for piece in self._pieces(text))

    def head(self, text: str, n: int) -> str:
        if self.name == "cl100k_base":
            return str(self._base.head(text, n))
        tokens = self.encode(text)
        return text if len(tokens) <= n else self.decode(tokens[: max(n, 0)])

    def tail(self, text: str, n: int) -> str:
        if self.name == "cl100k_base":
            return str(self._base.tail(text, n))
        tokens = self.encode(text)
        return text if len(tokens) <= n else self.decode(tokens[len(tokens) - max(n, 0) :])

    def prompt_tokens(self, messages: Iterable[Message]) -> int:
        """What a chat request's prompt costs: OpenAI's framing for cl100k_base, ChatML's for `digits`."""
        messages = list(messages)
        if self.name == "cl100k_base":
            return count_messages(self, messages)
        if not any(m.role == "system" for m in messages):
            messages.insert(0, Message(role="system", content=INJECTED_SYSTEM_PROMPT))
        bodies = (f"{m.role}\n{m.content or ''}" + "".join(c.name + c.arguments for c in m.tool_calls) for m in messages)
        # <|im_start|>assistant\n primes the reply; each message is <|im_start|> ... <|im_end|> \n
        return 1 + self.count("assistant\n") + sum(3 + self.count(body) for body in bodies)
