"""Runs a strategy in-process the way the service does, for unit tests."""

from __future__ import annotations

from pathlib import Path

from reasonray.gateway.observed import ObservedLLM
from reasonray.gateway.tokens import counter_of
from reasonray.kernel.events import EventRecorder
from reasonray.strategies.base import StrategyContext


def context_for(llm, *, strategy: str = "test", path: Path | None = None, keep: bool = True) -> tuple[StrategyContext, EventRecorder]:
    recorder = EventRecorder(path, keep=keep)
    context = StrategyContext(
        llm=ObservedLLM(llm, recorder, trace_id="trace-test", strategy=strategy),
        tokens=counter_of(llm),  # the stack's own counter (the model's tokens when it has them), as the service takes it
        emit=recorder,
        trace_id="trace-test",
    )
    return context, recorder
