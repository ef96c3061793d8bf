"""The compute accounting bounded_context reports and bench/bounded_context.py predicts
(docs/strategies/bounded_context.md): figures worked out by hand from the formulas there."""

from __future__ import annotations

from reasonray.strategies.compute_cost import CostLedger, attention_pairs, closed_form_attention


def test_a_context_of_l_tokens_attends_over_l_times_l_plus_one_over_two_pairs():
    assert [attention_pairs(n) for n in (0, 1, 2, 400)] == [0, 1, 3, 80200]


def test_a_run_without_reasoning_chunks_reports_nothing():
    ledger = CostLedger()
    assert ledger.summary() == {}
    ledger.other(200, 20)  # a final-answer call alone is no chunked reasoning to account for
    assert ledger.summary() == {}


def test_two_chunks_and_a_final_answer_against_one_growing_context():
    ledger = CostLedger()
    ledger.chunk(100, 300)  # the first chunk: a 100-token prompt, 300 tokens of reasoning
    ledger.chunk(150, 300)  # the next: a 150-token prompt (frame and carryover), 300 more
    ledger.other(200, 20)  # the final answer
    assert ledger.summary() == {
        "reasoning_tokens": 600,
        # 400·401/2 + 450·451/2 + 220·221/2 = 80,200 + 101,475 + 24,310
        "attention_cost_bounded": 205_985,
        # one context of the first prompt and all the reasoning: 700·701/2
        "attention_cost_baseline": 245_350,
        "attention_cost_ratio": 0.8396,  # 205,985 / 245,350 = 0.83956
        "compute_savings_pct": 16.04,
        "tokens_processed_bounded": 1070,  # 400 + 450 + 220
        "tokens_processed_baseline": 1100,  # (100 + 300) + (100 + 600): each chunk re-reads all before it
        "tokens_processed_ratio": 0.9727,
    }


def test_savings_never_go_negative_when_chunking_costs_more_than_it_saves():
    ledger = CostLedger()
    ledger.chunk(1000, 10)
    ledger.other(5000, 10)
    summary = ledger.summary()
    assert summary["attention_cost_ratio"] > 1 and summary["compute_savings_pct"] == 0.0


def test_reasoning_that_fits_the_first_chunk_costs_what_one_context_costs():
    assert closed_form_attention(100, 1000, 200, 50) == (attention_pairs(300), attention_pairs(300))


def test_tail_mode_carries_the_smaller_of_the_carryover_size_and_the_visible_tail():
    # chunk 1: 400 generated; then prompts of 50 + min(100, 0.5 · previous generation)
    #   500·501/2 + (150 + 350)·501/2 + (150 + 250)·401/2 = 125,250 + 125,250 + 80,200
    assert closed_form_attention(1000, 500, 100, 50, carryover_size=100, visible_fraction=0.5) == (330_700, 605_550)
    # a larger carryover_size: the visible half of the previous chunk (200, 125, 162) is what carries
    #   125,250 + (250 + 250) + (175 + 325) + (212 + 25)·238/2 = 125,250 · 3 + 28,203
    assert closed_form_attention(1000, 500, 100, 50, carryover_size=300, visible_fraction=0.5) == (403_953, 605_550)


def test_summary_mode_carries_a_fixed_carryover_and_pays_for_each_summary_call():
    # prompts of 50 + 80; 400, 370 and 230 generated; two summary calls of 300 context tokens (45,150 each)
    bounded, baseline = closed_form_attention(1000, 500, 100, 50, 80, summary_call=300)
    assert (bounded, baseline) == (125_250 + 125_250 + 45_150 + 64_980 + 45_150, 605_550)


def test_the_closed_form_agrees_with_a_ledger_of_the_same_chunks():
    ledger = CostLedger()
    for prompt, generated in ((100, 400), (150, 350), (150, 250)):  # the tail-mode run above, call by call
        ledger.chunk(prompt, generated)
    bounded, baseline = closed_form_attention(1000, 500, 100, 50, carryover_size=100, visible_fraction=0.5)
    summary = ledger.summary()
    assert (summary["attention_cost_bounded"], summary["attention_cost_baseline"]) == (bounded, baseline)
