"""What a finished run hands the memory bank's statistics: the counts a Ray client adds up before it sends them."""

from __future__ import annotations

import asyncio

from reasonray.api.service import ExecuteParams, ReasoningService
from reasonray.gateway.testing import FunctionLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.config import MemorySettings, ReasoningSettings
from reasonray.strategies.registry import StrategyRegistry, build_catalogue


class CountingBank:
    """Takes the run records the service sends; nothing else of a memory client is called without `memory`."""

    def __init__(self) -> None:
        self.recorded: list[tuple[dict, bool]] = []
        self.arrived = asyncio.Event()

    async def record_run(self, tally: dict, ok: bool) -> None:
        self.recorded.append((tally, ok))
        self.arrived.set()


async def test_a_runs_tally_reaches_the_bank_as_numbers_only():
    catalogue = build_catalogue(
        StrategyRegistry().discover(),
        ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"),
    )
    bank = CountingBank()
    service = ReasoningService(
        catalogue,
        FunctionLLM(lambda request: "<answer>ok</answer>"),
        counter_for_model("function"),
        memory=bank,  # type: ignore[arg-type]
        memory_settings=MemorySettings(passive_learning=False),
    )
    await service.execute(ExecuteParams(query="What is 6 * 7?"), "t-run-end")
    await asyncio.wait_for(bank.arrived.wait(), 5)
    [(tally, ok)] = bank.recorded
    assert ok and set(tally) == {"calls", "cache_hits", "retries", "prompt_tokens", "completion_tokens"}
    assert tally["calls"] == 1 and all(type(v) is int for v in tally.values())  # a batch adds them with int()
