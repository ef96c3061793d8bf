"""bounded_context through the running service: both carryover modes, the max-iterations way out,
the dedicated `reasoning.bounded_context` method, and the per-run event log on disk."""

from __future__ import annotations

import pytest

from reasonray.kernel.events import read_event_log
from tests.integration.conftest import DATA_DIR, rpc

QUERY = "[[sim think=30000 answer=7]] Work it out."


@pytest.mark.parametrize("mode", ["tail", "summary"])
def test_thirty_thousand_tokens_answer_with_savings_over_half(api, mode):
    params = {"query": QUERY, "strategy": "bounded_context", "strategy_config": {"max_iterations": 10, "carryover_mode": mode}}
    result = rpc(api, "reasoning.execute", params).json()["result"]
    specific = result["metrics"]["strategy_specific"]
    assert result["answer"] == "7" and result["metrics"]["simulated"]
    assert specific["compute_savings_pct"] > 50 and specific["total_iterations"] >= 3
    assert all({"iteration", "tokens", "has_answer"} <= set(i) for i in specific["iterations"])
    assert result["resolution"]["config_sources"]["chunk_size"] == "system"
    assert result["resolution"]["config_sources"]["max_iterations"] == "request"


def test_default_iterations_end_with_max_iterations_and_the_partial_trace(api):
    error = rpc(api, "reasoning.execute", {"query": QUERY, "strategy": "bounded_context"}).json()["error"]
    assert error["code"] == -32001
    assert "within 5 iterations (capacity 24576 tokens)" in error["message"]
    assert len(error["data"]["iterations"]) == 5 and error["data"]["suggested_max_iterations"] == 10


def test_the_seeds_method_and_its_validation(api):
    result = rpc(api, "reasoning.bounded_context", {"query": QUERY, "max_iterations": 10}).json()["result"]
    assert result["answer"] == "7" and result["compute_savings_pct"] > 50
    assert result["total_tokens"] == sum(i["tokens"] for i in result["iterations"])
    bad = rpc(api, "reasoning.bounded_context", {"query": "q", "chunk_size": 4096, "carryover_size": 8192}).json()["error"]
    assert bad["code"] == -32602 and "carryover_size must be less than chunk_size" in bad["message"]
    too_long = rpc(api, "reasoning.bounded_context", {"query": "x" * 100_001}).json()["error"]  # [limits] max_query_chars
    assert too_long["code"] == -32602 and too_long["data"]["cap"] == "limits.max_query_chars" and "the cap is 100000" in too_long["message"]


def test_every_run_writes_its_events_with_full_text_to_the_data_dir(api):
    response = rpc(api, "reasoning.execute", {"query": "[[sim think=9000 answer=5]] go", "strategy": "bounded_context"})
    trace_id = response.json()["result"]["trace_id"]
    [path] = DATA_DIR.glob(f"events/*/{trace_id}.jsonl")
    events = read_event_log(path)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "LLM_INVOCATION" and kinds[-1] == "RUN_END" and "CARRYOVER" in kinds
    assert "<thinking>scratch" in events[0]["responses"][0]
    assert {e["trace_id"] for e in events} == {trace_id}
