"""The server tools ReasonRay ships: `calculator` and `python` (sandboxed)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gateway.arithmetic import evaluate, format_number
from reasonray.sandbox import SandboxLimits, run_python
from reasoner.tools import ServerTool, ToolBox, server_tool


@server_tool
def calculator(expression: Annotated[str, Field(max_length=2000, description="Arithmetic, e.g. (17 * 23) + 4 / 2")]) -> str:
    """Evaluate an arithmetic expression exactly: numbers and + - * / // % ** with parentheses."""
    try:
        return format_number(evaluate(expression))
    except ZeroDivisionError:
        raise ValueError(f"division by zero in {expression!r}") from None


def python_tool(limits: SandboxLimits) -> ServerTool:
    @server_tool(name="python")
    async def run(code: Annotated[str, Field(max_length=50_000, description="A Python program; print what you need to see.")]) -> str:
        """Run a Python program in a sandbox (no network, no subprocesses, limited time and memory) and return its output."""
        result = await run_python(code, limits)
        if result.timed_out:
            raise TimeoutError(f"the program ran longer than {limits.timeout_s} s")
        if result.exit_code != 0:
            raise RuntimeError(f"the program failed (exit {result.exit_code}): {result.stderr.strip()[-1500:]}")
        return result.stdout

    return run


def builtin_toolbox(limits: SandboxLimits = SandboxLimits()) -> ToolBox:
    return ToolBox([calculator, python_tool(limits)])
