"""`Layer`: what every LLM wrapper of the stack (cache, retries, metrics, observation) passes through unchanged."""

from __future__ import annotations

from reasonray.gateway.capabilities import Capabilities, capabilities_of
from reasonray.gateway.protocol import LLM
from reasonray.gateway.tokens import TokenCounter, counter_of


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
