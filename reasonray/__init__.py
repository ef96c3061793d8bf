"""ReasonRay: LLM reasoning served on Ray. The one import root: the layers live in its subpackages
(kernel, gateway, memory, strategies, reasoner, api, actors, serve_app, evals and the `reasonray` CLI;
docs/architecture.md); the root itself exports only `Client`, `AsyncClient` and `ReasonRayError`."""

__version__ = "0.1.0"

__all__ = ["AsyncClient", "Client", "ReasonRayError", "__version__"]


def __getattr__(name: str):
    """`reasonray.Client`, `AsyncClient` and `ReasonRayError`, imported on first use: the package root stays light."""
    if name in ("Client", "AsyncClient", "ReasonRayError"):
        from reasonray import client

        return getattr(client, name)
    raise AttributeError(f"module 'reasonray' has no attribute {name!r}")
