"""ReAct on the tool loop: server tools only, the loop's failure policy, the call budget."""

import json

import pytest

from reasonray.gateway.protocol import ToolCall
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import ScriptedLLM
from reasonray.kernel.errors import (
    MaxLLMCallsError,
    ToolFailedError,
    UnregisteredToolError,
)
from reasonray.strategies.react import ReAct
from tests.unit.strategy_harness import context_for


def call(id, name, **arguments):
    return ToolCall(id=id, name=name, arguments=json.dumps(arguments))


async def test_tools_then_answer_with_the_trace_as_events():
    llm = ScriptedLLM([call("c1", "calculator", expression="17*23"), call("p1", "python", code="print(391 + 1)"), "<answer>392</answer>"])
    ctx, recorder = context_for(llm, strategy="react")
    result = await ReAct().reason("What is 17*23 + 1?", context=ctx, config={})
    llm.assert_complete()
    assert result.answer == "392" and result.metrics.llm_calls == 3
    assert [c["tool"] for c in result.metrics.strategy_specific["tool_calls"]] == ["calculator", "python"]
    kinds = [type(e).__name__ for e in recorder.events]
    assert kinds.count("ToolExecuted") == 2 and kinds[-1] == "Exited"
    assert {t["function"]["name"] for t in llm.requests[0].tools} == {"calculator", "python"}


async def test_only_the_configured_tools_are_offered_and_others_are_refused():
    llm = ScriptedLLM([call("p1", "python", code="print(1)")])
    ctx, _ = context_for(llm, strategy="react")
    with pytest.raises(UnregisteredToolError, match="'python', not available"):
        await ReAct().reason("q", context=ctx, config={"tools": ["calculator"]})


async def test_a_failing_tool_and_the_budget_end_the_run():
    ctx, _ = context_for(ScriptedLLM([call("c1", "calculator", expression="import os")]), strategy="react")
    with pytest.raises(ToolFailedError, match="calculator"):
        await ReAct().reason("q", context=ctx, config={})
    endless = ScriptedLLM([call(f"c{i}", "calculator", expression="1+1") for i in range(3)])
    ctx, _ = context_for(endless, strategy="react")
    with pytest.raises(MaxLLMCallsError, match="limit 3"):
        await ReAct().reason("q", context=ctx, config={"max_tool_calls": 2})


async def test_on_the_simulator_the_call_directive_drives_the_tools():
    ctx, _ = context_for(SimulatedLLM(), strategy="react")
    result = await ReAct().reason('Powers of two [[sim call=python {"code": "print(2**20)"}]]', context=ctx, config={})
    assert result.answer == "1048576" and result.metrics.simulated


def capable(replies, **caps):
    from reasonray.gateway.capabilities import Capabilities

    llm = ScriptedLLM(replies)
    llm.capabilities = Capabilities(**caps)
    return llm


async def test_the_first_step_is_forced_to_call_a_tool_where_the_endpoint_enforces_tool_choice():
    llm = capable([call("c1", "calculator", expression="17*23"), "<answer>391</answer>"], tool_choice=True)
    ctx, _ = context_for(llm, strategy="react")
    result = await ReAct().reason("What is 17*23?", context=ctx, config={})
    assert [r.tool_choice for r in llm.requests] == ["required", None]  # then the model may answer
    assert result.answer == "391" and result.metrics.strategy_specific["tool_choice_forced"] is True


@pytest.mark.parametrize(("caps", "config"), [({}, {}), ({"tool_choice": True}, {"require_tool_call": False})])
async def test_no_tool_choice_is_sent_where_it_is_not_enforced_or_not_wanted(caps, config):
    llm = capable(["<answer>391</answer>"], **caps)
    ctx, _ = context_for(llm, strategy="react")
    result = await ReAct().reason("What is 17*23?", context=ctx, config=config)
    assert llm.requests[0].tool_choice is None and result.metrics.strategy_specific["tool_choice_forced"] is False


async def test_arguments_that_are_not_json_go_back_to_the_model_with_the_error():
    # what a forced call from SmolLM2 looked like: arguments that are not JSON
    broken = ToolCall(id="c1", name="calculator", arguments="{expression: 17*23")
    llm = ScriptedLLM([broken, call("c2", "calculator", expression="17*23"), "<answer>391</answer>"])
    ctx, recorder = context_for(llm, strategy="react")
    result = await ReAct().reason("What is 17*23?", context=ctx, config={})
    llm.assert_complete()
    assert result.answer == "391"
    assert [(c["tool"], c["status"]) for c in result.metrics.strategy_specific["tool_calls"]] == [
        ("calculator", "rejected"),
        ("calculator", "ok"),
    ]
    [tool_message] = [m for m in llm.requests[1].messages if m.role == "tool"]
    assert (
        tool_message.content.startswith("error: arguments for calculator: value: Invalid JSON")
        and "Call calculator again" in tool_message.content
    )
    executed = [e for e in recorder.events if type(e).__name__ == "ToolExecuted"]
    assert [e.status for e in executed] == ["rejected", "ok"]


async def test_unusable_arguments_beyond_the_retries_fail_the_run_with_a_classified_error():
    broken = [ToolCall(id=f"c{i}", name="calculator", arguments='{"expr": 1}') for i in range(2)]
    ctx, _ = context_for(ScriptedLLM(broken), strategy="react")
    with pytest.raises(ToolFailedError, match="arguments for calculator: expression: Field required"):
        await ReAct().reason("What is 17*23?", context=ctx, config={"argument_retries": 1})


@pytest.mark.parametrize(
    ("reply", "answer", "found_by"),
    [
        ("17*23 + 1 = 392\nThe answer is correct.", "392", "final_number"),
        ("The calculator says 392. The answer is: 392", "392", "phrase"),
        ("<answer>392</answer>", "392", "tag"),
    ],
)
async def test_an_untagged_final_reply_has_its_answer_found(reply, answer, found_by):
    llm = ScriptedLLM([call("c1", "calculator", expression="17*23+1"), reply])
    ctx, _ = context_for(llm, strategy="react")
    result = await ReAct().reason("What is 17*23 + 1?", context=ctx, config={})
    assert result.answer == answer and result.metrics.strategy_specific["found_by"] == found_by
