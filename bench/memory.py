"""Memory retrieval latency at 1K, 10K and 100K items, against a raw Chroma query in the same run.

    .venv/bin/python bench/memory.py [--sizes 1000,10000,100000] [--queries 200] [--embedder minilm|hash]

Items are synthetic reasoning tasks embedded with all-MiniLM-L6-v2 (the default embedder, bundled
and offline), stored through the bank's own store in an embedded Chroma under a temporary
directory. For each size, the same query embeddings go to:

- raw Chroma: `collection.query(query_embeddings=[v], n_results=candidates)`, nothing else;
- the bank: `ReasoningBank.ranked(v, ...)`, i.e. that query plus parsing the items, composite
  re-ranking (similarity, recency, error context) and grouping by task.

Query embedding time is measured separately (it is the same for both and independent of the size).
Targets: bank p50 under 1.5x raw Chroma, and under 25 ms at 100K items.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import _env  # noqa: F401  (sets up the environment first)

from reasonray.kernel.config import MemorySettings
from reasonray.memory.bank import ReasoningBank
from reasonray.memory.embeddings import SentenceTransformerEmbedder
from reasonray.memory.items import ErrorContext, MemoryItem
from reasonray.memory.store import MEMORIES, ChromaStore, open_client

SUBJECTS = ["a baker", "a farmer", "a train", "a student", "a shop", "a factory", "a cyclist", "a library", "a river", "a server"]
VERBS = ["sells", "packs", "travels", "reads", "ships", "produces", "covers", "lends", "carries", "handles"]
OBJECTS = ["loaves", "apples", "kilometres", "pages", "parcels", "widgets", "miles", "books", "litres", "requests"]
ASKS = ["How many in total?", "What is the average?", "How long will it take?", "What fraction is left?", "What is the difference?"]
BATCH = 4000


def task(rng: random.Random) -> str:
    return (
        f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.randint(2, 999)} {rng.choice(OBJECTS)} "
        f"every {rng.choice(['hour', 'day', 'week', 'month'])} for {rng.randint(2, 60)} periods. {rng.choice(ASKS)}"
    )


class HashEmbedder:
    name = "bench-hash"

    def embed(self, texts: list[str]) -> list[list[float]]:
        from reasonray.gateway.simulator.engine import embed

        return [embed(t) for t in texts]


def percentiles(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return statistics.median(s), s[min(int(0.95 * len(s)), len(s) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--embedder", choices=["minilm", "hash"], default="minilm")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = random.Random(7)
    embedder = SentenceTransformerEmbedder() if args.embedder == "minilm" else HashEmbedder()
    settings = MemorySettings()
    now = datetime.now(UTC)

    started = time.perf_counter()
    queries = [task(rng) for _ in range(args.queries)]
    query_vectors = embedder.embed(queries)  # loads the model
    embed_ms = []
    for q in queries[:50]:
        t = time.perf_counter()
        embedder.embed([q])
        embed_ms.append((time.perf_counter() - t) * 1000)
    print(
        f"embedder {embedder.name}: loaded and warmed in {time.perf_counter() - started:.1f} s; "
        f"one query embedding p50 {percentiles(embed_ms)[0]:.2f} ms"
    )

    with tempfile.TemporaryDirectory(prefix="reasonray-bench-memory-") as tmp:
        store = ChromaStore(open_client(None, Path(tmp)), embedder.name)
        bank = ReasoningBank(store, embedder, settings)
        stored = 0
        rows = []
        for size in sizes:
            t = time.perf_counter()
            while stored < size:
                n = min(BATCH, size - stored)
                texts = [task(rng) for _ in range(n)]
                vectors = embedder.embed(texts)
                items = []
                for i in range(n):
                    error = (
                        ErrorContext(error_type="slip", failure_pattern="rounded early", corrective_guidance="stay exact")
                        if i % 5 == 0
                        else None
                    )
                    items.append(
                        MemoryItem(
                            title=f"Lesson {stored + i}",
                            description="A lesson from a past task.",
                            content="Keep values exact.",
                            error_context=error,
                            workspace="bench",
                            task_id=f"t{(stored + i) // 2}",
                            created_at=now - timedelta(days=rng.randint(0, 365)),
                        )
                    )
                store.add(items, texts, vectors)
                stored += n
            fill_s = time.perf_counter() - t
            collection = store._collection(MEMORIES, "bench", create=False)
            for v in query_vectors[:20]:  # warm both paths
                collection.query(query_embeddings=[v], n_results=settings.candidates)
                bank.ranked(v, workspace="bench")
            raw, ours = [], []
            for v in query_vectors:
                t = time.perf_counter()
                collection.query(query_embeddings=[v], n_results=settings.candidates, include=["metadatas", "distances"])
                raw.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                bank.ranked(v, workspace="bench")
                ours.append((time.perf_counter() - t) * 1000)
            (r50, r95), (o50, o95) = percentiles(raw), percentiles(ours)
            rows.append((size, r50, r95, o50, o95))
            print(
                f"  {size:>7} items stored (+{fill_s:.0f} s): raw Chroma p50 {r50:.2f} ms p95 {r95:.2f} | "
                f"bank p50 {o50:.2f} ms p95 {o95:.2f} | ratio p50 {o50 / r50:.2f}x",
                flush=True,
            )

    print()
    print("| items | raw Chroma p50 / p95 (ms) | bank retrieval p50 / p95 (ms) | bank / raw (p50) |")
    print("|---:|---:|---:|---:|")
    for size, r50, r95, o50, o95 in rows:
        print(f"| {size:,} | {r50:.2f} / {r95:.2f} | {o50:.2f} / {o95:.2f} | {o50 / r50:.2f}x |")
    print(f"\nquery embedding ({embedder.name}) p50 {percentiles(embed_ms)[0]:.2f} ms, added to both in a real retrieval")


if __name__ == "__main__":
    main()
