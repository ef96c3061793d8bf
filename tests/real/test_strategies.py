"""Every strategy against the real model over HTTP: each run ends with an answer or a classified error, its
counts are the server's, nothing degenerate is preferred to a real attempt, tool calls are well-formed."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from reasonray.client import ReasonRayError
from tests.real.conftest import Outcome, assert_classified, assert_counts_match, execute, measured

QUESTION = "What is 5 + 12?"

# Modest configs: a 135M model on 2 shared cores decodes 40-90 tokens/s, one request at a time.
CONFIGS: dict[str, dict[str, Any]] = {
    "chain_of_thought": {"max_tokens": 128},
    "bounded_context": {"chunk_size": 1024, "carryover_size": 512, "max_iterations": 3, "on_max_iterations": "final_answer"},
    "tree_of_thought": {"breadth": 2, "depth": 2, "beam_width": 1, "max_tokens": 96, "max_nodes": 6},
    "self_consistency": {"samples": 3, "max_tokens": 96},
    "react": {"max_tool_calls": 3, "max_tokens": 128, "tools": ["calculator"]},
    "refine": {"max_iterations": 2, "max_tokens": 128, "evaluate_max_tokens": 64},
    "matts": {"k": 2, "base_config": {"max_tokens": 96}, "judge_max_tokens": 64},
}


def invocations(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in result.get("trace") or [] if e.get("type") == "LLM_INVOCATION"]


def check_run(out: Outcome) -> dict[str, Any] | None:
    """An answer with the server's counts, or a classified error; the result when there is one."""
    if out.error is not None:
        assert_classified(out.error)
        return None
    result = out.result
    assert result is not None
    assert isinstance(result["answer"], str) and result["answer"].strip(), result
    assert result["metrics"]["simulated"] is False and result["metrics"]["model"] == "smollm2"
    assert_counts_match(result["metrics"], out.calls)
    # call by call: each LLM_INVOCATION event carries the tokens the server reported for that call
    ours = sorted((e["prompt_tokens"], e["completion_tokens"]) for e in invocations(result))
    server = sorted((c.usage["prompt_tokens"], c.usage["completion_tokens"]) for c in out.calls if c.usage)
    assert ours == server
    return result


@pytest.mark.parametrize("strategy", list(CONFIGS))
def test_every_strategy_ends_classified_with_the_servers_counts(client, recorder, strategy):
    out = execute(client, recorder, QUESTION, strategy=strategy, strategy_config=CONFIGS[strategy])
    assert out.calls, "the run made no call to the model"
    check_run(out)


def test_self_consistency_votes_over_what_the_chains_say(client, recorder):
    """Every chain of a small sum states numbers, tags or none: the vote has answers to count."""
    out = execute(client, recorder, QUESTION, strategy="self_consistency", strategy_config=CONFIGS["self_consistency"])
    texts = [c.content for c in out.calls]
    assert any(any(ch.isdigit() for ch in t) for t in texts), texts
    assert out.error is None, f"{out.error} although the chains said: {texts}"
    check_run(out)


def test_tree_of_thought_searches_from_what_the_proposals_hold(client, recorder):
    out = execute(client, recorder, QUESTION, strategy="tree_of_thought", strategy_config=CONFIGS["tree_of_thought"])
    result = check_run(out)
    assert result is not None, out.error
    assert result["metrics"]["strategy_specific"]["nodes_evaluated"] > 0, result["metrics"]["strategy_specific"]


def _unscored(result: dict[str, Any]) -> set[int]:
    """Iterations (1-based) whose evaluation gave no score, as the run's warnings say."""
    found = set()
    for event in result.get("trace") or []:
        if event.get("code") == "unscored":
            digits = "".join(ch if ch.isdigit() else " " for ch in event.get("message", "")).split()
            found.update(int(d) for d in digits[:1])
    return found


def test_refine_never_prefers_an_unscored_attempt(client, recorder):
    """An evaluation without a score is no evidence: it is reported as unscored, never as 0.0, never beats a
    scored attempt, and among attempts that are all unscored the first one, the model's own answer to the
    question, is the one returned."""
    out = execute(client, recorder, QUESTION, strategy="refine", strategy_config=CONFIGS["refine"])
    result = check_run(out)
    assert result is not None, out.error
    specific = result["metrics"]["strategy_specific"]
    history = specific["history"]
    unscored = _unscored(result)
    for attempt in history:
        if attempt["iteration"] in unscored:
            assert attempt["score"] is None, f"iteration {attempt['iteration']} was not scored but reports {attempt['score']}"
    best = next(a for a in history if a["iteration"] == specific["best_iteration"])
    scored = [a for a in history if a["score"] is not None and a["iteration"] not in unscored]
    if scored:
        assert best in scored and best["score"] == max(a["score"] for a in scored), history
    else:
        assert best["iteration"] == 1, history
    assert result["answer"] == best["answer"]


def test_matts_never_prefers_an_unscored_attempt(client, recorder):
    out = execute(client, recorder, QUESTION, strategy="matts", strategy_config=CONFIGS["matts"])
    result = check_run(out)
    assert result is not None, out.error
    specific = result["metrics"]["strategy_specific"]
    scores, chosen = specific["scores"], specific["selected"]
    judged = [c for c in out.calls if c.purpose and "judge" in c.purpose]
    # a judge that gave no <score> is unscored (None), not 0.0
    for score in scores:
        assert score is None or 0.0 <= score <= 1.0
    if judged and all("<score>" not in c.content for c in judged):
        assert all(s is None for s in scores), (scores, [c.content for c in judged])
    if scores[chosen] is None:
        # nothing was scored: an attempt with a stated answer before one without, then the answer more attempts
        # share (strategies/matts.py `pick`); never an empty answer over a stated one
        answers = specific["answers"]
        assert all(s is None for s in scores), (scores, chosen)
        assert answers[chosen].strip() or not any(a.strip() for a in answers), (answers, chosen)
    else:
        assert scores[chosen] == max(s for s in scores if s is not None)


def test_bounded_context_chunks_stay_within_chunk_size_by_the_servers_count(client, recorder):
    config = {"chunk_size": 1024, "carryover_size": 512, "max_iterations": 3, "on_max_iterations": "final_answer"}
    out = execute(
        client,
        recorder,
        "Explain step by step, in detail, how to add 487 and 658 by hand, then give the sum.",
        strategy="bounded_context",
        strategy_config=config,
    )
    check_run(out)
    sizes = [c.usage["prompt_tokens"] + c.usage["completion_tokens"] for c in out.calls if c.usage]
    assert sizes and max(sizes) <= config["chunk_size"], f"chunks by the server's count: {sizes}"
    if out.result is not None:
        for event in out.result["trace"]:
            if event.get("type") == "ITERATION_END":
                assert event["prompt_tokens"] + event["completion_tokens"] <= config["chunk_size"], event


def test_react_tool_calls_are_well_formed_when_made(client, recorder):
    """Whatever tool calls the model writes, ReasonRay runs only offered tools, and never one whose
    arguments are not a JSON object."""
    out = execute(client, recorder, "Use the calculator to compute 123 * 45.", strategy="react", strategy_config=CONFIGS["react"])
    check_run(out)
    offered = {t["function"]["name"] for c in out.calls for t in c.request.get("tools") or []}
    executed = [e for e in (out.result or {}).get("trace") or [] if e.get("type") == "TOOL_EXECUTED"]
    for event in executed:
        assert event["tool"] in offered, (event, offered)
    malformed = {t.get("id") for c in out.calls for t in c.tool_calls if not _json_object((t.get("function") or {}).get("arguments"))}
    ran_ok = {e["tool_call_id"] for e in executed if e["status"] == "ok"}
    assert not (malformed & ran_ok), f"tool calls with malformed arguments ran: {malformed & ran_ok}"


def _json_object(text: str | None) -> bool:
    try:
        return isinstance(json.loads(text or ""), dict)
    except json.JSONDecodeError:
        return False


def test_concurrent_runs_on_a_one_slot_server_all_end_classified_and_counted(client, recorder):
    """Four runs at once against a server that runs one request at a time: each ends with an answer or a
    classified error, and the calls they made are the calls the server answered."""

    def one(i: int) -> tuple[dict[str, Any] | None, ReasonRayError | None]:
        try:
            return client.execute(f"What is {i + 2} + {i + 3}?", strategy="chain_of_thought", strategy_config={"max_tokens": 96}), None
        except ReasonRayError as exc:
            return None, exc

    def all_four() -> list[tuple[dict[str, Any] | None, ReasonRayError | None]]:
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(one, range(4)))

    outcomes, _, calls = measured(recorder, all_four)
    assert outcomes is not None
    for result, error in outcomes:
        if error is not None:
            assert_classified(error)
        else:
            assert result is not None and result["answer"].strip()
    answered = [r for r, _ in outcomes if r is not None]
    assert sum(r["metrics"]["llm_calls"] for r in answered) <= len(calls)
    if len(answered) == 4:
        assert sum(r["metrics"]["completion_tokens"] for r in answered) == sum(c.usage["completion_tokens"] for c in calls if c.usage)


def test_a_run_that_overran_does_not_starve_the_next_one(client, recorder):
    """Five long samples sent at once to a one-slot server outlast one request timeout when timed from the
    moment they were queued; the run ends classified either way, and the next small request, sent as soon
    as it ends, is answered within its own timeout, not sunk by generations nobody waits for any more."""

    def both() -> dict[str, Any]:
        try:
            client.execute(QUESTION, strategy="self_consistency", strategy_config={"samples": 5, "max_tokens": 512})
        except ReasonRayError as exc:
            assert_classified(exc)
        return client.execute("What is 2 + 2?", strategy="chain_of_thought", strategy_config={"max_tokens": 32})

    after, error, _ = measured(recorder, both)
    assert error is None, f"the request after the long run failed: {error} {error.data if error else ''}"
    assert after is not None and after["answer"].strip()
