"""Runs a strategy in-process the way the service does, for unit tests."""

from __future__ import annotations

from pathlib import Path

from reasonray.gateway.observed import ObservedLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.events import EventRecorder
from reasonray.strategies.base import StrategyContext


def context_for(llm, *, strategy: str = "test", path: Path | None = None, keep: bool = True) -> tuple[StrategyContext, EventRecorder]:
    recorder = EventRecorder(path, keep=keep)
    context = StrategyContext(
        llm=ObservedLLM(llm, recorder, trace_id="trace-test", strategy=strategy),
        tokens=counter_for_model(llm.model),
        emit=recorder,
        trace_id="trace-test",
    )
    return context, recorder
