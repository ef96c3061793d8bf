"""Every strategy x every failure kind: the code and error_type, the partial result's shape, the strategy
in the metrics, and no internal URL in the answer. The model is a strict FunctionLLM that
answers `k` calls and then fails the way the kind says, behind the real retries and breaker: a provider
error, a hang past the deadline, a cancellation, a reply the strategy cannot use (invalid output) or a
tool call that fails (react, the strategy with tools)."""

from __future__ import annotations

import asyncio
import json

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.gateway.errors import TransientProviderError
from reasonray.gateway.protocol import Completion, LLMRequest, ToolCall, Usage
from reasonray.gateway.resilience import CircuitBreaker, ResilientLLM, RetryPolicy
from reasonray.gateway.testing import FunctionLLM, ScriptedLLM, make_completion
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.config import ReasoningSettings
from tests.unit.recording_metrics import RecordingMetrics

ENDPOINT = "http://10.9.8.7:4321/v1/"
REPLY = "<thinking>6 times 7</thinking><answer>42</answer><score>0.6</score><feedback>check the units</feedback>"
COMMON = {"tokens", "prompt_tokens", "completion_tokens", "calls"}

# strategy -> (strategy_config, successful calls before the fault, partial keys beyond COMMON)
STRATEGIES = {
    "chain_of_thought": ({}, 0, set()),
    "self_consistency": ({"samples": 3}, 1, {"samples", "samples_finished", "samples_failed", "answers", "votes", "answer"}),
    "tree_of_thought": ({"breadth": 1, "depth": 3}, 2, {"nodes_evaluated", "best_path", "best_steps", "best_score", "answer"}),
    "refine": (
        {"max_iterations": 3, "threshold": 0.95},
        2,
        {"iterations", "last_draft", "last_answer", "last_score", "last_critique", "answer"},
    ),
    "matts": ({"k": 2, "mode": "parallel", "base_strategy": "chain_of_thought"}, 1, {"k", "branches_finished", "answers", "answer"}),
    "react": ({"tools": ["calculator"]}, 1, {"steps", "observations"}),
    "bounded_context": (
        {"chunk_size": 2048, "carryover_size": 512, "max_iterations": 4},
        1,
        {"iterations", "total_iterations", "last_carryover"},
    ),
}
# fault kind -> (code, error_types accepted)
KINDS = {
    "provider_500": (-32013, {"provider_unavailable"}),
    "429_storm": (-32013, {"provider_unavailable", "circuit_open"}),
    "provider_timeout": (-32013, {"provider_unavailable"}),
    "budget": (-32004, {"budget_exceeded"}),
    "deadline": (-32015, {"deadline_exceeded"}),
    "cancelled": (-32014, {"cancelled"}),
    "invalid_output": (-32010, {"model_behavior"}),
    "tool_failed": (-32006, {"tool_failed"}),
}
ONLY = {"tool_failed": {"react"}}  # the kinds that apply to some strategies only
CASES = [(s, k) for k in KINDS for s in STRATEGIES if s in ONLY.get(k, STRATEGIES)]
# invalid output: the good calls before the replies turn unusable, where it differs from STRATEGIES' k (a
# self-consistency majority or a refine draft would still answer); bounded context needs an answer only
# from its final-answer call
INVALID = {"chain_of_thought": 0, "self_consistency": 0, "tree_of_thought": 0, "refine": 0, "matts": 0}
# a provider's failure costs a fan-out's branch (a refine iteration) its vote, not the run: these fail only when
# every branch fails, so their provider faults start at the first call (test_a_failed_branch_costs_its_vote_not_the_run)
SURVIVE_PROVIDER = {"self_consistency", "refine", "matts"}
PROVIDER_KINDS = {"provider_500", "429_storm", "provider_timeout"}
INVALID_CONFIG = {"bounded_context": {"on_max_iterations": "final_answer"}}
UNUSABLE = "<thinking>I am not sure where to start.</thinking>"  # no answer, step, score or visible text


def good_reply(strategy: str, request: LLMRequest, call: int) -> str | ToolCall:
    system = request.messages[0].content or ""
    if strategy == "tree_of_thought" and "next step" in system:
        return "<step>multiply 6 by 7</step>"
    if strategy == "react":
        return ToolCall(id="c1", name="calculator", arguments=json.dumps({"expression": "6*7"}))
    if strategy == "bounded_context":
        return "<thinking>still working on it</thinking>"
    return REPLY


class Faulty(FunctionLLM):
    """Answers `k` calls, then fails every attempt as `kind` says."""

    def __init__(self, strategy: str, k: int, kind: str) -> None:
        super().__init__(self._reply, model="scripted")
        self.strategy, self.k, self.kind, self.good = strategy, k, kind, 0
        self.counter = counter_for_model("scripted")

    async def complete(self, request: LLMRequest) -> Completion:
        if self.good >= self.k and self.kind == "deadline":
            await asyncio.Event().wait()  # a provider that never answers
        return await super().complete(request)

    def _reply(self, request: LLMRequest):
        if self.good < self.k:
            self.good += 1
            reply = good_reply(self.strategy, request, self.good)
            if self.kind == "budget" and self.good == self.k:  # this reply spends the rest of the budget
                done = make_completion(request, reply, model=self.model, counter=self.counter)
                return Completion(choices=done.choices, usage=Usage(done.usage.prompt_tokens, 1_000_000), model=self.model)
            return reply
        match self.kind:
            case "provider_500":
                return TransientProviderError(f"HTTP 500 from {ENDPOINT}: upstream exploded", status_code=500)
            case "429_storm":
                return TransientProviderError(f"HTTP 429 from {ENDPOINT}: slow down", status_code=429, retry_after_s=0.0)
            case "provider_timeout":
                return TransientProviderError(f"APITimeoutError: Request timed out. ({ENDPOINT})")
            case "cancelled":
                return asyncio.CancelledError()  # as a cancelled Ray branch or provider call surfaces
            case "invalid_output":
                return UNUSABLE
            case "tool_failed":
                return ToolCall(id=f"c{self.good + 1}", name="calculator", arguments=json.dumps({"expression": "1 / 0"}))
        raise AssertionError(f"call {self.good + 1} was not expected for {self.kind}")


async def no_sleep(_: float) -> None:
    pass


def rpc_for(strategy: str, k: int, kind: str, metrics: RecordingMetrics, *, degraded: bool = False):
    inner = Faulty(strategy, k, kind)
    breaker = CircuitBreaker()  # rate-based: a 429 storm is retried, never counted; 500s alone stay under its minimum calls
    llm = ResilientLLM(inner, RetryPolicy(max_attempts=3), breaker, endpoint=ENDPOINT, sleep=no_sleep)
    reasoning = ReasoningSettings(enabled_strategies=list(STRATEGIES), default_strategy="chain_of_thought")
    return local_dispatcher(reasoning, llm, metrics=metrics, degraded_answers=degraded)


def good_calls(strategy: str, kind: str) -> int:
    _, k, _ = STRATEGIES[strategy]
    if kind in PROVIDER_KINDS and strategy in SURVIVE_PROVIDER:
        return 0
    return INVALID.get(strategy, k) if kind == "invalid_output" else k


def params(strategy: str, kind: str) -> dict:
    config, k, _ = STRATEGIES[strategy]
    if kind == "invalid_output":
        config = {**config, **INVALID_CONFIG.get(strategy, {})}
    p = {"query": "What is 6 * 7?", "strategy": strategy, "strategy_config": config}
    if kind == "budget":
        p["budget"] = {"max_total_tokens": 10 if k == 0 else 500_000}
    if kind == "deadline":
        p["budget"] = {"deadline_s": 0.3}
    return p


async def execute(rpc, p: dict) -> dict:
    response, _ = await rpc.handle_payload({"jsonrpc": "2.0", "id": 1, "method": "reasoning.execute", "params": p})
    return response


@pytest.mark.parametrize(("strategy", "kind"), CASES)
async def test_every_strategy_fails_classified_with_its_partial_and_its_strategy_tag(strategy, kind):
    metrics = RecordingMetrics()
    _, _, keys = STRATEGIES[strategy]
    k = good_calls(strategy, kind)
    response = await execute(rpc_for(strategy, k, kind, metrics), params(strategy, kind))
    error = response["error"]
    code, error_types = KINDS[kind]
    assert error["code"] == code and error["data"]["error_type"] in error_types, error
    assert error["data"]["strategy"] == strategy and error["data"]["trace_id"]
    partial = error["data"]["partial"]
    assert COMMON | keys <= set(partial), sorted(partial)
    assert partial["calls"] >= k
    assert "10.9.8.7" not in json.dumps(response) and "upstream exploded" not in json.dumps(response)
    status = error["data"]["error_type"]
    assert metrics.values("reasonray_runs", strategy=strategy, status=status) == [1]
    assert metrics.values("reasonray_requests", method="reasoning.execute", strategy=strategy, status=status) == [1]
    assert metrics.values("reasonray_run_llm_calls", strategy=strategy, agent="none") == [partial["calls"]]


async def test_partial_results_hold_what_each_strategy_achieved():
    """The documented shapes, with values: what finished before the provider failed (the strategies that lose only
    the failed branch: before the caller's budget ran out)."""
    partials = {}
    for strategy, (_, k, _) in STRATEGIES.items():
        kind = "budget" if strategy in SURVIVE_PROVIDER else "provider_500"
        response = await execute(rpc_for(strategy, k, kind, RecordingMetrics()), params(strategy, kind))
        partials[strategy] = response["error"]["data"]["partial"]
        if kind == "provider_500":
            assert response["error"]["message"] == "the model provider failed after 3 attempt(s) (HTTP 500); retry later"
    sc = partials["self_consistency"]
    assert (sc["samples_finished"], sc["samples_failed"], sc["votes"], sc["answer"]) == (1, 0, {"42": 1}, "42")
    tot = partials["tree_of_thought"]
    assert (tot["best_steps"], tot["best_score"], tot["best_path"], tot["answer"]) == (["multiply 6 by 7"], 0.6, ["0.0"], None)
    refine = partials["refine"]
    assert (refine["iterations"], refine["last_answer"], refine["last_score"], refine["last_critique"]) == (1, "42", 0.6, "check the units")
    assert (partials["matts"]["branches_finished"], partials["matts"]["answers"]) == (1, ["42"])
    react = partials["react"]
    assert react["steps"] == 1 and react["observations"][0]["tool"] == "calculator" and "42" in react["observations"][0]["observation"]
    assert partials["bounded_context"]["total_iterations"] == 1
    assert partials["chain_of_thought"]["calls"] == 1  # its one call failed on every attempt, but it was made and paid for


async def test_unusable_output_and_a_failed_tool_keep_what_came_before():
    """Invalid output is -32010 with what was done before it; react's failed tool is -32006 with its observation."""

    async def partial_of(strategy: str, kind: str) -> dict:
        rpc = rpc_for(strategy, good_calls(strategy, kind), kind, RecordingMetrics())
        return (await execute(rpc, params(strategy, kind)))["error"]["data"]["partial"]

    sc = await partial_of("self_consistency", "invalid_output")
    assert (sc["samples_finished"], sc["answers"], sc["votes"], sc["answer"]) == (3, [None, None, None], {}, None)
    refine = await partial_of("refine", "invalid_output")
    assert (refine["iterations"], refine["last_answer"], refine["answer"]) == (1, "", "")
    matts = await partial_of("matts", "invalid_output")
    assert (matts["branches_finished"], matts["branches_failed"], matts["answers"]) == (0, 2, [])
    bounded = await partial_of("bounded_context", "invalid_output")
    assert bounded["total_iterations"] == 4
    react = await partial_of("react", "tool_failed")
    assert [(o["tool"], o["status"]) for o in react["observations"]] == [("calculator", "ok"), ("calculator", "failed")]
    assert "division by zero" in react["observations"][1]["observation"] and react["steps"] == 2


@pytest.mark.parametrize("kind", ["deadline", "cancelled"])
@pytest.mark.parametrize("strategy", ["self_consistency", "matts"])
async def test_a_fan_out_stopped_by_its_deadline_or_a_cancellation_keeps_the_branches_that_finished(strategy, kind):
    """One sample (branch) answers, the others hang (deadline) or are cancelled: the finished one and its vote stay."""
    _, k, _ = STRATEGIES[strategy]
    response = await execute(rpc_for(strategy, k, kind, RecordingMetrics()), params(strategy, kind))
    partial = response["error"]["data"]["partial"]
    assert partial["calls"] == 1 and partial["tokens"] > 0 and partial["answer"] == "42"
    if strategy == "self_consistency":
        assert (partial["samples"], partial["samples_finished"], partial["samples_failed"]) == (3, 1, 0)
        assert (partial["answers"], partial["votes"]) == (["42"], {"42": 1})
    else:
        assert (partial["k"], partial["branches_finished"], partial["answers"]) == (2, 1, ["42"])


@pytest.mark.parametrize("strategy", ["self_consistency", "matts"])
async def test_a_deadline_with_degraded_answers_returns_the_majority_of_the_finished_samples(strategy):
    _, k, _ = STRATEGIES[strategy]
    response = await execute(rpc_for(strategy, k, "deadline", RecordingMetrics(), degraded=True), params(strategy, "deadline"))
    result = response["result"]
    assert (result["answer"], result["degraded"], result["degraded_error"]["error_type"]) == ("42", True, "deadline_exceeded")


@pytest.mark.parametrize("strategy", ["self_consistency", "refine", "matts"])
async def test_degraded_answers_return_what_a_failed_run_can_still_answer(strategy):
    metrics = RecordingMetrics()
    _, k, _ = STRATEGIES[strategy]
    response = await execute(rpc_for(strategy, k, "budget", metrics, degraded=True), params(strategy, "budget"))
    result = response["result"]
    assert result["answer"] == "42" and result["degraded"] is True and result["strategy_used"] == strategy
    assert result["degraded_error"]["code"] == -32004 and result["degraded_error"]["partial"]["answer"] == "42"
    assert metrics.values("reasonray_runs", strategy=strategy, status="degraded") == [1]


@pytest.mark.parametrize("kind", sorted(PROVIDER_KINDS))
@pytest.mark.parametrize("strategy", sorted(SURVIVE_PROVIDER))
async def test_a_failed_branch_costs_its_vote_not_the_run(strategy, kind):
    """The provider fails after the first call for good: self-consistency votes with the one sample that finished,
    MaTTS chooses from its one attempt, refine answers with its evaluated first draft; each says what failed."""
    _, k, _ = STRATEGIES[strategy]
    metrics = RecordingMetrics()
    response = await execute(rpc_for(strategy, k, kind, metrics), params(strategy, kind))
    result = response["result"]
    specific = result["metrics"]["strategy_specific"]
    assert result["answer"] == "42" and not result.get("degraded")
    assert set(specific["failures"]) <= {"provider_unavailable", "circuit_open"} and specific["failures"]
    if strategy == "self_consistency":
        assert (specific["samples_finished"], specific["samples_failed"]) == (1, 2)
    elif strategy == "matts":
        assert (specific["branches_finished"], specific["branches_failed"]) == (1, 1)
    else:
        assert (specific["iterations"], specific["stop_reason"]) == (1, "failed")
    assert metrics.values("reasonray_runs", strategy=strategy, status="ok") == [1]


async def test_tree_of_thought_answers_degraded_with_the_best_answer_it_kept():
    """Level 1 keeps a step (0.9) and an answer (0.7); level 2 fails: the kept answer is returned, degraded."""
    fault = TransientProviderError(f"HTTP 500 from {ENDPOINT}", status_code=500)
    llm = ScriptedLLM(["<step>multiply 6 by 7</step>", "<answer>42</answer>", "<score>0.9</score>", "<score>0.7</score>", *[fault] * 6])
    reasoning = ReasoningSettings(enabled_strategies=["tree_of_thought"], default_strategy="tree_of_thought")
    resilient = ResilientLLM(llm, RetryPolicy(max_attempts=3), CircuitBreaker(1000), endpoint=ENDPOINT, sleep=no_sleep)
    rpc = local_dispatcher(reasoning, resilient, degraded_answers=True)
    response = await execute(rpc, {"query": "q", "strategy_config": {"breadth": 2, "depth": 3}})
    llm.assert_complete()
    result = response["result"]
    assert (result["answer"], result["degraded"], result["degraded_error"]["error_type"]) == ("42", True, "provider_unavailable")
    assert result["degraded_error"]["partial"]["best_steps"] == ["multiply 6 by 7"]


async def test_without_an_answer_so_far_the_error_stands_even_with_degraded_answers():
    response = await execute(rpc_for("react", 1, "provider_500", RecordingMetrics(), degraded=True), params("react", "provider_500"))
    assert response["error"]["code"] == -32013
