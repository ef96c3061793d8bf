"""The OpenAI chat API over ReasonRay: `POST /v1/chat/completions` and `GET /v1/models` (docs/openai.md).

Transport-free and Ray-free: requests are mapped onto the methods of a `Dispatcher`, called through
its method table (`Dispatcher.call`: validation, the auth guard, limits and audit as for every
surface) as `reasoning.execute`, or `session.create` / `session.turn` / `session.resume` when the
request carries `tools`, and their results and errors back into OpenAI's shapes. The Serve ingress mounts
the routes; unit tests drive the same object over `local_dispatcher`.

- The strategy comes from the model name (`reasonray/<strategy>`, `<strategy>:<model>`; `reasonray`
  alone: the default) or from the extra field `reasoning` (`strategy`, `strategy_config`, `memory`,
  `agent_id`), which wins.
- The conversation becomes the query: the last user message, preceded by the system instructions and
  the earlier messages as context.
- `usage` sums every LLM call of the run; `completion_tokens_details.reasoning_tokens` is what the
  run generated beyond the answer itself. ReasonRay's metrics and trace id are in `reasonray`.
- Tools: the request runs as a session turn whose client tools are the request's tools. Exit mode 2
  answers `finish_reason: "tool_calls"`, with call ids `<session_id>-<call id>`, so the next request's
  `tool` messages say which session to resume, on whichever replica serves it.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reasonray.api.errors import openai_error
from reasonray.api.jsonrpc import STRATEGY_UNAVAILABLE, Dispatcher, RpcError
from reasonray.api.service import ExecuteParams
from reasonray.api.streaming import CallResult, stream_call
from reasonray.gateway.tokens import TokenCounter
from reasonray.kernel.errors import describe_errors
from reasonray.kernel.events import Event, to_dict
from reasonray.memory.loop import MemoryParams

OWNER = "reasonray"
_STRATEGY = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
DEFAULT_MODEL = "reasonray"


class ReasoningOptions(BaseModel):
    """The request's extra field `reasoning` (openai SDK: `extra_body={"reasoning": {...}}`)."""

    model_config = ConfigDict(extra="forbid")

    strategy: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_]*$", description="Strategy to run; wins over the model name.")
    strategy_config: dict[str, Any] | None = Field(None, description="Strategy-specific configuration (see reasoning.strategies).")
    memory: MemoryParams | None = Field(None, description="Run memory-aware, as reasoning.execute's `memory`.")
    agent_id: str | None = Field(None, description="Run as this registered agent.")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: the text ones
            return "\n".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request. Sampling parameters (temperature, top_p, ...) are accepted
    and left to the strategy's configuration: a strategy sets its own."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=64)
    n: int = Field(1, ge=1, le=1, description="One choice per request.")
    reasoning: ReasoningOptions | None = None


class OpenAIError(Exception):
    """An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

    def __init__(self, status: int, message: str, type_: str, code: str | None = None, param: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type_, "param": param, "code": code, **extra}}


def error_from_rpc(error: dict[str, Any]) -> OpenAIError:
    """A JSON-RPC error as OpenAI's, rendered from the one error table (`reasonray.api.errors`)."""
    status, body = openai_error(error)
    shown = body["error"]
    return OpenAIError(status, shown["message"], shown["type"], shown["code"], reasonray=shown["reasonray"])


def parse_request(body: Any) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise OpenAIError(
            400, f"invalid request: {describe_errors(exc)}", "invalid_request_error", "invalid_request", ".".join(map(str, first["loc"]))
        ) from None


def strategy_of(model: str, served_model: str) -> str | None:
    """The strategy a model name asks for (None: the default). Names of neither form are a 404; a strategy
    that is not enabled is found by reasoning.execute (-32002, answered as a 404 listing the enabled ones)."""
    if model in (DEFAULT_MODEL, served_model):
        return None
    name = (
        model.removeprefix(f"{DEFAULT_MODEL}/") if model.startswith(f"{DEFAULT_MODEL}/") else model.split(":", 1)[0] if ":" in model else ""
    )
    if not _STRATEGY.match(name):
        raise OpenAIError(
            404,
            f"The model {model!r} does not exist: use 'reasonray', 'reasonray/<strategy>' or '<strategy>:<model>'; "
            "GET /v1/models lists the strategies",
            "invalid_request_error",
            "model_not_found",
            "model",
        )
    return name


def conversation_query(messages: list[ChatMessage]) -> tuple[str, str | None]:
    """(query, system instructions): the last user message, preceded by the earlier ones as context."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if not users:
        raise OpenAIError(400, "messages must contain a user message", "invalid_request_error", "invalid_request", "messages")
    last = users[-1]
    system = "\n\n".join(m.text() for m in messages if m.role in ("system", "developer") and m.text()) or None
    history = [f"{m.role}: {m.text()}" for m in messages[:last] if m.role in ("user", "assistant") and m.text()]
    query = messages[last].text()
    if history:
        query = "Conversation so far:\n" + "\n".join(history) + f"\n\nCurrent message:\n{query}"
    return query, system


def models_list(strategies: list[str], default: str | None, served_model: str, created: int) -> dict[str, Any]:
    """`GET /v1/models`: `reasonray` (the default strategy), then `reasonray/<strategy>` for each enabled one."""

    def entry(model_id: str, strategy: str | None) -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": created,
            "owned_by": OWNER,
            "reasonray": {"strategy": strategy, "model": served_model},
        }

    return {"object": "list", "data": [entry(DEFAULT_MODEL, default), *(entry(f"{DEFAULT_MODEL}/{s}", s) for s in strategies)]}


def usage_of(prompt: int, completion: int, answer_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "completion_tokens_details": {"reasoning_tokens": max(completion - answer_tokens, 0)},
    }


def progress_text(event: Event) -> str | None:
    """One line of progress for a run event (a streamed `reasoning_content`), or None for events not shown."""
    e = to_dict(event)
    match e["type"]:
        case "ITERATION_END":
            return f"[iteration {e['iteration'] + 1}] {e['completion_tokens']} tokens, {e['stop']}\n"
        case "CARRYOVER":
            return f"[carryover] {e['tokens']} tokens carried forward ({e['mode']})\n"
        case "BRANCH":
            return f"[branch {e['label']} #{e['index']}] done in {e['elapsed_ms']:.0f} ms, {e['llm_calls']} LLM calls\n"
        case "THOUGHT":
            return f"[thought {e['node_id']}] depth {e['depth']}, score {e['score']:.2f}, {e['status']}\n"
        case "LLM_INVOCATION":
            return f"[llm] {e['completion_tokens']} tokens in {e['latency_ms']:.0f} ms{' (cached)' if e['cached'] else ''}\n"
        case "MEMORY_RETRIEVAL":
            return f"[memory] {len(e['memories'])} memories retrieved from {e['workspace']}\n"
        case "MEMORY_LEARNING":
            return f"[memory] learned: {e['outcome']}, {len(e['stored'])} stored\n"
        case "WARNING":
            return f"[warning] {e['code']}: {e['message']}\n"
        case "TOOL_EXECUTED":
            return f"[tool] {e['tool']} {e['status']} in {e['elapsed_ms']:.0f} ms\n"
    return None


class OpenAICompat:
    """The OpenAI chat surface over a dispatcher: one object per ingress replica."""

    def __init__(self, rpc: Dispatcher, tokens: TokenCounter, served_model: str) -> None:
        self.rpc = rpc
        self.tokens = tokens
        self.served_model = served_model
        self.created = int(time.time())

    async def _call(self, method: str, params: dict[str, Any], trace_id: str | None = None) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await self.rpc.call(method, params, trace_id)
        except RpcError as error:
            raise error_from_rpc(error.body()) from None
        return result

    async def strategies(self) -> tuple[list[str], str | None]:
        described = await self._call("reasoning.strategies", {})
        return [s["name"] for s in described["strategies"]], described.get("default_strategy")

    async def models(self) -> dict[str, Any]:
        names, default = await self.strategies()
        return models_list(names, default, self.served_model, self.created)

    async def execute_params(self, request: ChatCompletionRequest) -> dict[str, Any]:
        """reasoning.execute's params for a request without tools."""
        options = request.reasoning or ReasoningOptions()
        strategy = options.strategy or strategy_of(request.model, self.served_model)
        query, system = conversation_query(request.messages)
        if system:
            query = f"{system}\n\n{query}"
        params: dict[str, Any] = {"query": query, "strategy": strategy, **options.model_dump(exclude_none=True, exclude={"strategy"})}
        return {k: v for k, v in params.items() if v is not None}

    # -- plain completions ----------------------------------------------------------------------------
    async def complete(self, request: ChatCompletionRequest, trace_id: str | None = None) -> dict[str, Any]:
        if request.tools or any(m.role == "tool" for m in request.messages):
            return self._tool_turn_response(request, await self._tool_turn(request, trace_id))
        result = await self._call("reasoning.execute", await self.execute_params(request), trace_id)
        return self._execute_response(request, result)

    def _execute_response(self, request: ChatCompletionRequest, result: dict[str, Any]) -> dict[str, Any]:
        message = {"role": "assistant", "content": result["answer"]}
        return self._completion(request, result["trace_id"], message, "stop", self._usage(result), _extra(result))

    def _usage(self, result: dict[str, Any]) -> dict[str, Any]:
        m = result["metrics"]
        return usage_of(m["prompt_tokens"], m["completion_tokens"], self.tokens.count(result["answer"]))

    def _completion(
        self,
        request: ChatCompletionRequest,
        trace_id: str,
        message: dict[str, Any],
        finish: str,
        usage: dict[str, Any],
        extra: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{trace_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage,
            "system_fingerprint": None,
            "reasonray": extra,
        }

    # -- tools: a session turn ------------------------------------------------------------------------
    async def _tool_turn(self, request: ChatCompletionRequest, trace_id: str | None) -> dict[str, Any]:
        tail = _trailing_tool_messages(request.messages)
        if tail:  # re-entry: the tool messages answer the pending calls of the session named in their ids
            session_id = _session_of(tail[0].tool_call_id or "")
            results = [{"tool_call_id": (m.tool_call_id or "").split("-", 1)[1], "content": m.text(), "is_error": False} for m in tail]
            if any(_session_of(m.tool_call_id or "") != session_id for m in tail):
                raise OpenAIError(
                    400, "tool messages answer calls of different conversations", "invalid_request_error", "invalid_request", "messages"
                )
            return await self._call("session.resume", {"session_id": session_id, "tool_results": results}, trace_id)
        query, system = conversation_query(request.messages)
        spec: dict[str, Any] = {"client_tools": request.tools or []}
        if system:
            spec["system_prompt"] = system
        created = await self._call("session.create", spec)
        return await self._call("session.turn", {"session_id": created["session_id"], "message": query}, trace_id)

    def _tool_turn_response(self, request: ChatCompletionRequest, turn: dict[str, Any]) -> dict[str, Any]:
        message, finish = _turn_message(turn)
        prompt, completion = _turn_tokens(turn["trace"])
        usage = usage_of(prompt, completion, self.tokens.count(turn.get("answer") or ""))
        trace_id = next((s["trace_id"] for s in reversed(turn["trace"]) if s.get("trace_id")), uuid.uuid4().hex)
        extra = {"trace_id": trace_id, "session_id": turn["session_id"], "turn": turn["turn"], "llm_calls": turn["llm_calls"]}
        return self._completion(request, trace_id, message, finish, usage, extra)

    # -- streaming ------------------------------------------------------------------------------------
    async def stream(self, request: ChatCompletionRequest, trace_id: str | None = None) -> AsyncIterator[str]:
        """The `data:` payloads of the SSE stream: progress as `reasoning_content`, the answer as content,
        the finish chunk, usage (with `stream_options.include_usage`), then `[DONE]`. Errors found before
        the stream starts are raised (an HTTP error); later ones are sent as an `error` payload."""
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        if request.tools or any(m.role == "tool" for m in request.messages):
            completion = await self.complete(request, trace_id)
            async for payload in self._replay(completion, include_usage):
                yield payload
            return
        params = await self.execute_params(request)
        await self._check_before_streaming(params)
        chunk_id = f"chatcmpl-{trace_id or uuid.uuid4().hex}"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return _chunk(chunk_id, request.model, delta, finish)

        run = stream_call(self.rpc, "reasoning.execute", params, trace_id)
        try:
            await anext(run)  # Admitted: until then a refusal (401, 403, 404, 429) is an HTTP error, not a chunk
        except RpcError as error:
            raise error_from_rpc(error.body()) from None
        yield chunk({"role": "assistant", "content": "", "reasoning_content": ""})
        try:
            async for item in run:
                if isinstance(item, CallResult):
                    result: dict[str, Any] = item.value
                elif isinstance(item, Event) and (text := progress_text(item)):
                    yield chunk({"reasoning_content": text})
        except RpcError as error:  # the stream has started (HTTP 200): the error is its last payload
            yield json.dumps(error_from_rpc(error.body()).body)
            yield "[DONE]"
            return
        yield chunk({"content": result["answer"]})
        finish = json.loads(chunk({}, "stop"))
        finish["reasonray"] = _extra(result)
        yield json.dumps(finish)
        if include_usage:
            yield json.dumps({**json.loads(chunk({})), "choices": [], "usage": self._usage(result)})
        yield "[DONE]"

    async def _check_before_streaming(self, params: dict[str, Any]) -> None:
        """Raise what reasoning.execute would refuse at once, so that it is an HTTP error (the SDK's
        NotFoundError / BadRequestError), not an error chunk after a 200: params that do not validate
        and, without auth, a strategy that is not enabled (with auth the guard resolves the strategy
        before the call is admitted, so the stream's own refusal says it). What only the run can find
        still comes as a chunk."""
        try:
            ExecuteParams.model_validate(params)
        except ValidationError as exc:
            raise OpenAIError(400, f"invalid request: {describe_errors(exc)}", "invalid_request_error", "invalid_params") from None
        strategy = params.get("strategy")
        if strategy is None or self.rpc.guard is not None:  # a guarded caller may not be allowed reasoning.strategies
            return
        enabled, _ = await self.strategies()
        if strategy not in enabled:
            raise OpenAIError(
                404,
                f"The model {DEFAULT_MODEL}/{strategy} does not exist: strategy {strategy!r} is not enabled; "
                f"available: {', '.join(enabled) or 'none'} (GET /v1/models lists them)",
                "invalid_request_error",
                "model_not_found",
                "model",
                reasonray={"code": STRATEGY_UNAVAILABLE, "data": {"available": enabled}},
            )

    async def _replay(self, completion: dict[str, Any], include_usage: bool) -> AsyncIterator[str]:
        """A finished completion (a tool turn) as chunks."""
        choice = completion["choices"][0]
        message = choice["message"]
        chunk_id, model = completion["id"], completion["model"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        yield _chunk(chunk_id, model, delta)
        finish = json.loads(_chunk(chunk_id, model, {}, choice["finish_reason"]))
        finish["reasonray"] = completion["reasonray"]
        yield json.dumps(finish)
        if include_usage:
            yield json.dumps({**json.loads(_chunk(chunk_id, model, {})), "choices": [], "usage": completion["usage"]})
        yield "[DONE]"


def _chunk(chunk_id: str, model: str, delta: dict[str, Any], finish: str | None = None) -> str:
    return json.dumps(
        {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
    )


def _extra(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "trace_id": result["trace_id"],
        "strategy_used": result["strategy_used"],
        "metrics": result["metrics"],
        "resolution": result["resolution"],
        "memory": result.get("memory"),
    }


def _trailing_tool_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    tail: list[ChatMessage] = []
    for message in reversed(messages):
        if message.role != "tool":
            break
        tail.insert(0, message)
    return tail


def _session_of(tool_call_id: str) -> str:
    session_id, sep, _ = tool_call_id.partition("-")
    if not sep or not session_id:
        raise OpenAIError(
            400,
            f"tool_call_id {tool_call_id!r} was not issued by this server: answer the tool_calls of its last response",
            "invalid_request_error",
            "invalid_request",
            "messages",
        )
    return session_id


def _turn_message(turn: dict[str, Any]) -> tuple[dict[str, Any], str]:
    if turn["status"] == "completed":
        return {"role": "assistant", "content": turn["answer"]}, "stop"
    calls = [
        {
            "id": f"{turn['session_id']}-{c['tool_call_id']}",
            "type": "function",
            "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"])},
        }
        for c in turn["pending_tool_calls"]
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"


def _turn_tokens(trace: list[dict[str, Any]]) -> tuple[int, int]:
    """Tokens of the LLM calls this request made: the turn's calls since its last re-entry."""
    start = max((i for i, s in enumerate(trace) if s["type"] in ("TURN_STARTED", "REENTRY_VERIFIED")), default=0)
    calls = [s for s in trace[start:] if s["type"] == "LLM_CALL"]
    return sum(s["prompt_tokens"] for s in calls), sum(s["completion_tokens"] for s in calls)


class Reply(BaseModel):
    """A finished HTTP answer: status and JSON body."""

    status: int
    body: dict[str, Any]


async def respond(compat: OpenAICompat, body: bytes, trace_id: str) -> Reply | AsyncIterator[str]:
    """`POST /v1/chat/completions`: a JSON reply, or the stream's `data:` payloads (its first already computed,
    so that a request the stream cannot start, an unknown model say, still gets an HTTP error)."""
    try:
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise OpenAIError(400, f"the body is not valid JSON: {exc}", "invalid_request_error", "invalid_json") from None
        request = parse_request(payload)
        if not request.stream:
            return Reply(status=200, body=await compat.complete(request, trace_id))
        stream = compat.stream(request, trace_id)
        first = await anext(stream)
    except OpenAIError as exc:
        return Reply(status=exc.status, body=exc.body)

    async def chunks() -> AsyncIterator[str]:
        yield first
        async for payload in stream:
            yield payload

    return chunks()
