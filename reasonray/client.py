"""The Python client of a running ReasonRay service: `Client` (blocking) and `AsyncClient` (asyncio), over httpx.

    from reasonray import Client

    with Client("http://127.0.0.1:8000") as rr:
        print(rr.execute("What is 17 * 23?")["answer"])

Every method is one JSON-RPC call (docs/api.md) with the method's params as keyword arguments; a
JSON-RPC error raises `ReasonRayError` with its code, message and data. `execute_stream` reads
`reasoning.execute` with `stream: true` as the run's events arrive. The client talks HTTP only: it
imports nothing of the server. `transport` takes any httpx transport; `reasonray.api.surfaces.local_http.
in_process_client(dispatcher)` gives an `AsyncClient` over an application in this process (notebooks,
scripts), with no server.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


class ReasonRayError(Exception):
    """A JSON-RPC error from the service (codes: docs/api.md, "Errors")."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data or {}

    @property
    def trace_id(self) -> str | None:
        return self.data.get("trace_id")


@dataclass(frozen=True)
class StreamEvent:
    """One event of a streamed run: `type` is the event's (LLM_INVOCATION, ITERATION_END, ...) or `result`
    for the last one, whose `data` is the run's result."""

    type: str
    data: dict[str, Any]


def _params(values: dict[str, Any]) -> dict[str, Any]:
    """A call's params from a method's arguments (its `locals()`): those given, by the method's own names."""
    return {k: v for k, v in values.items() if v is not None and k != "self"}


def _result(body: Any) -> Any:
    if "error" in body:
        error = body["error"]
        raise ReasonRayError(error["code"], error["message"], error.get("data"))
    return body["result"]


class _Sse:
    """Parses Server-Sent Events line by line: `feed` returns the StreamEvent a line ends (the `response` event
    is the run's result)."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> StreamEvent | None:
        if line.startswith("event:"):
            self.event = line[6:].strip()
        elif line.startswith("data:"):
            self.data.append(line[5:].removeprefix(" "))
        elif not line and self.data:
            event, data = self.event, json.loads("\n".join(self.data))
            self.event, self.data = "message", []
            return StreamEvent("result", _result(data)) if event == "response" else StreamEvent(event, data)
        return None


class _Methods:
    """The typed API: each method builds one call; `_call` (sync or async) sends it over `http`, an httpx client of
    `_http` (`httpx.Client` or `httpx.AsyncClient`) with the given base URL, timeout, headers and transport."""

    _http: Any

    def __init__(
        self, base_url: str = DEFAULT_URL, *, timeout: float = 600.0, headers: dict[str, str] | None = None, transport: Any = None
    ) -> None:
        self.http = self._http(base_url=base_url.rstrip("/"), timeout=timeout, headers=headers, transport=transport)
        self._ids = itertools.count(1)

    def _call(self, method: str, params: dict[str, Any]) -> Any:
        raise NotImplementedError

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Any JSON-RPC method by name (awaited on the `AsyncClient`)."""
        return self._call(method, params or {})

    def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "method": method, "params": params, "id": next(self._ids)}

    def _stream_request(self, query: str, options: dict[str, Any]) -> dict[str, Any]:
        return self._request("reasoning.execute", {**_params({"query": query, **options}), "stream": True})

    # -- reasoning ------------------------------------------------------------------------------------
    def execute(
        self,
        query: str,
        *,
        strategy: str | None = None,
        strategy_config: dict[str, Any] | None = None,
        agent_id: str | None = None,
        include_trace: bool = False,
        memory: dict[str, Any] | None = None,
        budget: dict[str, Any] | None = None,
        reasoning_effort: str | None = None,
        thinking_budget: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> Any:
        """reasoning.execute: the answer, metrics (`reasoning_tokens` among them), the model's thinking behind the
        answer (`reasoning`), trace id and resolution. `reasoning_effort` ("low", "medium", "high") and
        `thinking_budget` (tokens) apply to every model call of the run; `extra_body` (trusted callers only) is
        passed into each call's request body (docs/reasoning-models.md)."""
        return self._call("reasoning.execute", _params(locals()))

    def strategies(self) -> Any:
        """reasoning.strategies: the enabled strategies with their config schemas, and the default."""
        return self._call("reasoning.strategies", {})

    def discover(self) -> Any:
        """rpc.discover: the OpenRPC document of the API."""
        return self._call("rpc.discover", {})

    # -- agents ---------------------------------------------------------------------------------------
    def register_agent(self, card: dict[str, Any]) -> Any:
        """agent.register: register or replace an AgentCard."""
        return self._call("agent.register", card)

    def get_agent(self, agent_id: str) -> Any:
        return self._call("agent.get", {"agent_id": agent_id})

    def list_agents(self) -> Any:
        return self._call("agent.list", {})

    def discover_agents(self, capabilities: list[str] | None = None) -> Any:
        return self._call("agent.discover", {"capabilities": capabilities or []})

    def unregister_agent(self, agent_id: str) -> Any:
        return self._call("agent.unregister", {"agent_id": agent_id})

    # -- sessions -------------------------------------------------------------------------------------
    def create_session(
        self,
        *,
        server_tools: list[str] | None = None,
        client_tools: list[dict[str, Any]] | None = None,
        mode: str | None = None,
        modes: dict[str, Any] | None = None,
        bootstrap: str | None = None,
        system_prompt: str | None = None,
        max_llm_calls: int | None = None,
    ) -> Any:
        """session.create: returns the session's id, status and tools."""
        return self._call("session.create", _params(locals()))

    def turn(self, session_id: str, message: str) -> Any:
        """session.turn: `completed` with the answer, or `awaiting_client_tools` with the pending calls."""
        return self._call("session.turn", {"session_id": session_id, "message": message})

    def resume(self, session_id: str, tool_results: list[dict[str, Any]]) -> Any:
        """session.resume: the pending calls' results (`tool_call_id`, `content`, `is_error`)."""
        return self._call("session.resume", {"session_id": session_id, "tool_results": tool_results})

    def get_session(self, session_id: str) -> Any:
        return self._call("session.get", {"session_id": session_id})

    def close_session(self, session_id: str) -> Any:
        return self._call("session.close", {"session_id": session_id})

    def session_tools(self) -> Any:
        return self._call("session.tools", {})

    # -- memory ---------------------------------------------------------------------------------------
    def retrieve_memories(self, query: str, *, workspace: str | None = None, top_k: int | None = None, **options: Any) -> Any:
        """memory.retrieve: the best memories for a query (options: domain, error_only, min_similarity, ...)."""
        return self._call("memory.retrieve", _params({"query": query, "workspace": workspace, "top_k": top_k, **options}))

    def store_memories(self, items: list[dict[str, Any]], *, workspace: str | None = None, key: str | None = None) -> Any:
        return self._call("memory.store", _params(locals()))

    def get_memory(self, memory_id: str, *, workspace: str | None = None) -> Any:
        return self._call("memory.get", _params(locals()))

    def memory_genealogy(self, memory_id: str, *, workspace: str | None = None) -> Any:
        return self._call("memory.genealogy", _params(locals()))

    def list_workspaces(self) -> Any:
        return self._call("memory.list_workspaces", {})

    def statistics(self) -> Any:
        """stats.get: outcomes, LLM calls, cache hits, retrieval latency."""
        return self._call("stats.get", {})


class Client(_Methods):
    """Blocking client. Use as a context manager, or call `close()`."""

    _http = httpx.Client

    def _call(self, method: str, params: dict[str, Any]) -> Any:
        return _result(self.http.post("/rpc", json=self._request(method, params)).json())

    def execute_stream(self, query: str, **options: Any) -> Iterator[StreamEvent]:
        """reasoning.execute as its events happen, then a `result` event (an error raises `ReasonRayError`).
        Options as `execute`; with `include_trace=True` the events carry the full text, thinking included."""
        with self.http.stream("POST", "/rpc", json=self._stream_request(query, options)) as response:
            sse = _Sse()
            for line in response.iter_lines():
                if (event := sse.feed(line)) is not None:
                    yield event

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Methods):
    """asyncio client: the same methods, awaited. Use as an async context manager, or call `aclose()`."""

    _http = httpx.AsyncClient

    async def _call(self, method: str, params: dict[str, Any]) -> Any:
        return _result((await self.http.post("/rpc", json=self._request(method, params))).json())

    async def execute_stream(self, query: str, **options: Any) -> AsyncIterator[StreamEvent]:
        async with self.http.stream("POST", "/rpc", json=self._stream_request(query, options)) as response:
            sse = _Sse()
            async for line in response.aiter_lines():
                if (event := sse.feed(line)) is not None:
                    yield event

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
