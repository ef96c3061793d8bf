"""Compute accounting for chunked reasoning (docs/strategies/bounded_context.md derives it).

A call whose context holds L tokens (prompt plus generation) attends over L(L+1)/2 token pairs,
prefill and decoding together. A run is a list of calls; the baseline is the same reasoning
generated in one growing context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate


def attention_pairs(length: int) -> int:
    return length * (length + 1) // 2


@dataclass
class CostLedger:
    """Prompt and generated tokens of every call of a run, as the provider counted them."""

    chunk_calls: list[tuple[int, int]] = field(default_factory=list)  # reasoning chunks
    other_calls: list[tuple[int, int]] = field(default_factory=list)  # carryover summaries, final answer

    def chunk(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.chunk_calls.append((prompt_tokens, completion_tokens))

    def other(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.other_calls.append((prompt_tokens, completion_tokens))

    def summary(self) -> dict[str, float | int]:
        calls = self.chunk_calls + self.other_calls
        if not self.chunk_calls:
            return {}
        first_prompt = self.chunk_calls[0][0]
        reasoning = sum(c for _, c in self.chunk_calls)
        bounded_attention = sum(attention_pairs(p + c) for p, c in calls)
        baseline_attention = attention_pairs(first_prompt + reasoning)
        bounded_processed = sum(p + c for p, c in calls)
        # the same chunks, each re-reading everything generated before it
        baseline_processed = sum(first_prompt + generated for generated in accumulate(c for _, c in self.chunk_calls))
        ratio = bounded_attention / baseline_attention
        return {
            "reasoning_tokens": reasoning,
            "attention_cost_bounded": bounded_attention,
            "attention_cost_baseline": baseline_attention,
            "attention_cost_ratio": round(ratio, 4),
            "compute_savings_pct": round(max(0.0, 1 - ratio) * 100, 2),
            "tokens_processed_bounded": bounded_processed,
            "tokens_processed_baseline": baseline_processed,
            "tokens_processed_ratio": round(bounded_processed / baseline_processed, 4),
        }


def closed_form_attention(
    reasoning: int,
    chunk_size: int,
    first_prompt: int,
    later_frame: int,
    carryover: int | None = None,
    *,
    carryover_size: int = 0,
    visible_fraction: float = 1.0,
    summary_call: int = 0,
) -> tuple[int, int]:
    """(bounded, baseline) attention for `reasoning` tokens, chunk by chunk (docs/strategies/bounded_context.md).

    The first chunk generates chunk_size - first_prompt tokens. A later chunk's prompt is
    `later_frame` (instructions, query, head, framing) plus the carryover: `carryover` tokens when
    fixed (summary mode), else the visible tail of the previous chunk, min(carryover_size,
    visible_fraction x its generation) (tail mode). Each summary call adds `summary_call` context tokens.
    """
    generated = min(reasoning, chunk_size - first_prompt)
    bounded = attention_pairs(first_prompt + generated)
    left = reasoning - generated
    while left > 0:
        carried = carryover if carryover is not None else min(carryover_size, int(visible_fraction * generated))
        prompt = later_frame + carried
        generated = min(left, chunk_size - prompt)
        bounded += attention_pairs(prompt + generated) + (attention_pairs(summary_call) if summary_call else 0)
        left -= generated
    return bounded, attention_pairs(first_prompt + reasoning)
