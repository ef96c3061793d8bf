"""Tools: server tools (run here, registered with one decorated function) and client tools (run by the caller).

A server tool is an async or sync function with a typed signature; `@server_tool` turns it into an
OpenAI function schema (from the signature, `Annotated[..., Field(description=...)]` and the
docstring) and a validated call. A client tool is only a schema: the turn hands its calls to the
client and waits for the results (exit mode 2).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from reasonray.kernel.errors import InvalidParamsError, ReasonRayError, describe_errors


class ToolArgumentsError(ReasonRayError):
    """The model's arguments for a tool are not valid JSON or do not fit the tool's parameters."""


@dataclass(frozen=True)
class ServerTool:
    name: str
    description: str
    arguments: type[BaseModel]
    fn: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        parameters = self.arguments.model_json_schema()
        parameters.pop("title", None)
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": parameters}}

    def parse(self, arguments: str) -> BaseModel:
        try:
            return self.arguments.model_validate_json(arguments or "{}")
        except ValidationError as exc:
            raise ToolArgumentsError(f"arguments for {self.name}: {describe_errors(exc)}") from None

    async def __call__(self, arguments: str) -> str:
        parsed = self.parse(arguments)
        result = self.fn(**{name: getattr(parsed, name) for name in type(parsed).model_fields})
        if inspect.isawaitable(result):
            result = await result
        return result if isinstance(result, str) else json.dumps(result)


def server_tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorator: a typed function becomes a ServerTool (usable bare or with `name=`)."""

    def wrap(f: Callable[..., Any]) -> ServerTool:
        fields: dict[str, Any] = {}
        for param in inspect.signature(f, eval_str=True).parameters.values():
            if param.annotation is inspect.Parameter.empty:
                raise TypeError(f"tool {f.__name__}: parameter {param.name!r} needs a type annotation")
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (param.annotation, default)
        model = create_model(f"{f.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        return ServerTool(name or f.__name__, inspect.getdoc(f) or "", model, f)

    return wrap(fn) if fn is not None else wrap


class ClientFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="Tool name (OpenAI's rules).")
    description: str = Field("", max_length=4000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ClientTool(BaseModel):
    """A tool the client runs, as an OpenAI function schema (`{"type": "function", "function": {...}}`)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"] = "function"
    function: ClientFunction

    @property
    def name(self) -> str:
        return self.function.name


class ToolBox:
    """The server tools this process can run, by name."""

    def __init__(self, tools: list[ServerTool] | None = None) -> None:
        self.tools: dict[str, ServerTool] = {}
        for tool in tools or []:
            self.add(tool)

    def add(self, tool: ServerTool) -> None:
        if tool.name in self.tools:
            raise TypeError(f"two server tools are named {tool.name!r}")
        self.tools[tool.name] = tool

    def select(self, names: list[str]) -> list[ServerTool]:
        if unknown := [n for n in names if n not in self.tools]:
            raise InvalidParamsError(
                f"unknown server tools {unknown}; available: {', '.join(sorted(self.tools))}",
                {"unknown": unknown, "available": sorted(self.tools)},
            )
        return [self.tools[n] for n in names]
