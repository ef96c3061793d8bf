"""What an LLM endpoint can do, so that strategies ask for structure where it is enforced and parse
tolerantly where it is not.

The gateway learns an endpoint's capabilities (from configuration, from what the server advertises, or by
probing it once) and exposes them on the LLM stack as `capabilities`; strategies read them with
`capabilities_of(llm)` and never ask which server they are talking to. Every wrapper of the stack (cache, retries,
metrics, observation) is a `Layer`, which passes them through unchanged.
"""

from __future__ import annotations

from typing import Any

import msgspec

from reasonray.gateway.protocol import LLM
from reasonray.gateway.tokens import TokenCounter, counter_of


class Capabilities(msgspec.Struct, frozen=True, omit_defaults=True):
    """One endpoint's abilities. The defaults are what any OpenAI-compatible server is assumed to do."""

    structured_output: bool = False
    """Enforces `response_format` json_schema / json_object (grammar-constrained decoding)."""
    tool_choice: bool = False
    """Honours `tools` with `tool_choice` (named, "required"), so a call can be forced."""
    tokenize: bool = False
    """Counts tokens with the model's own tokenizer (llama.cpp `/extras/tokenize`, vLLM `/tokenize`)."""
    context_length: int | None = None
    """The model's context window in its own tokens; None: unknown."""
    max_concurrency: int | None = None
    """How many requests the server runs at once (1 for llama.cpp's server); None: unknown, adaptive."""


def capabilities_of(llm: Any) -> Capabilities:
    """The capabilities an LLM (or any wrapper around one) declares; the defaults when it declares none."""
    caps = getattr(llm, "capabilities", None)
    return caps if isinstance(caps, Capabilities) else Capabilities()


def endpoint_client(llm: Any) -> Any:
    """The innermost client of an LLM stack that talks to an endpoint (has `backend`), following `inner`; None if none."""
    while llm is not None and not (hasattr(llm, "backend") and hasattr(llm, "discover")):
        llm = getattr(llm, "inner", None)
    return llm


class Layer:
    """An LLM over `inner`: the model, its capabilities and its token counter are the layer below's."""

    inner: LLM

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def capabilities(self) -> Capabilities:
        """The endpoint's capabilities, from the layer below."""
        return capabilities_of(self.inner)

    @property
    def tokens(self) -> TokenCounter:
        """The endpoint's token counter (the model's own tokens where known), from the layer below."""
        return counter_of(self.inner)
