"""`in_process_client`: reasonray.AsyncClient over an application in this process, with no server."""

from __future__ import annotations

import pytest

from reasonray import ReasonRayError
from reasonray.api.app import local_dispatcher
from reasonray.api.surfaces.local_http import in_process_client
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.kernel.config import ReasoningSettings


def dispatcher():
    reasoning = ReasoningSettings(enabled_strategies=["chain_of_thought", "bounded_context"], default_strategy="chain_of_thought")
    return local_dispatcher(reasoning, SimulatedLLM())


async def test_the_client_calls_the_methods_in_process():
    async with in_process_client(dispatcher()) as rr:
        result = await rr.execute("What is 17 * 23?")
        assert result["answer"] == "391" and result["strategy_used"] == "chain_of_thought" and result["trace_id"]
        assert [s["name"] for s in (await rr.strategies())["strategies"]] == ["chain_of_thought", "bounded_context"]
        with pytest.raises(ReasonRayError) as refused:
            await rr.execute("What is 17 * 23?", strategy="tree_of_thought")
        assert refused.value.code == -32002 and refused.value.trace_id


async def test_a_streamed_run_gives_its_events_then_the_result():
    async with in_process_client(dispatcher()) as rr:
        events = [e async for e in rr.execute_stream("[[sim think=9000 answer=5]] go", strategy="bounded_context")]
    assert "ITERATION_END" in [e.type for e in events]
    assert events[-1].type == "result" and events[-1].data["answer"] == "5"
