"""ReasonRay: LLM reasoning served on Ray. This package holds the shared core (configuration, errors,
events, reasoning tags, the JSON-RPC layer, the reasoning service) and the `reasonray` CLI."""

__version__ = "0.1.0"
