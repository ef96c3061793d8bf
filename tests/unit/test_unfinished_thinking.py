"""Unfinished thinking is never an answer, in any strategy; chain of thought forces the answer from it; a strategy
config's reasoning_effort and thinking_budget reach every request of its run, fan-out branches included."""

import asyncio
import contextvars
import pickle

import msgspec
import pytest

from reasonray.gateway.observed import ObservedLLM, Sampling
from reasonray.gateway.protocol import Choice, Completion, LLMRequest, Usage, user
from reasonray.gateway.testing import FunctionLLM, ScriptedLLM
from reasonray.kernel.errors import ReasonRayError
from reasonray.strategies.base import StrategyContext
from reasonray.strategies.bounded_context import BoundedContext
from reasonray.strategies.chain_of_thought import ChainOfThought
from reasonray.strategies.matts import Matts
from reasonray.strategies.react import ReAct
from reasonray.strategies.refine import Refine
from reasonray.strategies.self_consistency import SelfConsistency
from reasonray.strategies.tree_of_thought import TreeOfThought
from tests.unit.strategy_harness import context_for

R1_CUT = Completion(
    choices=(Choice(text="", finish_reason="length", reasoning="Okay... the answer is 340 so far", thinking_unfinished=True),),
    usage=Usage(40, 12, 12),
    model="r1",
)
STRATEGIES = [ChainOfThought, BoundedContext, SelfConsistency, TreeOfThought, Refine, Matts, ReAct]


def chain_of_thought(name, config):
    return ChainOfThought(), config


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
async def test_no_strategy_takes_an_answer_from_thinking_cut_before_it_closed(strategy):
    """An R1-style reply cut by max_tokens ("Okay... the answer is 340 so far", no closing tag) holds no answer
    text: every strategy fails with a classified error or answers otherwise, never "340 so far"."""
    llm = FunctionLLM(lambda request: R1_CUT, model="r1")
    context, recorder = context_for(llm, strategy=strategy.name)
    context.resolve = chain_of_thought
    try:
        result = await strategy().reason("What is 17 * 20?", context=context, config={})
    except ReasonRayError as exc:
        assert "340 so far" not in str(exc) and "340 so far" not in str(exc.data.get("partial", ""))
    else:
        assert "340" not in result.answer, result.answer
    assert all("340 so far" not in str(getattr(e, "answer", "")) for e in recorder.events)


async def test_chain_of_thought_forces_the_answer_from_unfinished_thinking():
    answered = Completion(choices=(Choice(text="<answer>340</answer>"),), usage=Usage(60, 5), model="r1")
    llm = ScriptedLLM([R1_CUT, answered])
    context, _ = context_for(llm, strategy="chain_of_thought")
    result = await ChainOfThought().reason("What is 17 * 20?", context=context, config={"max_tokens": 64})
    llm.assert_complete()
    forced = llm.requests[1]
    assert forced.thinking_budget == 0 and forced.continue_thinking == "Okay... the answer is 340 so far"
    assert forced.messages == llm.requests[0].messages and forced.max_tokens == 64
    assert result.answer == "340" and result.metrics.strategy_specific["answer_forced"] is True


async def test_strategy_configs_set_reasoning_effort_and_thinking_budget_for_every_call():
    llm = ScriptedLLM(["<answer>1</answer>"])
    context, _ = context_for(llm, strategy="chain_of_thought")
    await ChainOfThought().reason("q", context=context, config={"reasoning_effort": "low", "thinking_budget": 300})
    assert (llm.requests[0].reasoning_effort, llm.requests[0].thinking_budget) == ("low", 300)
    again = ScriptedLLM(["<answer>1</answer>"])
    context, _ = context_for(again, strategy="chain_of_thought")
    await ChainOfThought().reason("q", context=context, config={})
    assert (again.requests[0].reasoning_effort, again.requests[0].thinking_budget) == (None, None)


async def test_a_request_that_sets_its_own_thinking_budget_keeps_it():
    """Bounded context's forced answer asks for no thinking (budget 0), whatever the run's budget is."""
    cut = Completion(
        choices=(Choice(text="", finish_reason="length", reasoning="adding up", thinking_unfinished=True),),
        usage=Usage(40, 9, 9),
        model="r1",
    )
    llm = ScriptedLLM([cut, "<answer>3</answer>"])
    context, _ = context_for(llm, strategy="bounded_context")
    config = {"max_iterations": 1, "chunk_size": 1024, "carryover_size": 256, "thinking_budget": 500, "reasoning_effort": "high"}
    result = await BoundedContext().reason("q", context=context, config=config)
    assert result.answer == "3"
    assert [(r.thinking_budget, r.reasoning_effort) for r in llm.requests] == [(500, "high"), (0, "high")]


async def test_fan_out_branches_carry_the_thinking_settings_even_in_another_process():
    """A branch pickled to another process gets a fresh context from branch_options: the settings travel with it."""
    llm = FunctionLLM(lambda request: "<answer>4</answer>")

    async def elsewhere(context, branches, *, label, arrived=None):
        values = []
        for i, branch in enumerate(branches):
            branch = pickle.loads(pickle.dumps(branch))  # what crossing processes does to it
            fresh = StrategyContext(
                llm=ObservedLLM(llm, context.emit, trace_id="t", strategy="s", **context.llm.branch_options(len(branches))),
                tokens=context.tokens,
                emit=context.emit,
                trace_id="t",
            )
            # in a context of its own, as in another process: nothing of the caller's context variables
            values.append(await asyncio.create_task(branch(fresh), context=contextvars.Context()))
            if arrived is not None:
                arrived(i, values[-1])
        return values

    context, _ = context_for(llm, strategy="self_consistency")
    context.fanout = elsewhere
    context.llm.sampling = Sampling(temperature=0.3)
    result = await SelfConsistency().reason("q", context=context, config={"samples": 3, "reasoning_effort": "medium"})
    assert result.answer == "4" and len(llm.requests) == 3
    assert all(r.reasoning_effort == "medium" and r.temperature == 0.3 for r in llm.requests)  # the caller's sampling kept


async def test_the_settings_end_with_the_strategy_that_set_them():
    llm = FunctionLLM(lambda request: "<answer>4</answer>")
    context, _ = context_for(llm)
    await ChainOfThought().reason("q", context=context, config={"thinking_budget": 64})
    await context.llm.complete(LLMRequest(messages=(user("after"),)))
    assert [r.thinking_budget for r in llm.requests] == [64, None]
    assert msgspec.structs.asdict(context.llm.sampling) == msgspec.structs.asdict(Sampling())


@pytest.mark.parametrize(
    "text", ["<think>Okay... the answer is 340 so far", "Okay... the answer is 340 so far</think>", "<thinking>the answer is 340 so far"]
)
def test_thinking_left_in_the_text_gives_no_answer(text):
    """Where a reply's thinking stayed in its text (no reasoning parser), an unclosed or opener-less block is thinking."""
    from reasonray.kernel.extraction import find_answer

    assert find_answer(text, numeric=True) is None
