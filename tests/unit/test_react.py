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
