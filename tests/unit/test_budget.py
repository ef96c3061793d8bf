"""Token budgets: estimate before each call, head-and-tail truncation with a
warning, capped output, and a cumulative per-request budget that fails clearly."""

from __future__ import annotations

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.gateway.observed import ObservedLLM, Sampling
from reasonray.gateway.protocol import LLMRequest, system, user
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import FunctionLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.config import load_settings
from reasonray.kernel.errors import BudgetExceededError
from reasonray.kernel.events import Budget, RunWarning


def observed(budget: Budget, fn=lambda r: "<answer>ok</answer>", spent: int = 0):
    events: list = []
    llm = FunctionLLM(fn)
    return ObservedLLM(llm, events.append, trace_id="t", strategy="s", budget=budget, spent=spent), llm, events


async def test_a_long_prompt_keeps_its_head_and_tail_and_warns():
    counter = counter_for_model("function")
    observed_llm, llm, events = observed(Budget(max_prompt_tokens=200))
    middle = " ".join(f"filler{i}" for i in range(2000))
    await observed_llm.complete(LLMRequest(messages=(system("Be brief."), user(f"HEAD-MARK {middle} TAIL-MARK"))))
    sent = llm.requests[0].messages[1].content
    assert sent.startswith("HEAD-MARK") and sent.endswith("TAIL-MARK") and "tokens omitted" in sent
    assert llm.requests[0].messages[0].content == "Be brief."
    from reasonray.gateway.tokens import count_messages

    assert count_messages(counter, llm.requests[0].messages) <= 200
    [warning] = [e for e in events if isinstance(e, RunWarning)]
    assert warning.code == "prompt_truncated" and "head and tail kept" in warning.message


async def test_output_is_capped_and_the_total_budget_is_never_overspent():
    observed_llm, llm, _ = observed(Budget(max_output_tokens=50, max_total_tokens=400))
    await observed_llm.complete(LLMRequest(messages=(user("hello"),), max_tokens=4096))
    assert llm.requests[0].max_tokens == 50
    observed_llm.tally.prompt_tokens += 340  # as if earlier calls had spent most of the budget
    await observed_llm.complete(LLMRequest(messages=(user("hello"),)))
    assert llm.requests[1].max_tokens < 50  # what is left of the total, not the per-call cap
    observed_llm.tally.prompt_tokens += 100
    with pytest.raises(BudgetExceededError, match=r"budget.max_total_tokens") as info:
        await observed_llm.complete(LLMRequest(messages=(user("hello"),)))
    assert info.value.data["max_total_tokens"] == 400 and len(llm.requests) == 2  # the third call was never made


def test_branches_share_what_is_left_of_the_total():
    observed_llm, _, _ = observed(Budget(max_total_tokens=1000), spent=400)
    options = observed_llm.branch_options(3)
    assert options["spent"] == 1000 - 600 // 3  # each of 3 branches may spend 200
    assert Budget(max_total_tokens=100).tightest(Budget(max_total_tokens=50, max_output_tokens=9)) == Budget(
        max_output_tokens=9, max_total_tokens=50
    )


async def test_a_request_budget_that_runs_out_is_a_32004_error():
    settings = load_settings()
    rpc = local_dispatcher(settings.reasoning, SimulatedLLM())
    call = {
        "jsonrpc": "2.0",
        "method": "reasoning.execute",
        "id": 1,
        "params": {"query": "What is 2+2?", "strategy": "refine", "budget": {"max_total_tokens": 120}},
    }
    payload, _ = await rpc.handle_payload(call, None)
    assert payload["error"]["code"] == -32004 and "max_total_tokens" in payload["error"]["message"]
    ok = {**call, "params": {**call["params"], "budget": {"max_total_tokens": 5000, "max_output_tokens": 100}}}
    payload, _ = await rpc.handle_payload(ok, None)
    assert payload["result"]["answer"] == "4" and payload["result"]["metrics"]["total_tokens"] <= 5000


async def test_a_chunk_the_completion_budget_cut_short_ends_the_run_for_the_budget_not_the_model():
    """Bounded context's chunk capped by what the budget had left adds next to nothing: that is the budget's doing
    (-32004, which /v1 answers as finish_reason "length"), not a model that made no progress (-32010)."""
    rpc = local_dispatcher(load_settings().reasoning, SimulatedLLM())
    params = {"query": "[[sim think=9000 answer=5]] go", "strategy": "bounded_context", "budget": {"max_completion_tokens": 300}}
    payload, _ = await rpc.handle_payload({"jsonrpc": "2.0", "method": "reasoning.execute", "id": 1, "params": params}, None)
    error = payload["error"]
    assert error["code"] == -32004 and "max_completion_tokens" in error["message"], error
    assert error["data"]["partial"]["total_iterations"] >= 1


async def test_the_completion_budget_holds_over_every_call_and_branches_share_what_is_left():
    observed_llm, llm, _ = observed(Budget(max_completion_tokens=100))
    await observed_llm.complete(LLMRequest(messages=(user("hello"),), max_tokens=4096))
    assert llm.requests[0].max_tokens == 100
    observed_llm.tally.completion_tokens += 70  # as if the calls so far had generated 70 tokens
    await observed_llm.complete(LLMRequest(messages=(user("hello"),)))
    generated = observed_llm.tally.completion_tokens
    assert llm.requests[1].max_tokens == 100 - (generated - llm_reply_tokens(llm))
    options = observed_llm.branch_options(2)
    assert options["spent_completion"] == 100 - (100 - generated) // 2  # each of two branches may generate half of what is left
    observed_llm.tally.completion_tokens = 100
    with pytest.raises(BudgetExceededError, match="max_completion_tokens") as info:
        await observed_llm.complete(LLMRequest(messages=(user("hello"),)))
    assert info.value.data == {"max_completion_tokens": 100, "completion_tokens": 100} and len(llm.requests) == 2
    branch = ObservedLLM(llm, [].append, trace_id="t", strategy="s", **observed(Budget(max_completion_tokens=100))[0].branch_options())
    assert "spent_completion" not in observed(Budget())[0].branch_options() and branch.spent_completion == 0


def llm_reply_tokens(llm) -> int:
    """What the last reply of a FunctionLLM counted as completion tokens."""
    return counter_for_model("function").count("<answer>ok</answer>")


async def test_sampling_asked_for_applies_to_every_call_and_the_seed_mixes_with_each_calls_own():
    sampling = Sampling(temperature=1.5, top_p=0.5, presence_penalty=1.0, frequency_penalty=-1.0, seed=7)
    llm = FunctionLLM(lambda r: "<answer>ok</answer>")
    observed_llm = ObservedLLM(llm, [].append, trace_id="t", strategy="s", sampling=sampling)
    await observed_llm.complete(LLMRequest(messages=(user("a"),), temperature=0.0))
    await observed_llm.complete(LLMRequest(messages=(user("a"),), seed=1))
    await observed_llm.complete(LLMRequest(messages=(user("a"),), seed=2))
    first, second, third = llm.requests
    assert (first.temperature, first.top_p, first.presence_penalty, first.frequency_penalty, first.seed) == (1.5, 0.5, 1.0, -1.0, 7)
    assert second.seed != third.seed and second.seed != 1  # branches stay apart, and the caller's seed counts
    assert Sampling().apply(first) is first
    assert observed_llm.branch_options()["sampling"] == sampling
