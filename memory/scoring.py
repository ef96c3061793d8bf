"""The composite retrieval score: similarity, recency and error-context relevance, each in 0-1, combined by
configurable weights divided by their sum (so the composite stays in 0-1). docs/memory.md ("Retrieval") says
what each component measures; the error-context relevance of a lesson from failure is its strongest signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from reasonray.kernel.config import ScoreWeights
from reasonray.memory.items import MemoryItem


class Scores(BaseModel):
    similarity: float = Field(description="Cosine similarity to the task, clamped to 0-1.")
    recency: float = Field(description="0.5 ** (age / half-life).")
    error_context: float = Field(description="Relevance of the memory's error context to the task (0 without one).")
    composite: float = Field(description="Weighted mean of the three.")


def similarity_from_cosine_distance(distance: float) -> float:
    """Chroma's cosine distance is 1 - cos(a, b); the similarity is cos, clamped to 0-1 (opposite directions are
    as irrelevant as orthogonal ones)."""
    return min(max(1.0 - distance, 0.0), 1.0)


def recency(created_at: datetime, now: datetime, half_life_days: float) -> float:
    age_days = max((now - created_at) / timedelta(days=1), 0.0)
    return 0.5 ** (age_days / half_life_days)


def composite(
    item: MemoryItem,
    similarity: float,
    *,
    now: datetime,
    weights: ScoreWeights,
    half_life_days: float,
    domain: str | None = None,
    error_patterns: Sequence[str] = (),
) -> Scores:
    r = recency(item.created_at, now, half_life_days)
    e = 0.0  # the error-context relevance: without an error context, none
    if item.error_context is not None:
        signals = [similarity]  # a failure on a similar task is a relevant warning
        if domain is not None:
            signals.append(1.0 if item.domain_category == domain else 0.0)
        if error_patterns:
            named = {t.lower() for t in item.pattern_tags} | {item.error_context.error_type.lower()}
            signals.append(sum(p.lower() in named for p in error_patterns) / len(error_patterns))
        e = max(signals)
    total = weights.similarity + weights.recency + weights.error_context
    score = (weights.similarity * similarity + weights.recency * r + weights.error_context * e) / total
    return Scores(similarity=round(similarity, 6), recency=round(r, 6), error_context=round(e, 6), composite=round(score, 6))
