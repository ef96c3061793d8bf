"""Self-consistency: sampled chains with distinct seeds, majority vote on normalised answers."""

import pytest

from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import FunctionLLM
from reasonray.kernel.errors import ModelBehaviorError
from reasonray.strategies.self_consistency import SelfConsistency
from tests.unit.strategy_harness import context_for


def by_seed(replies):
    return FunctionLLM(lambda req: replies[req.seed])


async def run(llm, **config):
    ctx, recorder = context_for(llm, strategy="self_consistency")
    return await SelfConsistency().reason("How much?", context=ctx, config=config), recorder


async def test_majority_over_normalised_answers_with_agreement():
    llm = by_seed(
        {
            3: "<thinking>a</thinking><answer>$1,200.00</answer>",
            4: "<answer>1100</answer>",
            5: "<answer>1200</answer>",
            6: "no tags at all",
            7: "<answer>1100</answer>",
            8: "<answer>1200.</answer>",
        }
    )
    result, recorder = await run(llm, samples=6, seed=3, temperature=0.9)
    assert sorted(r.seed for r in llm.requests) == [3, 4, 5, 6, 7, 8]
    assert all(r.temperature == 0.9 for r in llm.requests)
    assert result.answer == "$1,200.00"  # the winner as its first chain wrote it
    specific = result.metrics.strategy_specific
    assert specific["votes"] == {"1200": 3, "1100": 2}
    assert specific["agreement"] == 0.5 and specific["answered"] == 5
    assert specific["answers"] == ["1200", "1100", "1200", None, "1100", "1200"]
    assert result.metrics.llm_calls == 6 and len(recorder.events) == 6


async def test_ties_go_to_the_answer_reached_first():
    result, _ = await run(by_seed({0: "<answer>b</answer>", 1: "<answer>a</answer>"}), samples=2)
    assert result.answer == "b"


async def test_no_answer_in_any_chain_is_a_model_behaviour_error():
    with pytest.raises(ModelBehaviorError, match="none of the 3 sampled chains gave an answer"):
        await run(FunctionLLM(lambda req: "<thinking>thinking out loud</thinking>"), samples=3)


async def test_untagged_chains_vote_with_the_answers_they_state():
    # replies of the kinds SmolLM2-135M gives: no <answer> anywhere, the answer in prose or as a last number
    llm = by_seed(
        {
            0: "17 * 23 = 391\nThe answer is correct.",
            1: "Let me compute. The answer is: 391.",
            2: "17 * 23 = 380",
            3: "Answer: 391",
            4: "I think it is a big number.",
        }
    )
    ctx, _ = context_for(llm, strategy="self_consistency")
    result = await SelfConsistency().reason("What is 17 * 23?", context=ctx, config={"samples": 5})
    specific = result.metrics.strategy_specific
    assert result.answer == "391" and specific["votes"] == {"391": 3, "380": 1}
    assert specific["answers"] == ["391", "391", "380", "391", None]  # the prose-only chain does not vote
    assert specific["found_by"] == {"final_number": 2, "phrase": 2, "whole_text": 1}
    assert specific["agreement"] == 0.6


async def test_when_no_chain_states_an_answer_the_whole_replies_vote():
    replies = {0: "Paris, of course.", 1: "It is Lyon.", 2: "paris, of course"}
    ctx, _ = context_for(by_seed(replies), strategy="self_consistency")
    result = await SelfConsistency().reason("Which city is the capital of France?", context=ctx, config={"samples": 3})
    assert result.answer == "Paris, of course." and result.metrics.strategy_specific["agreement"] == round(2 / 3, 4)
    assert result.metrics.strategy_specific["found_by"] == {"whole_text": 3}


async def test_temperature_zero_is_refused_because_every_chain_would_agree():
    from reasonray.kernel.errors import InvalidParamsError

    with pytest.raises(InvalidParamsError, match="temperature: Input should be greater than 0"):
        await run(by_seed({}), temperature=0)


async def test_on_the_simulator_the_vote_recovers_from_slips():
    ctx, _ = context_for(SimulatedLLM(), strategy="self_consistency")
    clean = await SelfConsistency().reason("What is 17 * 23?", context=ctx, config={"samples": 9})
    assert clean.answer == "391" and clean.metrics.strategy_specific["agreement"] == 1.0  # no slips asked for
    ctx, _ = context_for(SimulatedLLM(), strategy="self_consistency")
    noisy = await SelfConsistency().reason("What is 17 * 23? [[sim slip=0.3]]", context=ctx, config={"samples": 9})
    assert noisy.answer == "391"
    assert 0.5 < noisy.metrics.strategy_specific["agreement"] < 1.0
