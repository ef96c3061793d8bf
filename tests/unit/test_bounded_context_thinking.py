"""bounded_context on a model that thinks: the delethink carryover (the model's own thinking continued from its
head and raw tail), auto mode, the summary and tail modes carried by the thinking, small chunks, and unfinished
thinking never read as an answer."""

import itertools

import pytest

from reasonray.gateway.protocol import Choice, Completion, Usage
from reasonray.gateway.testing import ScriptedLLM
from reasonray.gateway.tokens import count_messages
from reasonray.kernel.errors import InvalidParamsError, ModelBehaviorError
from reasonray.strategies.bounded_context import BoundedContext
from tests.unit.strategy_harness import context_for
from tests.unit.thinking_model import COUNTER, ThinkingModel


async def run(llm, query="Add up the numbers one step at a time.", **config):
    context, recorder = context_for(llm, strategy="bounded_context")
    result = await BoundedContext().reason(query, context=context, config=config)
    return result, recorder


def events(recorder, kind):
    return [e for e in recorder.events if type(e).__name__ == kind]


def chunks_of(llm):
    return [c for c in llm.calls if c.request.purpose is None]


SMALL = {"chunk_size": 512, "carryover_size": 128, "head_tokens": 32}


async def delethink(think: int, max_iterations: int):
    """A run in SMALL chunks over a model that thinks `think` tokens: the model, the result, the events, the
    chunks and the strategy's own metrics."""
    llm = ThinkingModel(think=think)
    result, recorder = await run(llm, max_iterations=max_iterations, **SMALL)
    return llm, result, recorder, chunks_of(llm), result.metrics.strategy_specific


async def test_delethink_continues_the_thinking_every_chunk_and_forces_the_answer_when_iterations_run_out():
    llm, result, recorder, chunks, specific = await delethink(think=2000, max_iterations=4)
    assert result.answer == "7" and specific["stopped_by"] == "final_answer" and specific["carryover_mode"] == "delethink"
    assert len(chunks) == 4 and not any(c.finished for c in chunks)  # every chunk cut mid-thinking
    # progress every chunk: each resumes where the one before got to, none starts over
    assert [c.resumed_from for c in chunks[1:]] == [c.reached for c in chunks[:-1]]
    assert all(c.resumed_from > 0 for c in chunks[1:])
    prompts = [(c.request.messages, c.request.continue_thinking) for c in chunks]
    assert all(a != b for a, b in itertools.pairwise(prompts))
    head = COUNTER.head(chunks[0].thinking, 32)
    for before, chunk in itertools.pairwise(chunks):
        kept = chunk.request.continue_thinking
        # the query, as the first chunk had it; from the second chunk on under delethink's own instructions
        assert chunk.request.messages[-1] == chunks[0].request.messages[-1] and chunk.request.messages == chunks[1].request.messages
        assert kept.startswith(head)  # the first thinking tokens, verbatim
        assert kept.endswith(COUNTER.tail(before.thinking, 100))  # the raw tail: the newest thinking, continued
        assert COUNTER.count(kept) <= 32 + 128 + 2
        assert count_messages(COUNTER, chunk.request.messages) + COUNTER.count(kept) + chunk.request.max_tokens <= 512
        assert chunk.request.stop == ()
    final = llm.calls[-1].request
    assert final.purpose == "final_answer" and final.thinking_budget == 0
    assert final.continue_thinking.startswith(head) and final.continue_thinking.endswith(COUNTER.tail(chunks[-1].thinking, 100))
    for record in specific["iterations"]:
        assert record["thinking_tokens"] > 0 and record["thinking_finished"] is False and record["stop"] == "thinking"
        assert record["carryover_tokens"] > 0
    assert [i["continued_tokens"] > 0 for i in specific["iterations"]] == [False, True, True, True]
    ends = events(recorder, "IterationEnd")
    assert [e.thinking_finished for e in ends] == [False] * 4 and all(e.thinking_tokens > 0 for e in ends)
    assert [c.mode for c in events(recorder, "Carryover")] == ["delethink"] * 4


async def test_delethink_answers_once_the_thinking_closes():
    llm, result, _, chunks, specific = await delethink(think=700, max_iterations=10)
    assert result.answer == "7" and specific["stopped_by"] == "answer" and specific["found_by"] == "tag"
    assert chunks[-1].finished and chunks[-1].reached == 700 and len(llm.calls) == len(chunks)  # no forced call
    assert [i["thinking_finished"] for i in specific["iterations"]] == [False] * (len(chunks) - 1) + [True]


async def test_auto_is_delethink_for_a_thinking_model_and_tail_for_one_that_does_not_think():
    thinking, _ = await run(ThinkingModel(think=700), max_iterations=10, **SMALL)
    assert thinking.metrics.strategy_specific["carryover_mode"] == "delethink"
    plain = ScriptedLLM(["Step 1: partial work", "so it is <answer>5"])
    result, _ = await run(plain, query="q")
    assert result.metrics.strategy_specific["carryover_mode"] == "tail" and result.answer == "5"
    assert plain.requests[1].continue_thinking is None and "Step 1: partial work" in plain.requests[1].messages[-1].content


@pytest.mark.parametrize("mode", ["summary", "tail"])
async def test_a_chunk_cut_while_thinking_is_carried_by_its_thinking_so_no_chunk_starts_over(mode):
    """Was: the carryover came from the chunk's empty answer text, and every later chunk started over."""
    llm = ThinkingModel(think=2000)
    result, recorder = await run(llm, max_iterations=10, carryover_mode=mode, chunk_size=1024, carryover_size=256, head_tokens=32)
    chunks = chunks_of(llm)
    assert result.answer == "7" and result.metrics.strategy_specific["carryover_mode"] == mode
    assert len(chunks) >= 3 and all(c.resumed_from > 0 for c in chunks[1:])
    assert all(later.reached > earlier.reached for earlier, later in itertools.pairwise(chunks))
    assert all("[progress" in c.text for c in events(recorder, "Carryover"))


async def test_the_papers_defaults_are_the_defaults():
    llm = ThinkingModel(think=20_000)
    result, _ = await run(llm, max_iterations=5)
    chunks = chunks_of(llm)
    assert result.answer == "7" and len(chunks) == 5 and result.metrics.strategy_specific["stopped_by"] == "final_answer"
    first, later = chunks[0].request, chunks[1].request
    assert count_messages(COUNTER, first.messages) + first.max_tokens <= 8192
    assert 4096 <= COUNTER.count(later.continue_thinking) <= 4096 + 100 + 2  # 4,096 carried after 100 kept
    assert result.metrics.strategy_specific["reasoning_capacity_tokens"] == 8192 + 4 * 4096


async def test_chunks_of_128_tokens_run_several_in_delethink_mode():
    llm = ThinkingModel(think=300)
    result, _ = await run(llm, max_iterations=10, carryover_mode="delethink", chunk_size=128, carryover_size=16, head_tokens=8)
    chunks = chunks_of(llm)
    assert result.answer == "7" and len(chunks) >= 4 and all(c.resumed_from > 0 for c in chunks[1:])
    for c in chunks:
        assert count_messages(COUNTER, c.request.messages) + COUNTER.count(c.request.continue_thinking or "") + c.request.max_tokens <= 128


async def test_chunks_of_256_tokens_let_a_small_model_that_does_not_think_run_four():
    """SmolLM2-135M's 4,096-token context holds every chunk; 256-token chunks make it reason in several."""
    llm = ScriptedLLM([f"Step {i}: the running total is {10 * i}." for i in range(1, 5)] + ["<answer>40</answer>"])
    result, _ = await run(llm, max_iterations=5, chunk_size=256, carryover_size=32, head_tokens=16)
    llm.assert_complete()
    assert result.answer == "40" and result.metrics.strategy_specific["total_iterations"] == 5
    for i, request in enumerate(llm.requests[1:], start=1):
        assert f"the running total is {10 * i}" in request.messages[-1].content
        assert count_messages(COUNTER, request.messages) + request.max_tokens <= 256


async def test_a_chunk_that_carries_nothing_new_stops_the_chunking():
    """A model that thinks out of sight leaves nothing to continue: the answer is asked for at once, not the same
    empty chunk again until the iterations run out."""
    hidden = Completion(choices=(Choice(text="", finish_reason="length", thinking_unfinished=True),), usage=Usage(50, 400, 400), model="o")
    llm = ScriptedLLM([hidden, "<answer>12</answer>"])
    result, recorder = await run(llm, max_iterations=5)
    llm.assert_complete()
    assert result.answer == "12" and result.metrics.strategy_specific["stopped_by"] == "final_answer"
    assert llm.requests[1].purpose == "final_answer" and llm.requests[1].thinking_budget == 0
    assert [w.code for w in events(recorder, "RunWarning")] == ["no_progress"]


R1_CUT = Completion(
    choices=(Choice(text="", finish_reason="length", reasoning="Okay... the answer is 340 so far", thinking_unfinished=True),),
    usage=Usage(40, 12, 12),
    model="r1",
)


async def test_unfinished_thinking_is_never_the_answer_even_when_it_states_one():
    still_thinking = Completion(
        choices=(Choice(text="", finish_reason="length", reasoning="Wait, 340 + 51 is", thinking_unfinished=True),),
        usage=Usage(60, 8, 8),
        model="r1",
    )
    llm = ScriptedLLM([R1_CUT, still_thinking, still_thinking])
    with pytest.raises(ModelBehaviorError, match="it ended still thinking") as err:
        await run(llm, max_iterations=2, chunk_size=1024, carryover_size=256)
    assert "340 so far" not in str(err.value) and err.value.partial_result["total_iterations"] == 2
    assert [i["stop"] for i in err.value.partial_result["iterations"]] == ["thinking", "thinking"]


@pytest.mark.parametrize(
    "config,field",
    [({"chunk_size": 100, "carryover_size": 16}, "chunk_size"), ({"chunk_size": 128, "carryover_size": 8}, "carryover_size")],
)
async def test_chunks_below_the_floor_are_refused_naming_the_field(config, field):
    with pytest.raises(InvalidParamsError, match=f"{field}: Input should be greater than or equal to"):
        await run(ScriptedLLM([]), **config)


async def test_a_continuation_that_adds_no_thinking_is_not_sent_again():
    """Two chunks may never get the same prompt: a chunk that added nothing to the thinking has the answer forced."""
    first = Completion(
        choices=(Choice(text="", finish_reason="length", reasoning="Let me add 3 and 4.", thinking_unfinished=True),),
        usage=Usage(30, 6, 6),
        model="r1",
    )
    nothing = Completion(choices=(Choice(text="", finish_reason="length", thinking_unfinished=True),), usage=Usage(36, 1, 1), model="r1")
    llm = ScriptedLLM([first, nothing, "<answer>7</answer>"])
    result, recorder = await run(llm, max_iterations=5, chunk_size=1024, carryover_size=256)
    llm.assert_complete()
    assert result.answer == "7" and [w.code for w in events(recorder, "RunWarning")] == ["no_progress"]
    assert llm.requests[1].continue_thinking == llm.requests[2].continue_thinking == "Let me add 3 and 4."
    assert llm.requests[2].thinking_budget == 0 and llm.requests[2].purpose == "final_answer"


@pytest.mark.parametrize("ending", [("Step 1: 17 * 20 = 340.", "length"), ("Step 1: 17 * 20 = 340. <continue>", "stop")])
async def test_auto_keeps_tail_for_a_model_that_reasons_in_the_open_with_thinking_asides(ending):
    """Visible reasoning still going when the chunk ends (its asides handed over apart): its tail is what to carry."""
    text, finish = ending
    open_reasoning = Completion(
        choices=(Choice(text=text, finish_reason=finish, reasoning="scratch: 2 * 17"),), usage=Usage(40, 30, 5), model="m"
    )
    llm = ScriptedLLM([open_reasoning, "Step 2: 340 + 51 = 391. <answer>391</answer>"])
    result, _ = await run(llm, query="What is 17 * 23?")
    assert result.answer == "391" and result.metrics.strategy_specific["carryover_mode"] == "tail"
    assert llm.requests[1].continue_thinking is None and "17 * 20 = 340" in llm.requests[1].messages[-1].content
