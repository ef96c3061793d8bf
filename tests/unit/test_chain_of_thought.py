from reasonray.gateway.testing import ScriptedLLM
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
    assert m.strategy_specific == {"answer_tagged": True, "finish_reason": "stop", "truncated": False}
    [event] = recorder.events
    assert "<thinking>17*23" in event.responses[0]  # the full text stays in the event log


async def test_untagged_reply_falls_back_to_the_text_without_thinking():
    llm = ScriptedLLM(["<thinking>hmm</thinking>It is 12."])
    ctx, _ = context(llm)
    result = await ChainOfThought().reason("q", context=ctx)
    assert result.answer == "It is 12." and result.metrics.strategy_specific["answer_tagged"] is False


async def test_config_schema_documents_every_field():
    schema = ChainOfThought().get_config_schema()
    assert all(prop.get("description") for prop in schema["properties"].values())
    assert ChainOfThought().get_capabilities()[0] == "reasoning.strategy.chain_of_thought"
