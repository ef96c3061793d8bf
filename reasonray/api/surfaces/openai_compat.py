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
  run generated beyond the answer itself (the model's own thinking included). ReasonRay's metrics and trace
  id are in `reasonray`.
- The model's thinking behind the answer is the message's `reasoning_content` (as vLLM and DeepSeek send it);
  streamed, it comes as `delta.reasoning_content` chunks marked `reasonray.kind: "thinking"`, apart from
  ReasonRay's own progress lines (`reasonray.kind: "progress"`). Thinking in the history a client sends back
  (`reasoning_content`, `<think>` in an assistant's content) never reaches the model.
- Tools: the request runs as a session turn whose client tools are the request's tools. Exit mode 2
  answers `finish_reason: "tool_calls"`, with call ids `<session_id>-<call id>`, so the next request's
  `tool` messages say which session to resume, on whichever replica serves it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from itertools import takewhile
from typing import Any, Literal, NamedTuple

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall
from openai.types.completion_usage import CompletionTokensDetails
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reasonray.api.errors import openai_error
from reasonray.api.jsonrpc import INVALID_PARAMS, Dispatcher, RpcError
from reasonray.api.results import SessionCreateResult, StrategiesResult, TurnResult
from reasonray.api.service import EXTRA_BODY_RIGHT, ExecuteParams, ExecuteResult, ResponseFormatParams
from reasonray.api.surfaces.streaming import CallResult, stream_call
from reasonray.gateway.tokens import TokenCounter
from reasonray.kernel import events
from reasonray.kernel.errors import BudgetExceededError, StrategyUnavailableError, describe_errors
from reasonray.kernel.events import Event
from reasonray.kernel.tags import strip_thinking
from reasonray.memory.loop import MemoryParams
from reasonray.reasoner.trace import ToolExecuted

OWNER = "reasonray"
DEFAULT_MODEL = "reasonray"
_MODEL_NAME = re.compile(rf"{DEFAULT_MODEL}/(?P<named>[a-z_][a-z0-9_]{{0,63}}\n?)|(?P<prefixed>[a-z_][a-z0-9_]{{0,63}}\n?):.*", re.S)


class ReasoningOptions(BaseModel):
    """The request's extra field `reasoning` (openai SDK: `extra_body={"reasoning": {...}}`)."""

    model_config = ConfigDict(extra="forbid")

    strategy: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_]*$", description="Strategy to run; wins over the model name.")
    strategy_config: dict[str, Any] | None = Field(None, description="Strategy-specific configuration (see reasoning.strategies).")
    memory: MemoryParams | None = Field(None, description="Run memory-aware, as reasoning.execute's `memory`.")
    agent_id: str | None = Field(None, description="Run as this registered agent.")
    extra_body: dict[str, Any] | None = Field(
        None,
        description="Fields passed as they are into the model endpoint's body on every call of the run (e.g. "
        "chat_template_kwargs); trusted callers only, as reasoning.execute's `extra_body`.",
    )
    progress: bool = Field(
        True, description="Stream ReasonRay's progress lines in delta.reasoning_content; false: only the model's thinking."
    )


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
    include_obfuscation: bool | None = None


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """`{"type": "function", "function": {"name": ...}}`: this function must be called."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionName


MAX_CHOICES = 8
"""`n` above this is refused: each choice is a whole reasoning run."""


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request. Every parameter is honoured or refused (`refuse_unsupported`);
    one OpenAI does not define is a 400 naming it, as OpenAI's own API answers (docs/openai.md)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=200)
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=64)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    n: int | None = Field(1, ge=1, le=MAX_CHOICES, description="Independent runs, one choice each.")
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = None
    response_format: ResponseFormatParams | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(None, max_length=256)
    safety_identifier: str | None = Field(None, max_length=256)
    prompt_cache_key: str | None = Field(None, max_length=1024)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    modalities: list[str] | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    thinking_budget: int | None = Field(None, ge=0, le=262_144, description="Most tokens the model may think per call (extension).")
    verbosity: str | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    reasoning: ReasoningOptions | None = None

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def completion_limit(self) -> int | None:
        """Completion tokens the whole run may generate (the lower of max_tokens and max_completion_tokens)."""
        return min((v for v in (self.max_tokens, self.max_completion_tokens) if v is not None), default=None)

    @property
    def tool_names(self) -> list[str]:
        return [t.get("function", {}).get("name", "") for t in self.tools or []]


_REFUSALS = {  # why `refuse_unsupported` refuses a parameter, formatted with the request's `setting`, `named`, `tools`, `service_tier`
    "logprobs": "logprobs are not available: a reasoning run's answer is assembled by its strategy from several model calls, "
    "not sampled token by token; omit logprobs and top_logprobs",
    "logit_bias": "logit_bias is not supported: a strategy's calls use their own prompts and tokenizers; omit it",
    "store": "store is not supported: this server keeps runs in its own trace and run index (reasonray.trace_id); omit it",
    "metadata": "metadata is kept only with store, which this server does not offer; omit it",
    "modalities": "only text output is supported: omit audio and modalities",
    "prediction": "prediction is not supported: omit it",
    "web_search_options": "web_search_options is not supported: omit it",
    "verbosity": "verbosity is not supported: choose how much reasoning with the model name (reasonray/<strategy>) and extra_body "
    "reasoning.strategy_config",
    "setting": "{setting} is not supported with tools: a tool conversation runs as a session turn, which takes the model's own "
    "setting; omit it, or use tool_choice 'none', 'required' or a named function",
    "functions": "functions and function_call are deprecated: use tools and tool_choice",
    "service_tier": "service_tier {service_tier!r} is not offered: use 'auto' or 'default'",
    "tool_choice": "tool_choice is only allowed when tools are specified",
    "named": "tool_choice names {named!r}, which is not among the tools: {tools}",
    "n stream": "n > 1 cannot be streamed here: each choice is a whole run; ask for n > 1 without stream, or stream one choice",
    "n tools": "n > 1 is not supported with tools: a tool conversation is one session; ask for one choice",
    "parallel_tool_calls": "parallel_tool_calls false is honoured for forced calls (tool_choice 'required' or a named function), which "
    "are one call; with tool_choice 'auto' the turn returns every call the model asks for in one step: omit it or force the call",
    "stop": "stop takes up to 4 non-empty sequences",
    "response_format": "response_format with tools is supported with tool_choice 'none', 'required' or a named function",
}


def refuse_unsupported(request: ChatCompletionRequest) -> None:
    """A 400 naming the first parameter this server cannot honour as asked (docs/openai.md lists them)."""
    r = request
    for i, message in enumerate(r.messages):
        if isinstance(message.content, list) and (kinds := {p.get("type") for p in message.content} - {"text"}):
            why = f"only text content parts are supported, not {', '.join(sorted(map(str, kinds)))}"
            raise OpenAIError(400, why, "unsupported_parameter", f"messages.{i}.content")
    auto = _uses_tools(r) and not _forced(r)  # tool_choice "auto": a session turn, which returns every call the model asks for
    extra_body = r.reasoning.extra_body if r.reasoning is not None else None
    asked = (("reasoning_effort", r.reasoning_effort), ("thinking_budget", r.thinking_budget), ("reasoning.extra_body", extra_body))
    setting = next((p for p, v in asked if v is not None), "")
    named = r.tool_choice.function.name if isinstance(r.tool_choice, NamedToolChoice) else None
    checks: list[tuple[str, str, object]] = [  # (the parameter named, why: a key of _REFUSALS, whether refused): the first refused
        ("logprobs" if r.logprobs else "top_logprobs", "logprobs", r.logprobs or r.top_logprobs),
        ("logit_bias", "logit_bias", r.logit_bias),
        ("store", "store", r.store),
        ("metadata", "metadata", r.metadata),
        ("modalities" if r.audio is None else "audio", "modalities", r.modalities not in (None, ["text"]) or r.audio is not None),
        ("prediction", "prediction", r.prediction is not None),
        ("web_search_options", "web_search_options", r.web_search_options is not None),
        ("verbosity", "verbosity", r.verbosity is not None),
        (setting, "setting", setting and (auto or _resumes(r))),
        ("functions" if r.functions is not None else "function_call", "functions", r.functions is not None or r.function_call is not None),
        ("service_tier", "service_tier", r.service_tier not in (None, "auto", "default")),
        ("tool_choice", "tool_choice", r.tool_choice is not None and not r.tools),
        ("tool_choice", "named", named is not None and named not in r.tool_names),
        ("n", "n stream", (r.n or 1) > 1 and r.stream),
        ("n", "n tools", (r.n or 1) > 1 and _uses_tools(r)),
        ("parallel_tool_calls", "parallel_tool_calls", r.parallel_tool_calls is False and auto),
        ("stop", "stop", len(r.stops) > 4 or any(not s for s in r.stops)),
        ("response_format", "response_format", r.response_format is not None and r.response_format.type != "text" and auto),
    ]
    for param, why, refused in checks:
        if refused:
            reason = _REFUSALS[why].format(setting=setting, named=named, tools=", ".join(r.tool_names), service_tier=r.service_tier)
            raise OpenAIError(400, reason, "unsupported_parameter", param)


def _uses_tools(request: ChatCompletionRequest) -> bool:
    return bool(request.tools) and request.tool_choice != "none"


def _resumes(request: ChatCompletionRequest) -> list[ChatMessage]:
    """The request's trailing tool messages when they answer the pending calls of one of this server's sessions
    (empty: it resumes none)."""
    tail = list(takewhile(lambda m: m.role == "tool", reversed(request.messages)))[::-1]
    return tail if request.tool_choice != "none" and all(_SESSION_CALL.match(m.tool_call_id or "") for m in tail) else []


def _forced(request: ChatCompletionRequest) -> bool:
    return bool(request.tools) and (request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice))


def apply_stop(answer: str, stops: list[str]) -> str:
    """The answer up to the first stop sequence, which is excluded (as OpenAI's models stop)."""
    cut = min((i for s in stops if (i := answer.find(s)) >= 0), default=len(answer))
    return answer[:cut]


class OpenAIError(Exception):
    """An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        type_: str = "invalid_request_error",
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type_, "param": param, "code": code, **extra}}


def error_from_rpc(error: Mapping[str, Any]) -> OpenAIError:
    """A JSON-RPC error as OpenAI's, rendered from the one error table (`reasonray.api.errors`)."""
    status, body = openai_error(error)
    shown = body["error"]
    # the one right a request's own field asks for: the error names that field
    param = "reasoning.extra_body" if (error.get("data") or {}).get("method") == EXTRA_BODY_RIGHT else None
    return OpenAIError(status, shown["message"], shown["code"], param, shown["type"], reasonray=shown["reasonray"])


def model_not_found(message: str, **extra: Any) -> OpenAIError:
    """A 404 naming the `model` parameter, as OpenAI answers a model it does not serve."""
    return OpenAIError(404, message, "model_not_found", "model", **extra)


def http_error(status: int, path: str, method: str, detail: Any = None) -> OpenAIError:
    """An error the web framework found before any route ran (no such path, a method the path does not
    take), in OpenAI's shape: everything under /v1 answers in it. (A body that does not validate is not one:
    FastAPI raises RequestValidationError for it, which the application answers as invalid params.)"""
    if status == 404:
        return OpenAIError(404, f"Invalid URL ({method} {path}): no such endpoint here; see docs/openai.md", "unknown_url")
    if status == 405:
        return OpenAIError(405, f"Method {method} is not allowed on {path}", "method_not_allowed")
    return OpenAIError(status, str(detail or "request refused"), type_="invalid_request_error" if status < 500 else "server_error")


def parse_request(body: Any) -> ChatCompletionRequest:
    """The request, or a 400 in OpenAI's shape naming the first parameter that is wrong."""
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(map(str, first["loc"]))
        if first["type"] == "extra_forbidden":
            raise OpenAIError(400, f"Unrecognized request argument supplied: {param}", "unrecognized_argument", param) from None
        raise OpenAIError(400, f"invalid request: {describe_errors(exc)}", "invalid_value", param) from None
    refuse_unsupported(request)
    return request


def strategy_of(model: str, served_model: str) -> str | None:
    """The strategy a model name asks for (None: the default). Names of neither form are a 404; a strategy
    that is not enabled is found by reasoning.execute (-32002, answered as a 404 listing the enabled ones)."""
    if model in (DEFAULT_MODEL, served_model):
        return None
    if (found := _MODEL_NAME.fullmatch(model)) is None:
        raise model_not_found(
            f"The model {model!r} does not exist: use 'reasonray', 'reasonray/<strategy>' or '<strategy>:<model>'; "
            "GET /v1/models lists the strategies"
        )
    return found["named"] or found["prefixed"]


def conversation_query(messages: list[ChatMessage]) -> tuple[str, str | None]:
    """(query, system instructions): the last user message, preceded by the earlier ones (tool calls and
    their results included) as context; tool results after the last user message follow it."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if not users:
        raise OpenAIError(400, "messages must contain a user message", "invalid_request", "messages")
    last = users[-1]
    system = "\n\n".join(m.text() for m in messages if m.role in ("system", "developer") and m.text()) or None
    history = [line for m in messages[:last] if (line := _context_line(m))]
    after = [line for m in messages[last + 1 :] if (line := _context_line(m))]
    query = messages[last].text()
    if history:
        query = "Conversation so far:\n" + "\n".join(history) + f"\n\nCurrent message:\n{query}"
    if after:
        query += "\n\nSince then:\n" + "\n".join(after)
    return query, system


def _context_line(message: ChatMessage) -> str | None:
    # an assistant's thinking (its `reasoning_content`, or <think> left in its content) is never fed forward
    text = strip_thinking(message.text()) if message.role == "assistant" else message.text()
    if message.role in ("user", "assistant") and text:
        return f"{message.role}: {text}"
    if message.role == "assistant" and message.tool_calls:
        calls = ", ".join(f"{c.get('function', {}).get('name')}({c.get('function', {}).get('arguments', '')})" for c in message.tool_calls)
        return f"assistant called: {calls}"
    if message.role == "tool":
        return f"tool result ({message.tool_call_id}): {message.text()}"
    return None


def usage_of(prompt: int, completion: int, answer_tokens: int, thinking_tokens: int = 0) -> CompletionUsage:
    """OpenAI's usage: `reasoning_tokens` are the completion tokens that are not the answer (the model's own thinking,
    `thinking_tokens` as its server counted them, is among them)."""
    reasoning = min(max(completion - answer_tokens, thinking_tokens, 0), completion)
    return CompletionUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning),
    )


_PROGRESS: dict[type[Any], Callable[[Any], str]] = {  # a run event's progress line (a streamed `reasoning_content`), by its type
    events.IterationEnd: lambda e: f"[iteration {e.iteration + 1}] {e.completion_tokens} tokens, {e.stop}\n",
    events.Carryover: lambda e: f"[carryover] {e.tokens} tokens carried forward ({e.mode})\n",
    events.BranchRun: lambda e: f"[branch {e.label} #{e.index}] done in {e.elapsed_ms:.0f} ms, {e.llm_calls} LLM calls\n",
    events.ThoughtNode: lambda e: f"[thought {e.node_id}] depth {e.depth}, score {e.score:.2f}, {e.status}\n",
    events.LLMInvocation: lambda e: (
        f"[llm] {e.completion_tokens} tokens{f' ({e.reasoning_tokens} thinking)' if e.reasoning_tokens else ''} "
        f"in {e.latency_ms:.0f} ms{' (cached)' if e.cached else ''}\n"
    ),
    events.MemoryRetrieval: lambda e: f"[memory] {len(e.memories)} memories retrieved from {e.workspace}\n",
    events.MemoryLearning: lambda e: f"[memory] learned: {e.outcome}, {len(e.stored)} stored\n",
    events.RunWarning: lambda e: f"[warning] {e.code}: {e.message}\n",
    ToolExecuted: lambda e: f"[tool] {e.tool} {e.status} in {e.elapsed_ms:.0f} ms\n",
}


class OpenAICompat:
    """The OpenAI chat surface over a dispatcher: one object per ingress replica."""

    def __init__(self, rpc: Dispatcher, tokens: TokenCounter, served_model: str) -> None:
        self.rpc = rpc
        self.tokens = tokens
        self.served_model = served_model
        self.created = int(time.time())

    async def _call(self, method: str, params: dict[str, Any], trace_id: str | None = None) -> Any:
        """The method's typed result (`Dispatcher.run`); its error in OpenAI's shape."""
        try:
            return await self.rpc.run(method, params, trace_id)
        except RpcError as error:
            raise error_from_rpc(error.body()) from None

    async def strategies(self) -> tuple[list[str], str | None]:
        described: StrategiesResult = await self._call("reasoning.strategies", {})
        return [s.name for s in described.strategies], described.default_strategy

    async def models(self) -> dict[str, Any]:
        """`GET /v1/models`: `reasonray` (the default strategy), then `reasonray/<strategy>` for each enabled one; each
        OpenAI's `Model` plus `reasonray`: the strategy it runs (None: the default) and the served model."""
        names, default = await self.strategies()

        def entry(model_id: str, strategy: str | None) -> dict[str, Any]:
            served = {"strategy": strategy, "model": self.served_model}
            return {"id": model_id, "object": "model", "created": self.created, "owned_by": OWNER, "reasonray": served}

        return {"object": "list", "data": [entry(DEFAULT_MODEL, default), *(entry(f"{DEFAULT_MODEL}/{s}", s) for s in names)]}

    async def model(self, model_id: str) -> dict[str, Any]:
        """`GET /v1/models/{model}`: one entry of the list, or a 404 in OpenAI's shape."""
        listed: list[dict[str, Any]] = (await self.models())["data"]
        found = next((m for m in listed if m["id"] == model_id), None)
        if found is None:
            raise model_not_found(f"The model {model_id!r} does not exist; GET /v1/models lists {', '.join(m['id'] for m in listed)}")
        return found

    def execute_params(self, request: ChatCompletionRequest, choice: int = 0) -> dict[str, Any]:
        """reasoning.execute's params for a request answered by one run (no tools, or tool_choice none); choice `i`
        of `n` samples with the request's seed + i."""
        options = request.reasoning or ReasoningOptions()
        strategy = options.strategy or strategy_of(request.model, self.served_model)
        query, system = conversation_query(request.messages)
        sampling = request.model_dump(include={"temperature", "top_p", "presence_penalty", "frequency_penalty", "seed"}, exclude_none=True)
        if "seed" in sampling:
            sampling["seed"] += choice
        limit, shape = request.completion_limit, request.response_format
        params: dict[str, Any] = {  # None: left out
            "query": f"{system}\n\n{query}" if system else query,
            "strategy": strategy,
            **options.model_dump(exclude_none=True, exclude={"strategy", "progress"}),
            **request.model_dump(include={"reasoning_effort", "thinking_budget"}),
            "sampling": sampling or None,
            "budget": {"max_completion_tokens": limit} if limit is not None else None,
            "response_format": shape.as_openai() if shape is not None and shape.type != "text" else None,
        }
        return {k: v for k, v in params.items() if v is not None}

    # -- plain completions ----------------------------------------------------------------------------
    async def complete(self, request: ChatCompletionRequest, trace_id: str | None = None) -> ChatCompletion:
        if _forced(request):
            return await self._forced_call(request, trace_id)
        if _uses_tools(request) or _resumes(request):
            return await self._tool_turn(request, trace_id)
        # choice 0 runs under the request's trace id, the others under ids derived from it
        traces = [trace_id, *(trace_id and f"{trace_id}-{i}" for i in range(1, request.n or 1))]
        runs = await asyncio.gather(*(self._run(request, self.execute_params(request, choice=i), t) for i, t in enumerate(traces)))
        choices = [_choice(r.message(), r.finish, i) for i, r in enumerate(runs)]
        extra = runs[0].extra if len(runs) == 1 else {**runs[0].extra, "choices": [r.extra for r in runs]}
        return _completion(request.model, extra["trace_id"], choices, self._usage(runs), extra)

    async def _run(self, request: ChatCompletionRequest, params: dict[str, Any], trace_id: str | None) -> Answered:
        """One run. A run that used up max_completion_tokens answers what it had, with finish_reason "length",
        as OpenAI's models do."""
        try:
            result: ExecuteResult = await self.rpc.run("reasoning.execute", params, trace_id)
        except RpcError as error:
            return _cut_short(error.body(), request, trace_id)
        return self._finished(request, result)

    def _finished(self, request: ChatCompletionRequest, result: ExecuteResult) -> Answered:
        m = result.metrics
        limit = request.completion_limit
        hit = (limit is not None and m.completion_tokens >= limit) or (result.degraded_error or {}).get("code") == BudgetExceededError.code
        answer = result.answer if request.response_format is not None else apply_stop(result.answer, request.stops)
        # what ReasonRay adds to a completion (`reasonray`): the run's trace id, strategy, metrics, resolution and memory
        extra = result.model_dump(mode="json", include={"trace_id", "strategy_used", "metrics", "resolution", "memory"})
        tokens = (m.prompt_tokens, m.completion_tokens, m.reasoning_tokens)
        return Answered(answer, "length" if hit else "stop", *tokens, extra, result.reasoning)

    def _usage(self, runs: Sequence[Answered]) -> CompletionUsage:
        return usage_of(
            sum(r.prompt_tokens for r in runs),
            sum(r.completion_tokens for r in runs),
            sum(self.tokens.count(r.answer) for r in runs),
            sum(r.reasoning_tokens for r in runs),
        )

    # -- a forced tool call: the run answers with the call's arguments ------------------------------------
    async def _forced_call(self, request: ChatCompletionRequest, trace_id: str | None) -> ChatCompletion:
        """tool_choice "required" or a named function: one run whose answer must be the arguments (validated
        against the function's parameters, repaired once, as response_format is), returned as the call."""
        tools = {t["function"]["name"]: t["function"] for t in request.tools or [] if t.get("function", {}).get("name")}
        named = request.tool_choice.function.name if isinstance(request.tool_choice, NamedToolChoice) else None
        chosen = [named] if named else list(tools)
        if len(chosen) == 1:
            schema = tools[chosen[0]].get("parameters") or {"type": "object", "properties": {}}
            ask = f"Call the function {chosen[0]} now: answer with only its arguments, a JSON object valid against {json.dumps(schema)}."
        else:
            arguments = {name: tools[name].get("parameters") or {"type": "object"} for name in chosen}
            schema = {
                "anyOf": [
                    {"type": "object", "properties": {"name": {"const": n}, "arguments": a}, "required": ["name", "arguments"]}
                    for n, a in arguments.items()
                ]
            }
            listing = "\n".join(f"- {name}: {tools[name].get('description', '')}" for name in chosen)
            ask = f'Call one of these functions now:\n{listing}\nAnswer with only a JSON object {{"name": ..., "arguments": {{...}}}}.'
        params = self.execute_params(request)
        params["query"] += f"\n\n{ask}"
        params["response_format"] = {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": schema}}
        run = await self._run(request.model_copy(update={"stop": None}), params, trace_id)
        if run.finish == "length":
            choice = _choice(run.message(), "length")
        else:
            value = json.loads(run.answer)
            name, arguments = (chosen[0], value) if len(chosen) == 1 else (value["name"], value["arguments"])
            call = _tool_call(f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(arguments))
            choice = _choice(run.message(content=None, tool_calls=[call]), "tool_calls")
        return _completion(request.model, run.extra["trace_id"], [choice], self._usage([run]), run.extra)

    # -- tools: a session turn ------------------------------------------------------------------------
    async def _tool_turn(self, request: ChatCompletionRequest, trace_id: str | None) -> ChatCompletion:
        turn: TurnResult
        if tail := _resumes(request):  # re-entry: the tool messages answer the pending calls of the session named in their ids
            sessions = {(m.tool_call_id or "").partition("-")[0] for m in tail}  # ids `<session_id>-<call id>`, as this server issues them
            if len(sessions) > 1:
                raise OpenAIError(400, "tool messages answer calls of different conversations", "invalid_request", "messages")
            results = [{"tool_call_id": (m.tool_call_id or "").partition("-")[2], "content": m.text(), "is_error": False} for m in tail]
            turn = await self._call("session.resume", {"session_id": sessions.pop(), "tool_results": results}, trace_id)
        else:
            # a new conversation, or results of calls no session is waiting for (a forced call, another server's): a new
            # turn, the whole conversation its context
            query, system = conversation_query(request.messages)
            spec = {"client_tools": request.tools or [], **({"system_prompt": system} if system else {})}
            created: SessionCreateResult = await self._call("session.create", spec)
            turn = await self._call("session.turn", {"session_id": created.session_id, "message": query}, trace_id)
        if turn.status == "completed":
            content = apply_stop(turn.answer, request.stops) if turn.answer is not None else None
            choice = _choice(ChatCompletionMessage(role="assistant", content=content), "stop")
        else:
            pending = [(c, c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)) for c in turn.pending_tool_calls]
            calls = [_tool_call(f"{turn.session_id}-{c.tool_call_id}", c.name, arguments) for c, arguments in pending]
            message = ChatCompletionMessage.model_validate({"role": "assistant", "content": None, "tool_calls": calls})
            choice = _choice(message, "tool_calls")
        # tokens of the LLM calls this request made: the turn's calls since its last re-entry
        start = max((i for i, s in enumerate(turn.trace) if s["type"] in ("TURN_STARTED", "REENTRY_VERIFIED")), default=0)
        made = [s for s in turn.trace[start:] if s["type"] == "LLM_CALL"]
        prompt, completion = sum(s["prompt_tokens"] for s in made), sum(s["completion_tokens"] for s in made)
        usage = usage_of(prompt, completion, self.tokens.count(turn.answer or ""), turn.usage.reasoning_tokens)
        ran = next((s["trace_id"] for s in reversed(turn.trace) if s.get("trace_id")), uuid.uuid4().hex)
        extra = {"trace_id": ran, "session_id": turn.session_id, "turn": turn.turn, "llm_calls": turn.llm_calls}
        return _completion(request.model, ran, [choice], usage, extra)

    # -- streaming ------------------------------------------------------------------------------------
    async def stream(self, request: ChatCompletionRequest, trace_id: str | None = None) -> AsyncIterator[str]:
        """The `data:` payloads of the SSE stream: progress as `reasoning_content`, the answer as content,
        the finish chunk, usage (with `stream_options.include_usage`), then `[DONE]`. Errors found before
        the stream starts are raised (an HTTP error); later ones are sent as an `error` payload."""
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        if _forced(request) or _uses_tools(request) or _resumes(request):
            async for payload in _replay(await self.complete(request, trace_id), include_usage):
                yield payload
            return
        params = self.execute_params(request)
        # what reasoning.execute would refuse at once is an HTTP error (the SDK's NotFoundError / BadRequestError), not
        # an error chunk after a 200: params that do not validate and, without auth, a strategy that is not enabled (with
        # auth the guard resolves the strategy before the call is admitted, so the stream's own refusal says it, and a
        # guarded caller may not be allowed reasoning.strategies). What only the run can find still comes as a chunk.
        try:
            ExecuteParams.model_validate(params)
        except ValidationError as exc:
            raise OpenAIError(400, f"invalid request: {describe_errors(exc)}", "invalid_params") from None
        if (strategy := params.get("strategy")) is not None and self.rpc.guard is None:
            enabled, _ = await self.strategies()
            if strategy not in enabled:
                raise model_not_found(
                    f"The model {DEFAULT_MODEL}/{strategy} does not exist: strategy {strategy!r} is not enabled; "
                    f"available: {', '.join(enabled) or 'none'} (GET /v1/models lists them)",
                    reasonray={"code": StrategyUnavailableError.code, "data": {"available": enabled}},
                )
        chunk = functools.partial(_chunk, f"chatcmpl-{trace_id or uuid.uuid4().hex}", request.model)
        progress = request.reasoning is None or request.reasoning.progress
        run = stream_call(self.rpc, "reasoning.execute", params, trace_id)
        marked: dict[str, Any] = {}  # the finish chunk's `reasonray`: the run's, when it finished
        try:
            await anext(run)  # Admitted: until then a refusal (401, 403, 404, 429) is an HTTP error, not a chunk
        except RpcError as error:
            raise error_from_rpc(error.body()) from None
        yield chunk(ChoiceDelta(role="assistant", content="", reasoning_content=""))
        try:
            async for item in run:
                if isinstance(item, CallResult):
                    result: ExecuteResult = item.value
                elif progress and isinstance(item, Event) and (line := _PROGRESS.get(type(item))) is not None:
                    kind = {"kind": "progress", "event": str(item.__struct_config__.tag)}
                    yield chunk(ChoiceDelta(reasoning_content=line(item)), reasonray=kind)
        except RpcError as error:  # the stream has started (HTTP 200): the error is its last payload
            try:
                answered = counted = _cut_short(error.body(), request, trace_id)  # what the run had achieved: finish_reason "length"
            except OpenAIError as failed:
                yield json.dumps(failed.body)
                yield "[DONE]"
                return
        else:
            answered = self._finished(request, result)
            # usage: the tokens of the whole answer, as the run counted it (before any stop sequence)
            counted, marked["reasonray"] = answered._replace(answer=result.answer), answered.extra
        if answered.reasoning:  # the model's thinking behind the answer, as the plain response's reasoning_content
            yield chunk(ChoiceDelta(reasoning_content=answered.reasoning), reasonray=THINKING)
        yield chunk(ChoiceDelta(content=answered.answer))
        yield chunk(finish=answered.finish, **marked)
        if include_usage:
            yield chunk(usage=self._usage([counted]))
        yield "[DONE]"


FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]

THINKING = {"kind": "thinking"}
"""The `reasonray` field of a chunk whose `delta.reasoning_content` is the model's thinking (progress lines are
marked `{"kind": "progress", "event": <run event type>}`)."""


def _chunk(chunk_id: str, model: str, delta: ChoiceDelta | None = None, finish: FinishReason | None = None, **extra: Any) -> str:
    """One `data:` payload: a chunk of the one choice (`delta`, `finish`), or with `usage=` the usage chunk (no
    choices); `reasonray=` adds ReasonRay's field."""
    choices = [] if "usage" in extra else [ChunkChoice(index=0, delta=delta or ChoiceDelta(), logprobs=None, finish_reason=finish)]
    chunk = ChatCompletionChunk(
        id=chunk_id,
        object="chat.completion.chunk",
        created=int(time.time()),
        model=model,
        system_fingerprint=None,
        choices=choices,
        **extra,
    )
    return json.dumps(chunk.to_dict(mode="json"))


async def _replay(completion: ChatCompletion, include_usage: bool) -> AsyncIterator[str]:
    """A finished completion (a tool turn) as chunks."""
    [choice] = completion.choices
    message, chunk = choice.message, functools.partial(_chunk, completion.id, completion.model)
    if reasoning := (message.model_extra or {}).get("reasoning_content"):
        yield chunk(ChoiceDelta(role="assistant", reasoning_content=reasoning), reasonray=THINKING)
    calls = [ChoiceDeltaToolCall(index=i, **c.to_dict()) for i, c in enumerate(message.tool_calls or [])]
    yield chunk(ChoiceDelta(role="assistant", content=message.content, **({"tool_calls": calls} if calls else {})))
    yield chunk(finish=choice.finish_reason, reasonray=(completion.model_extra or {})["reasonray"])
    if include_usage:
        yield chunk(usage=completion.usage)
    yield "[DONE]"


def _completion(model: str, trace_id: str, choices: list[Choice], usage: CompletionUsage, extra: dict[str, Any]) -> ChatCompletion:
    return ChatCompletion(
        id=f"chatcmpl-{trace_id}",
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=usage,
        service_tier="default",
        system_fingerprint=None,
        reasonray=extra,
    )


def _choice(message: ChatCompletionMessage, finish: FinishReason, index: int = 0) -> Choice:
    return Choice(index=index, message=message, logprobs=None, finish_reason=finish)


def _cut_short(error: Mapping[str, Any], request: ChatCompletionRequest, trace_id: str | None) -> Answered:
    """What a run that used up the request's completion tokens had achieved, answered with finish_reason "length"
    (a run that failed otherwise: its error in OpenAI's shape, raised). The run may end on the budget itself, or on
    what the cut-off reply lacked (an answer, a format)."""
    data = error.get("data") or {}
    partial: dict[str, Any] = data.get("partial") or {}
    limit = request.completion_limit
    budget_hit = error.get("code") == BudgetExceededError.code and "max_completion_tokens" in data
    if limit is None or error.get("code") == INVALID_PARAMS or not (budget_hit or partial.get("completion_tokens", 0) >= limit):
        raise error_from_rpc(error) from None
    answer = apply_stop(str(partial.get("answer") or ""), request.stops)
    prompt, completion, thinking = (int(partial.get(k, 0)) for k in ("prompt_tokens", "completion_tokens", "reasoning_tokens"))
    return Answered(answer, "length", prompt, completion, thinking, {"trace_id": trace_id or uuid.uuid4().hex, "budget": data})


_SESSION_CALL = re.compile(r"^[0-9a-f]{32}-.+")


def _tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class Answered(NamedTuple):
    """One run as a choice: its answer, finish reason, token counts, ReasonRay's extra and the model's thinking."""

    answer: str
    finish: FinishReason
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    extra: dict[str, Any]
    reasoning: str = ""

    def message(self, **fields: Any) -> ChatCompletionMessage:
        """The assistant message: the answer, and the thinking behind it as `reasoning_content` (vLLM's and DeepSeek's
        field); `fields` replace or add to them (a tool call's)."""
        thinking = {"reasoning_content": self.reasoning} if self.reasoning else {}
        return ChatCompletionMessage(**{"role": "assistant", "content": self.answer, **thinking, **fields})


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
            raise OpenAIError(400, f"the body is not valid JSON: {exc}", "invalid_json") from None
        request = parse_request(payload)
        if not request.stream:
            return Reply(status=200, body=(await compat.complete(request, trace_id)).to_dict(mode="json"))
        stream = compat.stream(request, trace_id)
        first = await anext(stream)
    except OpenAIError as exc:
        return Reply(status=exc.status, body=exc.body)

    async def chunks() -> AsyncIterator[str]:
        yield first
        async for payload in stream:
            yield payload

    return chunks()
