"""Runs a strategy in-process the way the service does, for unit tests."""

from __future__ import annotations

from pathlib import Path

from gateway.tokens import counter_for_model
from reasonray.events import EventRecorder, ObservedLLM
from strategies.base import StrategyContext


def context_for(llm, *, strategy: str = "test", path: Path | None = None, keep: bool = True) -> tuple[StrategyContext, EventRecorder]:
    recorder = EventRecorder(path, keep=keep)
    context = StrategyContext(
        llm=ObservedLLM(llm, recorder, trace_id="trace-test", strategy=strategy),
        tokens=counter_for_model(llm.model),
        emit=recorder,
        trace_id="trace-test",
    )
    return context, recorder
