"""Think-evaluate-refine and MaTTS (seed 003, requirements 2 and 3)."""

from __future__ import annotations

import pytest

from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import ScriptedLLM
from reasonray.kernel.errors import InvalidParamsError
from reasonray.strategies.chain_of_thought import ChainOfThought
from reasonray.strategies.matts import Matts
from reasonray.strategies.refine import Refine, trajectory_hash
from tests.unit.strategy_harness import context_for


def evaluation(score: float, feedback: str = "fix the second step") -> str:
    return f"<score>{score}</score><feedback>{feedback}</feedback>"


def resolver(name, config):
    assert name == "chain_of_thought"
    return ChainOfThought(), config


async def test_refine_stops_early_above_the_threshold():
    llm = ScriptedLLM(["<answer>41</answer>", evaluation(0.5), "<thinking>recheck</thinking><answer>42</answer>", evaluation(0.95)])
    context, recorder = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={})
    s = result.metrics.strategy_specific
    assert result.answer == "42" and s["stop_reason"] == "threshold" and s["iterations"] == 2
    refine_prompt = llm.requests[2].messages
    assert "re-examine" in refine_prompt[0].content and "fix the second step" in refine_prompt[1].content
    assert all(r.temperature == 0 for r in llm.requests[1::2])  # the evaluator
    llm.assert_complete()
    assert [e.stop for e in recorder.events if type(e).__name__ == "IterationEnd"] == ["continue", "threshold"]


async def test_refine_returns_the_best_iteration_when_the_iterations_run_out():
    llm = ScriptedLLM(
        [
            "<answer>40</answer>",
            evaluation(0.3),
            "<answer>42</answer>",
            evaluation(0.7),
            "<answer>43</answer>",
            evaluation(0.2),
        ]
    )
    context, _ = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={"max_iterations": 3})
    s = result.metrics.strategy_specific
    assert result.answer == "42" and s["best_iteration"] == 2 and s["stop_reason"] == "max_iterations"
    assert s["scores"] == [0.3, 0.7, 0.2]
    assert context.trajectories[0].selected and "[attempt 3, score 0.20]" in context.trajectories[0].text


async def test_refine_detects_a_loop_by_trajectory_hash():
    llm = ScriptedLLM(["<answer>40</answer>", evaluation(0.3), "<answer>40</answer>"])
    context, recorder = context_for(llm, strategy="refine")
    result = await Refine().reason("q", context=context, config={})
    assert result.metrics.strategy_specific["stop_reason"] == "loop_detected"
    assert any(getattr(e, "code", "") == "loop_detected" for e in recorder.events)
    llm.assert_complete()
    assert trajectory_hash("A  b", "1,000") == trajectory_hash("a b", "1000")


async def test_refine_on_the_simulator_fixes_a_slipped_first_attempt():
    context, _ = context_for(SimulatedLLM(), strategy="refine")
    # the first attempt is sampled and slips; the evaluator catches it; the re-examination at temperature 0 is exact
    result = await Refine().reason("What is 17 * 23? [[sim slip=1]]", context=context, config={"temperature": 0.9, "seed": 1})
    assert result.answer == "391"
    s = result.metrics.strategy_specific
    assert s["scores"][0] < 0.5 and s["best_score"] > 0.8


class PeakConcurrency(SimulatedLLM):
    """The simulated model, counting how many calls were in flight at once."""

    def __init__(self, **options):
        super().__init__(**options)
        self.in_flight = self.peak = self.calls = 0

    async def complete(self, request):
        self.in_flight += 1
        self.calls += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await super().complete(request)
        finally:
            self.in_flight -= 1


async def test_matts_parallel_runs_k_attempts_concurrently_and_picks_the_best_scored():
    llm = PeakConcurrency(ttft_ms=50)
    context, _recorder = context_for(llm, strategy="matts")
    context.resolve = resolver
    result = await Matts().reason("What is 19 * 21? [[sim slip=0.5]]", context=context, config={"k": 5, "seed": 3})
    s = result.metrics.strategy_specific
    assert s["k"] == 5 and len(s["answers"]) == 5 and len(s["scores"]) == 5
    assert result.answer == "399" and s["scores"][s["selected"]] == max(s["scores"])
    assert llm.calls >= 10 and llm.peak == 5  # attempts, then judges, each a concurrent wave of k: not sequential calls
    assert [t.selected for t in context.trajectories].count(True) == 1 and len(context.trajectories) == 5


async def test_matts_parallel_attempts_are_diverse_seeded_samples():
    seen = []

    def reply(request):
        seen.append((request.temperature, request.seed))
        return "<score>0.9</score>" if "<score>" in request.messages[0].content else f"<answer>{request.seed}</answer>"

    from reasonray.gateway.testing import FunctionLLM

    context, _ = context_for(FunctionLLM(reply), strategy="matts")
    context.resolve = resolver
    await Matts().reason("q", context=context, config={"k": 3, "seed": 10, "temperature": 0.9})
    assert sorted(seen[:3]) == [(0.9, 10), (0.9, 11), (0.9, 12)]


async def test_matts_sequential_reexamines_the_previous_attempt():
    llm = ScriptedLLM(
        [
            "<answer>40</answer>",
            "<thinking>re-check</thinking><answer>42</answer>",
            "<answer>42</answer>",
            evaluation(0.2),
            evaluation(0.9),
            evaluation(0.9),
        ]
    )
    context, _ = context_for(llm, strategy="matts")
    context.resolve = resolver
    result = await Matts().reason("What is 6*7?", context=context, config={"k": 3, "mode": "sequential"})
    assert result.answer == "42" and result.metrics.strategy_specific["selected"] == 1  # ties: the earlier attempt
    assert "Previous attempt" in llm.requests[1].messages[1].content and "40" in llm.requests[1].messages[1].content
    llm.assert_complete()


@pytest.mark.parametrize("vote", [1, 2])
async def test_matts_contrast_selection_asks_one_comparison_and_follows_its_vote(vote):
    llm = ScriptedLLM(["<answer>1</answer>", "<answer>2</answer>", f"<vote>{vote}</vote>"])
    context, _ = context_for(llm, strategy="matts")
    context.resolve = resolver
    result = await Matts().reason("q", context=context, config={"k": 2, "selection": "contrast"})
    assert result.metrics.strategy_specific["selection"] == "contrast"
    assert result.answer == str(vote) and result.metrics.strategy_specific["selected"] == vote - 1
    assert "Candidate 2:" in llm.requests[2].messages[1].content
    llm.assert_complete()


@pytest.mark.parametrize("config", [{"k": 1}, {"enabled": False, "k": 5}])
async def test_matts_with_k_1_or_disabled_is_one_run(config):
    llm = ScriptedLLM(["<answer>42</answer>"])
    context, _ = context_for(llm, strategy="matts")
    context.resolve = resolver
    result = await Matts().reason("q", context=context, config=config)
    assert result.answer == "42" and result.metrics.strategy_specific["fallback"] is True
    llm.assert_complete()


async def test_matts_refuses_itself_as_base_and_bounds_k():
    context, _ = context_for(ScriptedLLM([]), strategy="matts")
    with pytest.raises(InvalidParamsError, match="matts as its base"):
        await Matts().reason("q", context=context, config={"base_strategy": "matts"})
    with pytest.raises(InvalidParamsError):
        Matts().parse_config({"k": 6})
