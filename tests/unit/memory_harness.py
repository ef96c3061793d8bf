"""A real ReasoningBank (embedded Chroma on disk) with a deterministic embedder, for unit tests."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from reasonray.gateway.simulator.engine import embed
from reasonray.kernel.config import MemorySettings
from reasonray.memory.bank import ReasoningBank
from reasonray.memory.service import BankService, LocalMemory
from reasonray.memory.store import ChromaStore, open_client


class HashEmbedder:
    """Feature-hashed bag of words (the simulator's /v1/embeddings): texts sharing words point the same way."""

    name = "test-hash"

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        return [embed(t) for t in texts]


def make_bank(path: Path, embedder: Any | None = None, clock: Any | None = None, **settings: Any) -> ReasoningBank:
    embedder = embedder or HashEmbedder()
    options = {"clock": clock} if clock else {}
    return ReasoningBank(ChromaStore(open_client(None, path), embedder.name), embedder, MemorySettings(**settings), **options)


def local_memory(bank: ReasoningBank) -> LocalMemory:
    return LocalMemory(BankService(bank))


class FixedClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now
