"""ReAct (Yao et al., 2022) on the session reasoner's tool loop: think, act with a server tool, observe, repeat.

The query becomes a one-turn conversation for `reasoner.TurnReasoner`, with the server tools the
config names (OpenAI function calling) and no client tools, so `reasoning.execute` can use tools.
The loop's rules hold: an unknown tool is a hard error (-32010), the first failing tool ends the run
(-32006), and `max_tool_calls` bounds the steps that call tools (-32001 beyond it). The run's
CompositionTrace steps are its events.

A model left to itself may never act: where the endpoint enforces `tool_choice`, the first step is
required to call a tool (`require_tool_call`). A call whose arguments are not JSON, or do not fit the
tool, is sent back to the model with the error (`argument_retries` times) before it fails the run.
The final reply's answer is its `<answer>`, else the answer it states ("The answer is: 76"), else a
final number for a numeric question, else the whole reply (`found_by`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from reasonray.gateway.capabilities import capabilities_of
from reasonray.gateway.protocol import Message
from reasonray.kernel.extraction import find_answer, numeric_question
from reasonray.kernel.sandbox import SandboxLimits
from reasonray.reasoner.builtin_tools import builtin_toolbox
from reasonray.reasoner.executor import ToolExecutor
from reasonray.reasoner.providers import ContextProviders, ModeSpec, ModeState
from reasonray.reasoner.reasoner import AwaitingClient, TurnReasoner
from reasonray.strategies.base import (
    ReasoningResult,
    Strategy,
    StrategyConfig,
    StrategyContext,
    StrategySettings,
)

SYSTEM_PROMPT = (
    "Answer the question. Work in steps: think about what you need (inside <thinking>...</thinking>), "
    "call a tool when it helps, read its result, and repeat. When you know the answer, reply with it "
    "inside <answer>...</answer> and call no tool."
)


class ReActConfig(StrategyConfig):
    max_tool_calls: int = Field(10, ge=1, le=50, description="Most model steps that call tools before the answer is due.")
    tools: list[str] = Field(["calculator", "python"], description="Server tools the model may call (calculator, python).")
    max_tokens: int = Field(2048, ge=16, le=32_768, description="Most tokens per model step.")
    system_prompt: str = Field(SYSTEM_PROMPT, min_length=1, max_length=20_000, description="Instructions for the model.")
    require_tool_call: bool = Field(
        True, description='The first step must call a tool (tool_choice "required"), where the endpoint enforces tool_choice.'
    )
    argument_retries: int = Field(
        2, ge=0, le=10, description="Tool calls with unusable arguments sent back to the model with the error before one fails the run."
    )


class ReActSettings(StrategySettings):
    code_timeout_s: float = Field(5.0, gt=0, le=120, description="Wall-clock limit of one run of the python tool.")
    code_memory_mb: int = Field(256, ge=32, le=8192, description="Address-space limit of one run of the python tool.")


class ReAct(Strategy):
    name = "react"
    description = "Reason and act: the model calls server tools (calculator, sandboxed python) until it can answer."
    Config = ReActConfig
    Settings = ReActSettings
    extra_capabilities = ("reasoning.tools",)

    def __init__(self, settings: StrategySettings | None = None) -> None:
        super().__init__(settings)
        self.toolbox = builtin_toolbox(SandboxLimits(self.settings.code_timeout_s, self.settings.code_memory_mb))

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        cfg = self.parse_config(config)
        tools = {t.name: t for t in self.toolbox.select(cfg.tools)}
        providers = ContextProviders(cfg.system_prompt, ModeState("react", {"react": ModeSpec()}), [Message(role="user", content=query)])
        executor = ToolExecutor(tools, {}, providers, context.emit, context.trace_id, self.name, argument_retries=cfg.argument_retries)
        forced = cfg.require_tool_call and capabilities_of(context.llm).tool_choice
        reasoner = TurnReasoner(
            context.llm,
            providers,
            executor,
            context.emit,
            context.trace_id,
            self.name,
            max_llm_calls=cfg.max_tool_calls + 1,
            max_tokens=cfg.max_tokens,
            first_tool_choice="required" if forced else None,
        )
        try:
            outcome = await reasoner.run()
        except BaseException:  # provider, budget, tool failure or cancellation: keep the steps so far
            # the tool calls made so far with what they returned (the observations), capped for the error
            observations = [
                {"tool": e.tool, "arguments": e.arguments[:2000], "status": e.status, "observation": (e.content or "")[:2000]}
                for e in providers.ledger.entries()
            ]
            context.progress.update(steps=reasoner.llm_calls, observations=observations)
            raise
        if isinstance(outcome, AwaitingClient):  # no client tools are offered, so the executor cannot hand any over
            raise AssertionError("react offers no client tools")
        answer, found_by = outcome.answer, outcome.found_by
        if found_by != "tag" and (stated := find_answer(answer, numeric=numeric_question(query))) is not None:
            answer, found_by = stated.answer, stated.found_by  # the whole reply: take the answer it states, as chain of thought would
        calls = [{"tool": e.tool, "arguments": e.arguments, "status": e.status} for e in providers.ledger.entries()]
        return context.result(self.name, answer, tool_calls=calls, steps=reasoner.llm_calls, found_by=found_by, tool_choice_forced=forced)
