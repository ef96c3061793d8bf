"""ReasonRay: LLM reasoning served on Ray. This package holds the shared core (configuration, errors,
events, reasoning tags, the JSON-RPC layer, the reasoning service) and the `reasonray` CLI."""

__version__ = "0.1.0"

__all__ = ["AsyncClient", "Client", "ReasonRayError", "__version__"]


def __getattr__(name: str):
    """`reasonray.Client`, `AsyncClient` and `ReasonRayError`, imported on first use: the package root stays light."""
    if name in ("Client", "AsyncClient", "ReasonRayError"):
        from reasonray import client

        return getattr(client, name)
    raise AttributeError(f"module 'reasonray' has no attribute {name!r}")
