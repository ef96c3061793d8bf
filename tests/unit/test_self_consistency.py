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


# --- a failing chain costs its vote; adaptive consistency; DeepConf confidence ---


def failing(replies, errors):
    """Replies by seed; the seeds in `errors` raise theirs."""
    return FunctionLLM(lambda req: errors[req.seed] if req.seed in errors else replies[req.seed])


def provider_down():
    from reasonray.gateway.errors import ProviderUnavailableError

    return ProviderUnavailableError("the model provider failed after 3 attempt(s) (HTTP 500); retry later", attempts=3)


async def test_a_chain_that_fails_costs_its_vote_not_the_run():
    replies = {0: "<answer>42</answer>", 1: "<answer>41</answer>", 2: "<answer>42</answer>", 4: "<answer>41</answer>"}
    result, _ = await run(failing(replies, {3: provider_down()}), samples=5)
    specific = result.metrics.strategy_specific
    assert result.answer == "42" and specific["votes"] == {"42": 2, "41": 2}
    assert (specific["samples_finished"], specific["samples_failed"], specific["samples_used"]) == (4, 1, 5)
    assert specific["failures"] == {"provider_unavailable": 1}
    assert specific["answers"] == ["42", "41", "42", "41"] and specific["agreement"] == 0.5  # the winner's share of those that finished


async def test_when_every_chain_fails_the_run_fails_with_the_first_error_and_keeps_its_partial():
    from reasonray.gateway.errors import ProviderUnavailableError

    llm = failing({}, {seed: provider_down() for seed in range(3)})
    ctx, _ = context_for(llm, strategy="self_consistency")
    with pytest.raises(ProviderUnavailableError, match="HTTP 500"):
        await SelfConsistency().reason("How much?", context=ctx, config={"samples": 3})
    assert (ctx.progress["samples_finished"], ctx.progress["samples_failed"], ctx.progress["answer"]) == (0, 3, None)


@pytest.mark.parametrize("error", ["budget", "deadline", "cancelled", "bug"])
async def test_the_budget_the_deadline_a_cancellation_or_a_bug_in_any_chain_fails_the_run_at_once(error):
    from reasonray.gateway.testing import UnexpectedCall
    from reasonray.kernel.errors import BudgetExceededError, DeadlineExceededError, RunCancelledError

    raised = {
        "budget": BudgetExceededError("the request's token budget is spent"),
        "deadline": DeadlineExceededError("the run passed its deadline"),
        "cancelled": RunCancelledError("a Ray task of the run was cancelled"),
        "bug": UnexpectedCall("call 3 was not scripted"),
    }[error]
    replies = dict.fromkeys(range(5), "<answer>42</answer>")
    with pytest.raises(type(raised)):
        await run(failing(replies, {2: raised}), samples=5)


async def test_adaptive_stops_once_no_further_chain_can_change_the_vote():
    llm = by_seed(dict.fromkeys(range(5), "<answer>42</answer>"))
    result, _ = await run(llm, samples=5, adaptive=True)
    specific = result.metrics.strategy_specific
    assert sorted(r.seed for r in llm.requests) == [0, 1, 2]  # 3 of 5 agreeing: the other 2 cannot outvote them
    assert (specific["samples_used"], specific["stop_reason"], specific["agreement"]) == (3, "vote_decided", 1.0)
    fixed, _ = await run(by_seed(dict.fromkeys(range(5), "<answer>42</answer>")), samples=5)
    assert fixed.metrics.strategy_specific["stop_reason"] == "all_samples"
    assert result.metrics.total_tokens < fixed.metrics.total_tokens and result.answer == fixed.answer


async def test_adaptive_samples_one_more_wave_at_a_time_and_uses_all_when_the_chains_split():
    split = {
        0: "<answer>42</answer>",
        1: "<answer>41</answer>",
        2: "<answer>42</answer>",
        3: "<answer>41</answer>",
        4: "<answer>42</answer>",
    }
    llm = by_seed(split)
    waves = []
    ctx, _ = context_for(llm, strategy="self_consistency")
    fanout = ctx.fanout

    async def recording(context, branches, *, label, arrived=None):
        waves.append(len(branches))
        return await fanout(context, branches, label=label, arrived=arrived)

    ctx.fanout = recording
    result = await SelfConsistency().reason("How much?", context=ctx, config={"samples": 5, "adaptive": True})
    specific = result.metrics.strategy_specific
    assert waves == [3, 1, 1]  # 2:1 needs one more that agrees (3:1, one left); 2:2 needs the last
    assert (result.answer, specific["samples_used"], specific["stop_reason"]) == ("42", 5, "all_samples")


async def test_adaptive_with_a_stop_confidence_stops_at_the_beta_posterior():
    llm = by_seed(dict.fromkeys(range(20), "<answer>7</answer>"))
    result, _ = await run(llm, samples=20, adaptive=True, stop_confidence=0.95)
    specific = result.metrics.strategy_specific
    # 4 agreeing of 4: P(p > 1/2 | Beta(5, 1)) = 0.969 >= 0.95, where waiting for a decided vote takes 11
    assert (specific["samples_used"], specific["stop_reason"]) == (4, "confident")


def test_beta_confidence_is_the_posterior_that_the_leader_beats_the_runner_up():
    from reasonray.strategies.self_consistency import beta_confidence

    assert beta_confidence(3, 0) == 15 / 16 and beta_confidence(2, 2) == 0.5
    assert beta_confidence(4, 1) > beta_confidence(3, 1) > beta_confidence(3, 2)


def with_logprobs(request, text, *, chosen, top):
    """A reply of a few tokens whose each token has log-probability `chosen` and alternatives `top`."""
    import msgspec

    from reasonray.gateway.testing import make_completion
    from reasonray.gateway.tokens import counter_for_model

    done = make_completion(request, text, model="function", counter=counter_for_model("function"))
    choice = msgspec.structs.replace(done.choices[0], token_logprobs=(chosen,) * 4, top_logprobs=((chosen, *top),) * 4)
    return msgspec.structs.replace(done, choices=(choice,))


def unsure_majority(request):
    """Three unsure chains say 41 (alternatives close behind), two sure ones say 42 (alternatives far below)."""
    if request.seed < 3:
        return with_logprobs(request, "<answer>41</answer>", chosen=-1.2, top=(-1.3, -1.4, -1.5, -1.6))
    return with_logprobs(request, "<answer>42</answer>", chosen=-0.01, top=(-9.0, -10.0, -11.0, -12.0))


async def test_deepconf_weighting_lets_confident_chains_outvote_an_unsure_majority():
    llm = FunctionLLM(unsure_majority)
    result, _ = await run(llm, samples=5, confidence="weight")
    specific = result.metrics.strategy_specific
    assert all(r.logprobs == 5 for r in llm.requests)  # the alternatives DeepConf's token confidence needs
    assert result.answer == "42" and specific["votes"] == {"41": 3, "42": 2} and specific["confidence_used"] is True
    assert specific["weighted_votes"]["42"] > specific["weighted_votes"]["41"]
    assert specific["confidences"][0] == 1.4 and specific["confidences"][3] == 8.402  # -mean of each token's top 5
    plain, _ = await run(FunctionLLM(unsure_majority), samples=5)
    assert plain.answer == "41"


async def test_deepconf_filter_keeps_the_most_confident_chains():
    result, _ = await run(FunctionLLM(unsure_majority), samples=5, confidence="filter", keep_top=0.4)
    specific = result.metrics.strategy_specific
    assert result.answer == "42" and specific["kept"] == 2 and set(specific["weighted_votes"]) == {"42"}


async def test_deepconf_without_logprobs_falls_back_to_the_plain_vote_and_says_so():
    llm = by_seed({0: "<answer>41</answer>", 1: "<answer>41</answer>", 2: "<answer>42</answer>"})
    result, _ = await run(llm, samples=3, confidence="weight")
    specific = result.metrics.strategy_specific
    assert result.answer == "41" and specific["confidence_used"] is False and specific["confidence_fallback"] == "no_logprobs"


def test_deepconf_lowest_group_confidence_is_the_weakest_window():
    from reasonray.strategies.self_consistency import lowest_group

    assert lowest_group([5.0, 5.0, 1.0, 1.0, 5.0], 2) == 1.0 and lowest_group([5.0, 1.0], 4) == 3.0


async def test_adaptive_and_confidence_weighting_do_not_combine():
    from reasonray.kernel.errors import InvalidParamsError

    with pytest.raises(InvalidParamsError, match="cannot be combined with confidence weighting"):
        await run(by_seed({}), adaptive=True, confidence="weight")
