import json

import pytest

from reasonray.gateway.capabilities import Capabilities
from reasonray.gateway.testing import ScriptedLLM
from reasonray.kernel.errors import ModelBehaviorError
from reasonray.strategies.chain_of_thought import SYSTEM_PROMPT, ChainOfThought
from tests.unit.strategy_harness import context_for as context


async def test_one_call_answer_extracted_and_thinking_stripped():
    llm = ScriptedLLM(["<thinking>17*23: 17*20=340, 17*3=51, 391</thinking>\n<answer>391</answer>"])
    ctx, recorder = context(llm)
    result = await ChainOfThought().reason("What is 17 * 23?", context=ctx, config={"max_tokens": 256})
    llm.assert_complete()
    assert result.answer == "391" and result.strategy_used == "chain_of_thought"
    [request] = llm.requests
    assert request.max_tokens == 256 and request.temperature == 0.0
    assert request.messages[0].content == SYSTEM_PROMPT and request.messages[1].content == "What is 17 * 23?"
    m = result.metrics
    assert m.llm_calls == 1 and m.total_tokens == m.prompt_tokens + m.completion_tokens > 0
    assert m.strategy_specific == {"found_by": "tag", "answer_tagged": True, "finish_reason": "stop", "truncated": False}
    [event] = recorder.events
    assert "<thinking>17*23" in event.responses[0]  # the full text stays in the event log


async def test_untagged_reply_falls_back_to_the_text_without_thinking():
    llm = ScriptedLLM(["<thinking>hmm</thinking>It is 12."])
    ctx, _ = context(llm)
    result = await ChainOfThought().reason("q", context=ctx)
    assert result.answer == "It is 12." and result.metrics.strategy_specific["answer_tagged"] is False
    assert result.metrics.strategy_specific["found_by"] == "whole_text"


async def test_config_schema_documents_every_field():
    schema = ChainOfThought().get_config_schema()
    assert all(prop.get("description") for prop in schema["properties"].values())
    assert ChainOfThought().get_capabilities()[0] == "reasoning.strategy.chain_of_thought"


@pytest.mark.parametrize(
    ("reply", "answer", "found_by"),
    [
        # what SmolLM2-135M answered through llama.cpp: no tags, a wrong product, then a verdict on itself
        ("17 * 23 = 380\nThe answer is correct.", "380", "final_number"),
        ("To find 17 times 23, multiply them.\nThe answer is: 391", "391", "phrase"),
        ("17 * 23 = 391\n#### 391", "391", "phrase"),
        ("So the product is \\boxed{391}.", "391", "phrase"),
        ("Answer: 391.", "391", "phrase"),
        ("<thinking>17*20=340</thinking> <answer>391</answer> The answer is: 7", "391", "tag"),
    ],
)
async def test_a_model_that_ignores_the_tags_still_has_its_answer_found(reply, answer, found_by):
    llm = ScriptedLLM([reply])
    ctx, recorder = context(llm)
    result = await ChainOfThought().reason("What is 17 * 23?", context=ctx)
    llm.assert_complete()
    assert result.answer == answer and result.metrics.strategy_specific["found_by"] == found_by
    warnings = [e for e in recorder.events if getattr(e, "code", None) == "answer_format"]
    assert (warnings != []) is (found_by not in ("tag", "json"))
    if warnings:
        assert found_by in warnings[0].message


async def test_a_prose_question_keeps_the_whole_reply_rather_than_a_stray_number():
    llm = ScriptedLLM(["Paris has been the capital of France since 987."])
    ctx, _ = context(llm)
    result = await ChainOfThought().reason("What is the capital of France?", context=ctx)
    assert result.answer == "Paris has been the capital of France since 987."
    assert result.metrics.strategy_specific["found_by"] == "whole_text"


async def test_an_endpoint_that_enforces_a_schema_is_asked_for_json():
    llm = ScriptedLLM([json.dumps({"reasoning": "17*20=340, 17*3=51", "answer": "391"})])
    llm.capabilities = Capabilities(structured_output=True)
    ctx, _ = context(llm)
    result = await ChainOfThought().reason("What is 17 * 23?", context=ctx)
    [request] = llm.requests
    assert request.response_format["type"] == "json_schema"
    assert request.response_format["json_schema"]["schema"]["required"] == ["reasoning", "answer"]
    assert '"answer"' in request.messages[0].content  # the prompt names the fields too
    assert result.answer == "391" and result.metrics.strategy_specific["found_by"] == "json"


async def test_an_endpoint_that_enforces_nothing_gets_no_response_format():
    llm = ScriptedLLM(["<answer>391</answer>"])
    ctx, _ = context(llm)
    await ChainOfThought().reason("What is 17 * 23?", context=ctx)
    assert llm.requests[0].response_format is None and llm.requests[0].messages[0].content == SYSTEM_PROMPT


async def test_a_reply_with_nothing_visible_is_a_model_behavior_error():
    llm = ScriptedLLM(["<thinking>17*23 is</thinking>"])
    ctx, _ = context(llm)
    with pytest.raises(ModelBehaviorError, match="held no answer"):
        await ChainOfThought().reason("What is 17 * 23?", context=ctx)
