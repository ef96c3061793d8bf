"""Think-evaluate-refine and MaTTS, memory-aware test-time scaling (the ReasoningBank paper, arXiv 2509.25140)."""

from __future__ import annotations

import pytest

from reasonray.gateway.errors import ProviderUnavailableError
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import ScriptedLLM
from reasonray.kernel.errors import InvalidParamsError, ModelBehaviorError
from reasonray.strategies.chain_of_thought import SYSTEM_PROMPT, ChainOfThought
from reasonray.strategies.matts import Matts
from reasonray.strategies.refine import EVALUATE_PROMPT, REFINE_PROMPT, Refine, trajectory_hash
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


async def test_each_refinement_shows_the_previous_attempt_its_score_and_feedback_at_its_own_temperature_and_seed():
    llm = ScriptedLLM(
        ["<thinking>6*7 is 41</thinking><answer>41</answer>", "<score>0.4</score>", "<answer>42</answer>", evaluation(0.5, "check")]
    )
    context, _ = context_for(llm, strategy="refine")
    config = {"max_iterations": 2, "temperature": 0.7, "refine_temperature": 0.3, "seed": 10, "max_tokens": 300, "evaluate_max_tokens": 100}
    result = await Refine().reason("What is 6*7?", context=context, config=config)
    first, review, second, _ = llm.requests
    assert (first.temperature, first.seed, first.max_tokens) == (0.7, 10, 300)
    assert [m.content for m in first.messages] == [SYSTEM_PROMPT, "What is 6*7?"]
    assert (review.temperature, review.max_tokens, review.purpose) == (0.0, 100, "critique")
    assert review.messages[0].content == EVALUATE_PROMPT
    assert review.messages[1].content == "Problem:\nWhat is 6*7?\n\nProposed solution:\n<answer>41</answer>\nAnswer: 41"
    assert (second.temperature, second.seed, second.max_tokens) == (0.3, 11, 300)
    assert second.messages[0].content == REFINE_PROMPT
    # the previous attempt without its thinking, its answer, its score, and "(none)" for a review without feedback
    assert second.messages[1].content == (
        "Problem:\nWhat is 6*7?\n\nPrevious attempt:\n<answer>41</answer>\nAnswer: 41\n\nReviewer's score: 0.4\nReviewer's feedback: (none)"
    )
    s = result.metrics.strategy_specific
    assert result.answer == "42" and s["scores"] == [0.4, 0.5] and s["best_iteration"] == 2 and s["best_score"] == 0.5
    assert [h["feedback"] for h in s["history"]] == ["", "check"] and [h["answer"] for h in s["history"]] == ["41", "42"]
    llm.assert_complete()


async def test_a_score_at_the_threshold_does_not_stop_and_a_tie_goes_to_the_earlier_attempt():
    llm = ScriptedLLM(["<answer>41</answer>", evaluation(0.8), "<answer>42</answer>", evaluation(0.8)])
    context, _ = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={"max_iterations": 2, "threshold": 0.8})
    s = result.metrics.strategy_specific
    assert s["stop_reason"] == "max_iterations" and s["iterations"] == 2
    assert result.answer == "41" and s["best_iteration"] == 1


async def test_an_evaluation_without_a_score_is_unscored_and_says_so():
    llm = ScriptedLLM(["<answer>41</answer>", "<feedback>looks off</feedback>", "<answer>42</answer>", evaluation(0.9)])
    context, recorder = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={})
    s = result.metrics.strategy_specific
    assert s["scores"] == [None, 0.9] and result.answer == "42" and s["unscored"] == 1
    assert "Reviewer's score: (none)" in llm.requests[2].messages[1].content  # not a made-up 0.0
    warnings = [e for e in recorder.events if type(e).__name__ == "RunWarning"]
    assert [w.code for w in warnings] == ["unscored"] and "iteration 1" in warnings[0].message


async def test_an_unscored_attempt_never_beats_a_scored_one_even_a_low_one():
    llm = ScriptedLLM(["<answer>41</answer>", evaluation(0.1), "<answer>42</answer>", "Looks fine to me.", "<answer>43</answer>", "hmm"])
    context, _ = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={"max_iterations": 3})
    s = result.metrics.strategy_specific
    assert s["scores"] == [0.1, None, None] and result.answer == "41" and s["best_iteration"] == 1


async def test_with_a_model_that_never_scores_nor_tags_the_real_first_attempt_is_kept():
    # what SmolLM2-135M did: untagged attempt, reviews with no score, refinements that talk about the review
    llm = ScriptedLLM(
        [
            "6 * 7 = 42\nThe answer is correct.",
            "The solution multiplies 6 by 7. It looks right.",
            "The reviewer's score of (none) means the feedback was not given. The feedback says the solution looks right.",
            "The review is fine.",
            "",
            "No score.",
        ]
    )
    context, recorder = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={"max_iterations": 3})
    s = result.metrics.strategy_specific
    assert result.answer == "42" and s["best_iteration"] == 1 and s["found_by"] == "final_number"
    assert s["scores"] == [None, None, None] and s["unscored"] == 3
    assert [h["degenerate"] for h in s["history"]] == [False, True, True]
    # the review's prose is the feedback the next attempt sees
    assert "It looks right." in llm.requests[2].messages[1].content
    assert context.trajectories[0].answer == "42" and "[attempt 1, score unscored]" in context.trajectories[0].text
    assert {w.code for w in recorder.events if type(w).__name__ == "RunWarning"} == {"unscored", "answer_format"}


@pytest.mark.parametrize(
    ("review", "score"),
    [("Score: 8/10\nGood work.", 0.8), ("0.8", 0.8), ("80%", 0.8), ("I rate it 7 out of 10", 0.7), ("<score>9</score>", 0.9)],
)
async def test_scores_are_read_in_the_forms_models_give_them(review, score):
    llm = ScriptedLLM(["<answer>42</answer>", review])
    context, _ = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={"max_iterations": 1})
    assert result.metrics.strategy_specific["scores"] == [score]


async def test_an_endpoint_that_enforces_a_schema_is_asked_for_json_attempts_and_reviews():
    from reasonray.gateway.capabilities import Capabilities

    llm = ScriptedLLM(['{"reasoning": "6*7", "answer": "42"}', '{"score": 0.95, "feedback": "none needed"}'])
    llm.capabilities = Capabilities(structured_output=True)
    context, _ = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={})
    attempt, review = llm.requests
    assert attempt.response_format["json_schema"]["name"] == "answer"
    assert review.response_format["json_schema"]["name"] == "critique"
    s = result.metrics.strategy_specific
    assert result.answer == "42" and s["scores"] == [0.95] and s["stop_reason"] == "threshold" and s["found_by"] == "json"
    assert s["history"][0]["feedback"] == "none needed"


async def test_a_failure_part_way_leaves_the_last_draft_its_critique_and_the_best_answer_in_progress():
    from reasonray.kernel.errors import DeadlineExceededError

    down = DeadlineExceededError("the run passed its deadline")  # ends the run (a provider failure would cost one iteration)
    llm = ScriptedLLM(["<thinking>t</thinking><answer>41</answer>", evaluation(0.6, "fix it"), down])
    context, _ = context_for(llm, strategy="refine")
    with pytest.raises(DeadlineExceededError):
        await Refine().reason("What is 6*7?", context=context, config={})
    assert context.progress == {
        "iterations": 1,
        "last_draft": "<answer>41</answer>",
        "last_answer": "41",
        "last_score": 0.6,
        "last_critique": "fix it",
        "answer": "41",
    }


async def test_attempts_without_an_answer_are_a_model_behavior_error_naming_what_to_do():
    llm = ScriptedLLM(["<thinking>hmm</thinking>", evaluation(0.1)])
    context, _ = context_for(llm, strategy="refine")
    with pytest.raises(ModelBehaviorError) as raised:
        await Refine().reason("What is 6*7?", context=context, config={"max_iterations": 1})
    assert "max_tokens" in str(raised.value) and raised.value.data == {"iterations": 1, "stop_reason": "max_iterations"}


async def test_matts_attempts_that_agree_need_no_judge_call():
    llm = ScriptedLLM(["<answer>42</answer>", "The answer is: 42.", "6*7 = 42"])  # exactly k replies: no judge
    context, _ = context_for(llm, strategy="matts")
    context.resolve = resolver
    result = await Matts().reason("What is 6*7?", context=context, config={"k": 3})
    s = result.metrics.strategy_specific
    assert result.answer == "42" and s["selection"] == "agreement" and s["selected"] == 0
    assert s["scores"] == [None, None, None] and s["judged"] == 0
    llm.assert_complete()


async def test_matts_contrast_is_skipped_when_the_attempts_agree():
    llm = ScriptedLLM(["<answer>42</answer>", "<answer>42.0</answer>"])
    context, _ = context_for(llm, strategy="matts")
    context.resolve = resolver
    result = await Matts().reason("What is 6*7?", context=context, config={"k": 2, "selection": "contrast"})
    assert result.metrics.strategy_specific["selection"] == "agreement"
    llm.assert_complete()


def judged_by_prompt(attempts: dict[int, str], reviews: dict[str, str]):
    """Attempts by seed; a judge's reply by the answer the attempt under review gave."""
    from reasonray.gateway.testing import FunctionLLM

    def reply(request):
        if request.purpose == "critique":
            return reviews[request.messages[1].content.rsplit("Answer: ", 1)[1]]
        return attempts[request.seed]

    return FunctionLLM(reply)


async def test_matts_judges_that_give_no_score_leave_the_majority_answer():
    # SmolLM2-135M judged with prose and never a <score>: before, every attempt counted 0.0 and the first won
    llm = judged_by_prompt({0: "The answer is 40.", 1: "6 * 7 = 42", 2: "Answer: 42"}, {"40": "Looks good.", "42": "The steps are fine."})
    context, _ = context_for(llm, strategy="matts")
    context.resolve = resolver
    result = await Matts().reason("What is 6*7?", context=context, config={"k": 3})
    s = result.metrics.strategy_specific
    assert s["scores"] == [None, None, None] and s["unscored"] == 3 and s["selection"] == "majority"
    assert result.answer == "42" and s["selected"] == 1 and s["found_by"] == "final_number"
    assert [t.score for t in context.trajectories] == [None, None, None]


async def test_matts_an_unscored_attempt_never_beats_a_scored_one():
    llm = judged_by_prompt(
        {0: "<answer>40</answer>", 1: "<answer>42</answer>", 2: "<answer>42</answer>"}, {"40": "Score: 3/10", "42": "no idea"}
    )
    context, _ = context_for(llm, strategy="matts")
    context.resolve = resolver
    result = await Matts().reason("What is 6*7?", context=context, config={"k": 3})
    s = result.metrics.strategy_specific
    assert s["scores"] == [0.3, None, None] and result.answer == "40" and s["selection"] == "judge"


async def test_matts_contrast_vote_in_prose_is_read_and_an_unreadable_one_falls_back_to_the_majority():
    for vote, answer, selection in [("I think Candidate 3 is best.", "43", "contrast"), ("They all look fine.", "42", "majority")]:
        llm = ScriptedLLM(["<answer>42</answer>", "<answer>42</answer>", "<answer>43</answer>", vote])
        context, _ = context_for(llm, strategy="matts")
        context.resolve = resolver
        result = await Matts().reason("What is 6*7?", context=context, config={"k": 3, "selection": "contrast"})
        assert result.answer == answer and result.metrics.strategy_specific["selection"] == selection


async def test_matts_parallel_judging_starts_while_slower_attempts_still_run():
    import asyncio

    from reasonray.gateway.testing import make_completion
    from reasonray.gateway.tokens import counter_for_model

    log: list[str] = []

    class Timed:
        model = "timed"

        async def complete(self, request):
            if request.purpose == "critique":
                log.append("judge")
                return make_completion(request, "<score>0.5</score>", model=self.model, counter=counter_for_model("x"))
            await asyncio.sleep(0.3 if request.seed == 2 else 0.01)
            log.append(f"attempt {request.seed}")
            return make_completion(request, f"<answer>{request.seed}</answer>", model=self.model, counter=counter_for_model("x"))

    context, _ = context_for(Timed(), strategy="matts")
    context.resolve = resolver
    result = await Matts().reason("q", context=context, config={"k": 3, "seed": 0})
    # attempts 0 and 1 disagree as soon as both are in: they are judged before attempt 2 finishes
    # and the slow attempt is judged once it lands
    assert sorted(log[:2]) == ["attempt 0", "attempt 1"] and log[2:] == ["judge", "judge", "attempt 2", "judge"]
    assert result.metrics.strategy_specific["scores"] == [0.5, 0.5, 0.5] and result.answer == "0"


async def test_matts_a_judge_refused_while_the_attempts_hold_the_fanout_is_asked_again_after():
    import asyncio

    from reasonray.gateway.testing import FunctionLLM
    from reasonray.kernel.errors import OverloadedError
    from reasonray.strategies.base import local_fanout

    running = {"attempts": True}

    async def bounded(context, branches, *, label, arrived=None):
        if label == "matts.judge" and running["attempts"]:
            raise OverloadedError("overloaded: branches in flight", {"retry_after_s": 0.1})
        try:
            return await local_fanout(context, branches, label=label, arrived=arrived)
        finally:
            if label == "matts.attempt":
                running["attempts"] = False

    async def slow_third(request):
        if request.purpose == "critique":
            return "<score>0.5</score>"
        if request.seed == 2:
            await asyncio.sleep(0.05)
        return f"<answer>{request.seed}</answer>"

    class Slow(FunctionLLM):
        async def complete(self, request):
            self.requests.append(request)
            from reasonray.gateway.testing import make_completion

            return make_completion(request, await slow_third(request), model=self.model, counter=self._counter)

    context, _ = context_for(Slow(lambda r: ""), strategy="matts")
    context.resolve = resolver
    context.fanout = bounded
    result = await Matts().reason("q", context=context, config={"k": 3, "seed": 0})
    assert result.metrics.strategy_specific["scores"] == [0.5, 0.5, 0.5] and result.answer == "0"


# --- a failed attempt costs its place; the per-attempt log; k = 1 sampled ---


def provider_down():
    return ProviderUnavailableError("the model provider failed after 3 attempt(s) (HTTP 500); retry later", attempts=3)


def attempts_and_judges(attempts: dict[int, object], reviews: dict[str, object] | None = None):
    """Attempts by seed, judges by the answer under review; an exception in either is raised."""
    from reasonray.gateway.testing import FunctionLLM

    def reply(request):
        if request.purpose == "critique":
            return (reviews or {})[request.messages[1].content.rsplit("Answer: ", 1)[1]]
        return attempts[request.seed]

    return FunctionLLM(reply)


async def matts(llm, query="What is 6*7?", **config):
    context, _ = context_for(llm, strategy="matts")
    context.resolve = resolver
    return await Matts().reason(query, context=context, config=config), context


async def test_matts_an_attempt_that_fails_costs_its_place_not_the_run():
    llm = attempts_and_judges(
        {0: "<answer>40</answer>", 1: provider_down(), 2: "<answer>42</answer>"}, {"40": "<score>0.2</score>", "42": "<score>0.9</score>"}
    )
    result, context = await matts(llm, k=3)
    s = result.metrics.strategy_specific
    assert result.answer == "42" and s["selection"] == "judge" and s["answers"] == ["40", "42"]
    assert (s["k"], s["branches_finished"], s["branches_failed"], s["failures"]) == (3, 2, 1, {"provider_unavailable": 1})
    assert [a["failed"] for a in s["attempts"]] == [None, "provider_unavailable", None]
    assert len(context.trajectories) == 2


async def test_matts_fails_with_the_first_error_only_when_no_attempt_finished():
    llm = attempts_and_judges({0: provider_down(), 1: provider_down()})
    with pytest.raises(ProviderUnavailableError, match="HTTP 500"):
        await matts(llm, k=2)


async def test_matts_the_caller_budget_running_out_in_one_attempt_fails_the_run():
    from reasonray.kernel.errors import BudgetExceededError

    llm = attempts_and_judges(
        {0: "<answer>42</answer>", 1: BudgetExceededError("the request's token budget is spent"), 2: "<answer>42</answer>"}
    )
    with pytest.raises(BudgetExceededError):
        await matts(llm, k=3)


async def test_matts_logs_every_attempt_with_its_judge_score_and_the_choice():
    llm = attempts_and_judges(
        {0: "<answer>40</answer>", 1: "<answer>$42.00</answer>", 2: "<answer>42</answer>", 3: "<answer>41</answer>"},
        {"40": "<score>0.2</score>", "$42.00": "<score>0.9</score>", "42": "no idea", "41": provider_down()},
    )
    result, _ = await matts(llm, k=4)
    log = result.metrics.strategy_specific["attempts"]
    assert [a["index"] for a in log] == [0, 1, 2, 3]
    assert [a["answer"] for a in log] == ["40", "42", "42", "41"]  # normalized, so majority@k counts them together
    assert [a["score"] for a in log] == [0.2, 0.9, None, None]
    assert [a["judge"] for a in log] == ["scored", "scored", "unscored", "failed"]
    assert [a["chosen"] for a in log] == [False, True, False, False] and result.answer == "$42.00"
    assert result.metrics.strategy_specific["judges_failed"] == 1
    # judge-selected@k from the log, chosen as the run chooses: the full log gives the run's own choice
    from reasonray.strategies.matts import judge_selected

    assert [judge_selected(log[:k]) for k in range(1, 5)] == [0, 1, 1, 1]
    assert judge_selected([log[1], log[2]]) == 1 and judge_selected([log[3]]) == 3  # 42 twice: they agree, the first


async def test_matts_attempts_that_agree_are_logged_unjudged():
    llm = attempts_and_judges({0: "<answer>42</answer>", 1: "<answer>42</answer>"})
    result, _ = await matts(llm, k=2)
    log = result.metrics.strategy_specific["attempts"]
    assert [(a["answer"], a["judge"], a["chosen"]) for a in log] == [("42", None, True), ("42", None, False)]


async def test_matts_a_failed_contrast_call_leaves_the_majority_answer():
    from reasonray.gateway.testing import FunctionLLM

    def reply(request):
        return (
            provider_down()
            if request.purpose == "choose"
            else {0: "<answer>41</answer>", 1: "<answer>42</answer>", 2: "<answer>42</answer>"}[request.seed]
        )

    result, _ = await matts(FunctionLLM(reply), k=3, selection="contrast")
    s = result.metrics.strategy_specific
    assert result.answer == "42" and s["selection"] == "majority" and s["judges_failed"] == 1


async def test_matts_a_failed_reexamination_ends_the_sequence_with_the_attempts_before_it():
    llm = ScriptedLLM(["<answer>40</answer>", "<answer>42</answer>", provider_down(), evaluation(0.3), evaluation(0.8)])
    result, _ = await matts(llm, k=3, mode="sequential")
    s = result.metrics.strategy_specific
    assert result.answer == "42" and (s["branches_finished"], s["branches_failed"]) == (2, 1)
    assert [a["failed"] for a in s["attempts"]] == [None, None, "provider_unavailable"]
    llm.assert_complete()


async def test_matts_k_1_samples_like_one_attempt_of_k_when_asked_and_runs_the_base_config_otherwise():
    seen = []

    def reply(request):
        seen.append((request.temperature, request.seed))
        return "<answer>42</answer>"

    from reasonray.gateway.testing import FunctionLLM

    await matts(FunctionLLM(reply), k=1, single_attempt="sampled", temperature=0.9, seed=7)
    await matts(FunctionLLM(reply), k=3, temperature=0.9, seed=7)
    await matts(FunctionLLM(reply), k=1)
    assert seen[0] == (0.9, 7) and seen[0] in seen[1:4]  # k = 1 is attempt 0 of k = 3
    assert seen[4][0] == 0.0  # the base strategy as configured: chain of thought is greedy


async def test_refine_a_refinement_that_fails_costs_its_iteration_not_the_run():
    llm = ScriptedLLM(["<answer>41</answer>", evaluation(0.4), provider_down()])
    context, recorder = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={"max_iterations": 3})
    s = result.metrics.strategy_specific
    assert result.answer == "41" and s["stop_reason"] == "failed" and s["failures"] == {"provider_unavailable": 1}
    assert s["iterations"] == 1 and [e.stop for e in recorder.events if type(e).__name__ == "IterationEnd"] == ["continue", "failed"]
    llm.assert_complete()


async def test_refine_an_evaluation_that_fails_leaves_its_attempt_unscored():
    llm = ScriptedLLM(["<answer>41</answer>", evaluation(0.4), "<answer>42</answer>", provider_down()])
    context, _ = context_for(llm, strategy="refine")
    result = await Refine().reason("What is 6*7?", context=context, config={"max_iterations": 3})
    s = result.metrics.strategy_specific
    assert s["scores"] == [0.4, None] and s["stop_reason"] == "failed"
    assert result.answer == "41"  # an unscored attempt never beats a scored one
    llm.assert_complete()


async def test_refine_fails_when_its_first_attempt_fails_or_the_budget_runs_out():
    from reasonray.kernel.errors import BudgetExceededError

    context, _ = context_for(ScriptedLLM([provider_down()]), strategy="refine")
    with pytest.raises(ProviderUnavailableError):
        await Refine().reason("What is 6*7?", context=context, config={})
    llm = ScriptedLLM(["<answer>41</answer>", evaluation(0.4), BudgetExceededError("the request's token budget is spent")])
    context, _ = context_for(llm, strategy="refine")
    with pytest.raises(BudgetExceededError):
        await Refine().reason("What is 6*7?", context=context, config={})


async def test_matts_over_refine_keeps_an_attempt_whose_later_refinement_failed():
    from reasonray.gateway.testing import FunctionLLM

    def reply(request):
        if request.purpose == "critique":
            return evaluation(0.5)
        if request.messages[0].content == REFINE_PROMPT:
            return provider_down()  # every refinement fails: each attempt answers with its first draft
        return {0: "<answer>42</answer>", 1: "<answer>42</answer>"}[request.seed]

    context, _ = context_for(FunctionLLM(reply), strategy="matts")
    context.resolve = lambda name, config: (Refine(), config)
    result = await Matts().reason("What is 6*7?", context=context, config={"k": 2, "base_strategy": "refine"})
    s = result.metrics.strategy_specific
    assert result.answer == "42" and (s["branches_finished"], s["branches_failed"]) == (2, 0)
