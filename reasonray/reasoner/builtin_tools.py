"""The server tools ReasonRay ships: `calculator`, `python` (sandboxed) and `memory_search` (the ReasoningBank)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from reasonray.gateway.arithmetic import DEFAULT_MAX_RESULT_DIGITS, evaluate, format_number
from reasonray.kernel.sandbox import SandboxLimits, run_python
from reasonray.memory.items import WORKSPACE, MemoryItem, format_memory_block
from reasonray.memory.service import MemoryClient
from reasonray.reasoner.tools import ToolBox, server_tool


def builtin_toolbox(
    limits: SandboxLimits = SandboxLimits(),
    memory: MemoryClient | None = None,
    default_workspace: str = "default",
    max_calculator_digits: int = DEFAULT_MAX_RESULT_DIGITS,
) -> ToolBox:
    @server_tool
    def calculator(expression: Annotated[str, Field(max_length=2000, description="Arithmetic, e.g. (17 * 23) + 4 / 2")]) -> str:
        """Evaluate an arithmetic expression exactly: numbers and + - * / // % ** with parentheses."""
        try:
            return format_number(evaluate(expression, max_calculator_digits))
        except ZeroDivisionError:
            raise ValueError(f"division by zero in {expression!r}") from None

    @server_tool(name="python")
    async def run(code: Annotated[str, Field(max_length=50_000, description="A Python program; print what you need to see.")]) -> str:
        """Run a Python program in a sandbox (no network, no files of the host, limited time, memory and processes) and return its output."""
        result = await run_python(code, limits)
        if result.timed_out:
            raise TimeoutError(f"the program used up its time: {limits.timeout_s:g} s of CPU, {limits.wall_s:g} s in all")
        if result.exit_code != 0:
            raise RuntimeError(f"the program failed (exit {result.exit_code}): {result.stderr.strip()[-1500:]}")
        return result.stdout

    tools = ToolBox([calculator, run])
    if memory is not None:

        @server_tool(name="memory_search")
        async def search(
            query: Annotated[str, Field(min_length=1, max_length=5000, description="The task or question to find past lessons for.")],
            workspace: Annotated[str | None, Field(pattern=WORKSPACE, description="Workspace to search; default: the server's.")] = None,
            top_k: Annotated[int, Field(ge=1, le=5, description="Past tasks whose lessons to return.")] = 1,
        ) -> str:
            """Search the reasoning memory for lessons from similar past tasks (warnings mark past failures)."""
            found = await memory.retrieve(query, workspace or default_workspace, top_k=top_k)
            items = [MemoryItem.model_validate(r["memory"]) for r in found]
            return format_memory_block(items) or "No memories of similar tasks."

        tools.add(search)
    return tools
