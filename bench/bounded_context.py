"""bounded_context against one growing context, all figures measured in this run with the simulated model.

    .venv/bin/python bench/bounded_context.py [--quick]

1. Compute: tokens processed and attention cost at 10K-128K tokens of reasoning, both carryover modes,
   against the same reasoning in one growing context; and the closed form of
   docs/strategies/bounded_context.md for the same parameters (must agree within 2%).
2. Memory: peak Python memory of the strategy at 5 and at 50 iterations (growth must stay under 5%).
3. Latency: wall time with the simulator's latency model, against one growing context (target < 10%).
4. A model that thinks (tests/unit/thinking_model.py: thinking apart from the answer, every chunk cut mid-thinking):
   the delethink carryover against the summary and tail carryovers: iterations and tokens to the answer, how
   far the thinking got, and chunks that started over (must be none).
Targets: savings >= 50% above 10K tokens and >= 75% at 96K.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import tracemalloc
from pathlib import Path

import _env  # noqa: F401  (sets up the environment first)

from reasonray.gateway.observed import ObservedLLM
from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.tokens import count_messages, counter_for_model
from reasonray.kernel.events import EventRecorder
from reasonray.kernel.tags import strip_thinking
from reasonray.strategies.base import StrategyContext
from reasonray.strategies.bounded_context import (
    INSTRUCTIONS,
    BoundedContext,
    BoundedContextConfig,
    RunState,
)
from reasonray.strategies.compute_cost import closed_form_attention
from tests.unit.thinking_model import ThinkingModel

COUNTER = counter_for_model("simulated")
EVENTS = Path(tempfile.mkdtemp(prefix="reasonray-bench-"))


def query_for(tokens: int) -> str:
    return f"[[sim think={tokens} answer=7]] Work the problem through."


async def bounded(llm, tokens: int, **config):
    recorder = EventRecorder(EVENTS / f"{time.time_ns()}.jsonl", keep=False)
    context = StrategyContext(
        llm=ObservedLLM(llm, recorder, trace_id="bench", strategy="bounded_context"), tokens=COUNTER, emit=recorder, trace_id="bench"
    )
    try:
        return await BoundedContext().reason(query_for(tokens), context=context, config={"max_iterations": 50, **config})
    finally:
        recorder.close()


async def growing(llm, tokens: int):
    """The baseline: the same reasoning in one call, one growing context."""
    return await llm.complete(LLMRequest(messages=(system(INSTRUCTIONS), user(query_for(tokens)))))


def visible_fraction() -> float:
    """The share of the simulated model's reasoning that is visible (its <thinking> asides are stripped)."""
    text = SimulatedLLM().engine.respond(LLMRequest(messages=(user(query_for(20_000)),))).choices[0].text
    return COUNTER.count(strip_thinking(text)) / COUNTER.count(text)


def closed_form(tokens: int, specific: dict, mode: str, visible: float) -> int:
    """Bounded attention from the docs' formula: prompt sizes from the templates, not from the run."""
    cfg = BoundedContextConfig(carryover_mode=mode)
    query = query_for(tokens)
    first_prompt = count_messages(COUNTER, (system(INSTRUCTIONS), user(query)))
    frame = count_messages(COUNTER, BoundedContext()._messages(RunState(query, mode=mode), 1))
    if mode == "tail":
        return closed_form_attention(
            specific["reasoning_tokens"],
            cfg.chunk_size,
            first_prompt,
            frame + cfg.head_tokens,
            carryover_size=cfg.carryover_size,
            visible_fraction=visible,
        )[0]
    summary = specific["mean_summary_tokens"]
    summary_call = cfg.chunk_size - cfg.carryover_size + summary  # its prompt fills chunk - carryover, then it writes S
    return closed_form_attention(specific["reasoning_tokens"], cfg.chunk_size, first_prompt, frame, summary, summary_call=summary_call)[0]


def compute(sizes: list[int]) -> None:
    visible = visible_fraction()
    print(f"\n1. Compute (chunk_size 8192, carryover_size 4096, head 100 tokens; visible share of reasoning {visible:.3f})")
    print(
        f"{'reasoning':>10} {'mode':>8} {'iters':>5} {'answer':>6} {'tokens proc. ratio':>18} {'attention ratio':>15} "
        f"{'savings %':>9} {'closed form Δ':>13}"
    )
    verdicts = []
    for tokens in sizes:
        for mode in ("tail", "summary"):
            llm = SimulatedLLM()
            result = asyncio.run(bounded(llm, tokens, carryover_mode=mode))
            s = dict(result.metrics.strategy_specific)
            if mode == "summary":
                summaries = [i.get("carryover_tokens", 0) for i in s["iterations"][:-1]]
                s["mean_summary_tokens"] = round(sum(summaries) / max(len(summaries), 1))
            expected = closed_form(tokens, s, mode, visible)
            delta = (s["attention_cost_bounded"] - expected) / expected * 100
            print(
                f"{tokens:>10} {mode:>8} {s['total_iterations']:>5} {result.answer:>6} {s['tokens_processed_ratio']:>18.3f} "
                f"{s['attention_cost_ratio']:>15.3f} {s['compute_savings_pct']:>9.1f} {delta:>+12.2f}%"
            )
            floor = 75 if tokens >= 96_000 else 50 if tokens > 10_000 else None
            if floor is not None:
                verdicts.append((tokens, mode, s["compute_savings_pct"] >= floor, floor, 1 - s["tokens_processed_ratio"] >= floor / 100))
            assert result.answer == "7" and abs(delta) < 2, f"{tokens} {mode}: closed form off by {delta:.2f}%"
    for tokens, mode, ok, floor, processed_ok in verdicts:
        print(
            f"   target >= {floor}% at {tokens} ({mode}): attention {'PASS' if ok else 'FAIL'}, tokens processed {'PASS' if processed_ok else 'FAIL'}"
        )
    print("   carryover_size sensitivity, tail mode, 24000 tokens:")
    for carryover_size in (4096, 2048, 1024):
        result = asyncio.run(bounded(SimulatedLLM(), 24_000, carryover_size=carryover_size))
        s = result.metrics.strategy_specific
        print(
            f"     carryover_size {carryover_size:>5}: {s['total_iterations']:>2} iterations, savings {s['compute_savings_pct']:5.1f}%, "
            f"tokens processed ratio {s['tokens_processed_ratio']:.3f}"
        )


def peak_memory(iterations: int) -> int:
    think = 8000 + (iterations - 1) * 3800 + 100_000  # more than the iterations can hold: every iteration runs
    llm = SimulatedLLM()
    asyncio.run(bounded(llm, 2000, max_iterations=2))  # warm caches outside the measurement
    tracemalloc.start()
    asyncio.run(bounded(llm, think, max_iterations=iterations, on_max_iterations="final_answer"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def memory() -> None:
    print("\n2. Memory (peak traced Python memory of one run, events streamed to disk)")
    small, large = peak_memory(5), peak_memory(50)
    growth = (large - small) / small * 100
    print(
        f"   5 iterations: {small / 1024:8.1f} KiB   50 iterations: {large / 1024:8.1f} KiB   growth {growth:+.1f}% "
        f"(target < 5%: {'PASS' if growth < 5 else 'FAIL'})"
    )


def latency(sizes: list[int], ttft_ms: float, tokens_per_second: float) -> None:
    print(f"\n3. Latency (simulator latency model: time to first token {ttft_ms} ms, {tokens_per_second:.0f} tokens/s)")
    for tokens in sizes:
        llm = SimulatedLLM(ttft_ms=ttft_ms, tokens_per_second=tokens_per_second)
        started = time.perf_counter()
        asyncio.run(growing(llm, tokens))
        base = time.perf_counter() - started
        for mode in ("tail", "summary"):
            started = time.perf_counter()
            result = asyncio.run(bounded(llm, tokens, carryover_mode=mode))
            elapsed = time.perf_counter() - started
            s = result.metrics.strategy_specific
            extra_calls = result.metrics.llm_calls - s["total_iterations"]
            print(
                f"   {tokens:>6} tokens {mode:>8}: {elapsed:6.2f} s vs one context {base:6.2f} s -> "
                f"{(elapsed / base - 1) * 100:+5.1f}% ({s['total_iterations']} chunk calls, {extra_calls} summary calls, "
                f"{result.metrics.completion_tokens - s['reasoning_tokens']} summary tokens)"
            )


def thinking(sizes: list[int]) -> None:
    print("\n4. A model that thinks: every chunk is cut inside its thinking until the thinking is done")
    print(
        f"{'thinking':>9} {'chunk/carry':>11} {'mode':>9} {'iters':>5} {'calls':>5} {'tokens':>8} {'prompt':>8} "
        f"{'reached':>8} {'restarts':>8} {'stopped by':>12} {'answer':>6}"
    )
    settings = [(tokens, 8192, 4096) for tokens in sizes] + [(1500, 256, 64)]
    for tokens, chunk, carry in settings:
        for mode in ("delethink", "summary", "tail"):
            llm = ThinkingModel(think=tokens)
            config = {"carryover_mode": mode, "chunk_size": chunk, "carryover_size": carry}
            if chunk < 1024:
                config["head_tokens"] = 16
            result = asyncio.run(bounded(llm, tokens, **config))
            s, m = result.metrics.strategy_specific, result.metrics
            chunks = [c for c in llm.calls if c.request.purpose is None]
            restarts = sum(c.resumed_from == 0 for c in chunks[1:])
            reached = max(c.reached for c in chunks) / tokens * 100
            print(
                f"{tokens:>9} {f'{chunk}/{carry}':>11} {mode:>9} {s['total_iterations']:>5} {m.llm_calls:>5} {m.total_tokens:>8} "
                f"{m.prompt_tokens:>8} {reached:>7.0f}% {restarts:>8} {s['stopped_by']:>12} {result.answer:>6}"
            )
            assert restarts == 0, f"{mode}: {restarts} chunk(s) started over"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller latency run")
    parser.add_argument("--thinking", action="store_true", help="only section 4, the model that thinks")
    args = parser.parse_args()
    thinking([10_000, 24_000, 50_000])
    if args.thinking:
        return
    compute([10_000, 24_000, 50_000, 96_000, 128_000])
    memory()
    # The latency model scaled 1:100 in time: 300 ms to first token and 50 tokens/s become 3 ms and 5,000 tokens/s.
    latency([24_000] if args.quick else [24_000, 50_000], ttft_ms=3.0, tokens_per_second=5000)


if __name__ == "__main__":
    main()
