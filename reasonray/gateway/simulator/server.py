"""The simulated model as a real OpenAI-compatible HTTP server (FastAPI + uvicorn).

`/v1/chat/completions` (plain and streaming), `/v1/embeddings`, `/v1/models`, llama.cpp's
`/extras/tokenize` and `/extras/tokenize/count`, plus `/v1/sim/*` for tests: scripted replies, fault
and disobedience settings, statistics, the exchanges it had. Every reply names the model `simulated`
and carries the header `X-ReasonRay-Simulated: true`.

Disobedient (`disobey_rate` > 0), it also behaves as llama.cpp's server does unless told otherwise: it
counts with another tokenizer, serves one request at a time, has a 4,096-token context, streams no usage
and advertises nothing about itself; a plain request whose client left is generated to the end (and holds
the model meanwhile), a streamed one stops when the client closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from reasonray.gateway.local_model import free_port as free_port  # re-exported: tests and benches take it from here
from reasonray.gateway.protocol import PURPOSE_HEADER, LLMRequest, Message, ToolCall
from reasonray.gateway.simulator.disobedience import DISOBEY_KINDS, Disobedience
from reasonray.gateway.simulator.engine import (
    DEFAULT_CONTEXT_LENGTH,
    FAULT_KINDS,
    MODEL_NAME,
    ContextLengthExceeded,
    FaultPlan,
    SimChoice,
    SimResponse,
    SimulatedModel,
    SimulatorError,
    embed,
    parse_directives,
)
from reasonray.gateway.simulator.reasoning import (
    DEFAULT_THINKING_TOKENS,
    EFFORT_SCALE,
    ReasoningPlan,
    continued_prefix,
    handed_over,
    refusal,
)
from reasonray.gateway.simulator.tokenizer import TOKENIZERS, SimTokenizer
from reasonray.gateway.tokens import TokenCounter

SIM_HEADER = {"X-ReasonRay-Simulated": "true"}


@dataclass
class SimulatorSettings:
    host: str = "127.0.0.1"
    port: int = 8001
    ttft_ms: float = 0.0
    tokens_per_second: float = 0.0  # 0: no per-token delay
    fault_rate: float = 0.0
    fault_kinds: tuple[str, ...] = FAULT_KINDS
    seed: int = 0
    hang_s: float = 30.0  # how long a "timeout" fault keeps the client waiting
    disobey_rate: float = 0.0  # share of replies that disobey as real models do (docs/simulator.md)
    disobey_kinds: tuple[str, ...] = DISOBEY_KINDS
    # What the server is like; None: OpenAI-like when obedient, llama.cpp-like when disobedient.
    tokenizer: str | None = None  # "cl100k_base" or "digits"
    max_concurrency: int | None = None  # requests generated at once; 0 for no limit
    context_length: int | None = None  # the context window, prompt and reply, in the model's tokens
    reasoning: str = "off"  # "field", "r1" or "hidden": replies think first and hand the thinking over in that form
    thinking_tokens: int = DEFAULT_THINKING_TOKENS  # tokens of thinking per reply at medium reasoning_effort

    def __post_init__(self) -> None:
        _plans(self)  # fails here on a bad rate, kind or reasoning form
        if self.tokenizer is not None and self.tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {self.tokenizer!r}; use one of {', '.join(TOKENIZERS)}")
        if self.max_concurrency is not None and self.max_concurrency < 0:
            raise ValueError(f"max_concurrency must be 0 (no limit) or more, got {self.max_concurrency}")
        if self.context_length is not None and self.context_length < 16:
            raise ValueError(f"context_length must be at least 16 tokens, got {self.context_length}")

    @property
    def disobedient(self) -> bool:
        return self.disobey_rate > 0

    @property
    def resolved_max_concurrency(self) -> int:
        return self.max_concurrency if self.max_concurrency is not None else (1 if self.disobedient else 0)

    @property
    def resolved_context_length(self) -> int:
        return self.context_length or (4096 if self.disobedient else DEFAULT_CONTEXT_LENGTH)


def _error(
    status: int, message: str, kind: str = "invalid_request_error", headers: dict[str, str] | None = None, /, **fields: str | None
) -> JSONResponse:
    """An OpenAI-style error body; `fields` fill its `param` and `code`."""
    error = {"message": message, "type": kind, "param": None, "code": None, **fields, "simulated": True}
    return JSONResponse({"error": error}, status_code=status, headers={**SIM_HEADER, **(headers or {})})


def _content_text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise ValueError(f"message content must be a string or a list of parts, not {type(content).__name__}")


def _parse_request(body: dict[str, Any], purpose: str | None = None) -> LLMRequest:
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ValueError("'messages' must be a non-empty list")
    if body.get("continue_final_message") and body.get("add_generation_prompt", True):  # vLLM's own refusal
        raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORT_SCALE:
        raise ValueError(f"'reasoning_effort' must be one of {', '.join(EFFORT_SCALE)}, not {effort!r}")
    messages = tuple(  # a continued prefix stays the last message: it is prompt, counted as such
        Message(
            role=m["role"],
            content=_content_text(m.get("content")),
            tool_calls=tuple(
                ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"].get("arguments", "{}"))
                for c in m.get("tool_calls") or []
            ),
            tool_call_id=m.get("tool_call_id"),
            name=m.get("name"),
        )
        for m in body["messages"]
    )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError("'max_tokens' must be a positive integer")
    n = body.get("n") or 1
    if not isinstance(n, int) or not 1 <= n <= 128:
        raise ValueError("'n' must be an integer from 1 to 128")
    return LLMRequest(
        messages=messages,
        max_tokens=max_tokens,
        stop=(body["stop"],) if isinstance(body.get("stop"), str) else tuple(body.get("stop") or ()),
        temperature=1.0 if body.get("temperature") is None else float(body["temperature"]),  # OpenAI's default
        n=n,
        seed=body.get("seed"),
        tools=tuple(body.get("tools") or ()),
        tool_choice=body.get("tool_choice"),
        response_format=body.get("response_format"),
        purpose=purpose or None,
        reasoning_effort=effort,
        continue_thinking=continued_prefix(body),
        extra_body={"chat_template_kwargs": body["chat_template_kwargs"]} if isinstance(body.get("chat_template_kwargs"), dict) else None,
    )


def _usage_json(response: SimResponse, form: str) -> dict[str, Any]:
    prompt, completion = response.prompt_tokens, response.completion_tokens
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if form in ("field", "hidden"):  # DeepSeek and OpenAI count the thinking; a raw R1 server does not
        usage["completion_tokens_details"] = {"reasoning_tokens": response.reasoning_tokens}
    return usage


def _choice_json(index: int, choice: SimChoice, form: str = "off") -> dict[str, Any]:
    content, reasoning = handed_over(choice.reasoning, choice.text, choice.thinking_unfinished, form)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if choice.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in choice.tool_calls
        ]
    return {"index": index, "message": message, "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}


def _model_card(settings: SimulatorSettings, tokenizer: SimTokenizer) -> dict[str, Any]:
    """What `GET /v1/models` says of the model: llama-cpp-python's bare card when disobedient; otherwise what
    it supports, in the fields vLLM (`max_model_len`) and llama.cpp (`meta`) use and as ReasonRay's capabilities."""
    if settings.disobedient:
        return {"id": MODEL_NAME, "object": "model", "owned_by": "me", "permissions": []}
    context, concurrency = settings.resolved_context_length, settings.resolved_max_concurrency
    return {
        "id": MODEL_NAME,
        "object": "model",
        "created": 0,
        "owned_by": "reasonray-simulator",
        "max_model_len": context,
        "meta": {"n_ctx": context, "n_ctx_train": context, "tokenizer": tokenizer.name},
        "capabilities": {
            "structured_output": True,
            "tool_choice": True,
            "tokenize": True,
            "context_length": context,
            "max_concurrency": concurrency or None,
        },
    }


def create_app(settings: SimulatorSettings, model: SimulatedModel | None = None) -> FastAPI:
    tokenizer = SimTokenizer(settings.tokenizer or ("digits" if settings.disobedient else "cl100k_base"))
    model = model or SimulatedModel(tokenizer, seed=settings.seed, context_length=settings.resolved_context_length, **_plans(settings))
    app = FastAPI(title="ReasonRay simulated model", description="An OpenAI-compatible simulated LLM (not a real model).")
    app.state.model = model
    _model_routes(app, settings, model, tokenizer)
    _chat_route(app, settings, model)
    _sim_routes(app, settings, model)
    return app


def _rejected(model: SimulatedModel, message: str, **fields: str | None) -> JSONResponse:
    """A 400 for a request the model refuses, counted in its stats."""
    model.stats.rejected += 1
    model.stats.last_rejection = message
    return _error(400, f"simulated model: {message}", **fields)


def _model_routes(app: FastAPI, settings: SimulatorSettings, model: SimulatedModel, tokenizer: SimTokenizer) -> None:
    """The model card, health, embeddings and llama.cpp's tokenizer endpoints."""
    rejected = functools.partial(_rejected, model)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [_model_card(settings, tokenizer)]}, headers=SIM_HEADER)

    @app.post("/extras/tokenize")
    @app.post("/extras/tokenize/count")
    @app.post("/extras/detokenize")
    async def tokens(request: Request) -> JSONResponse:
        route = request.url.path.removeprefix("/extras/")
        try:  # llama.cpp's bodies: {"input": ..., "model": ...} to tokenize (or count), {"tokens": [...]} to detokenize
            body = await request.json()
        except ValueError:
            body = None
        given: Any = body.get("tokens" if route == "detokenize" else "input") if isinstance(body, dict) else None
        try:
            if route != "detokenize":
                if not isinstance(given, str):
                    return rejected(f"{route} takes {{'input': '<text>'}} (and optionally 'model')")
                counted = {"count": tokenizer.count(given)} if route.endswith("count") else {"tokens": tokenizer.encode(given)}
                return JSONResponse(counted, headers=SIM_HEADER)
            if not isinstance(given, list) or not all(isinstance(t, int) for t in given):
                return rejected("detokenize takes {'tokens': [<int>, ...]}")
            return JSONResponse({"text": tokenizer.decode(given)}, headers=SIM_HEADER)
        except (KeyError, OverflowError):
            return rejected(f"detokenize: some of {given[:20]} are not token ids of this model")
        except ValueError as exc:  # tiktoken's file is missing: counts are estimated, there are no token ids
            return _error(501, f"simulated model: {exc}", "not_implemented")

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "simulated": True}, headers=SIM_HEADER)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        body = await request.json()
        inputs = [body["input"]] if isinstance(body.get("input"), str) else body.get("input")
        if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
            return _error(400, "simulated model: 'input' must be a string or a list of strings")
        dims = int(body.get("dimensions") or 384)
        data = [{"object": "embedding", "index": i, "embedding": embed(t, dims)} for i, t in enumerate(inputs)]
        tokens = sum(model.counter.count(t) for t in inputs)
        return JSONResponse(
            {"object": "list", "model": MODEL_NAME, "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
            headers=SIM_HEADER,
        )


@contextlib.asynccontextmanager
async def _generating(model: SimulatedModel, slots: asyncio.Semaphore | None) -> AsyncIterator[None]:
    """The model writing a reply: one of the `slots` held (None: no limit), counted in its stats."""
    async with slots or contextlib.nullcontext():
        stats = model.stats
        stats.generating += 1
        stats.most_generating = max(stats.most_generating, stats.generating)
        try:
            yield
        finally:
            stats.generating -= 1


def _chat_route(app: FastAPI, settings: SimulatorSettings, model: SimulatedModel) -> None:
    """Chat completions, streamed or not, generated at the settings' speed and concurrency."""
    rejected = functools.partial(_rejected, model)
    # one generation at a time when max_concurrency is 1, as llama.cpp's server runs
    limit = settings.resolved_max_concurrency
    slots = asyncio.Semaphore(limit) if limit else None
    per_token_s = 1 / settings.tokens_per_second if settings.tokens_per_second > 0 else 0.0  # 0: no per-token delay

    generating = functools.partial(_generating, model, slots)

    async def stream(response: SimResponse, created: int, rid: str, include_usage: bool, form: str) -> AsyncIterator[str]:
        """The reply as server-sent events, generated while the model is held: a client that closes the stream
        ends the generation (the response stops iterating this generator) and frees the model."""

        def chunk(choices: list[dict[str, Any]], **usage: Any) -> str:
            body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": MODEL_NAME, "choices": choices, **usage}
            return f"data: {json.dumps(body)}\n\n"

        async with generating():
            await asyncio.sleep(settings.ttft_ms / 1000)
            for index, choice in enumerate(response.choices):
                yield chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
                message = _choice_json(index, choice, form)["message"]  # streamed as the plain reply's message is
                for field in ("reasoning_content", "content"):
                    for piece, tokens in _pieces(message.get(field) or "", model.counter):
                        if per_token_s:
                            await asyncio.sleep(per_token_s * tokens)
                        yield chunk([{"index": index, "delta": {field: piece}, "finish_reason": None}])
                if choice.tool_calls:
                    calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
                    yield chunk([{"index": index, "delta": {"tool_calls": calls}, "finish_reason": None}])
                yield chunk([{"index": index, "delta": {}, "finish_reason": choice.finish_reason}])
            if include_usage:
                yield chunk([], usage=_usage_json(response, form))
            yield "data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            body = await request.json()
            users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
            form = model.reasoning.directed(parse_directives((_content_text(users[-1].get("content")) if users else None) or "")).form
            refused = refusal(body) if form == "hidden" else None
            if refused is not None:  # as OpenAI's reasoning models refuse it, before anything else
                return rejected(**refused)
            sim_request = _parse_request(body, request.headers.get(PURPOSE_HEADER))
            if (fault := model.fault_for(sim_request)) == "429":
                return _error(429, "simulated rate limit (fault injection)", "rate_limit_error", {"Retry-After": "0"})
            if fault == "timeout":
                await asyncio.sleep(settings.hang_s)
                return _error(504, "simulated timeout (fault injection)", "timeout")
            if fault is not None:
                return _error(500, "simulated server error (fault injection)", "server_error")
            response = model.respond(sim_request)
        except ContextLengthExceeded as exc:
            return rejected(str(exc), code="context_length_exceeded")
        except (ValueError, KeyError, TypeError, SimulatorError) as exc:
            return rejected(str(exc))
        created, rid = int(time.time()), f"chatcmpl-sim-{uuid.uuid4().hex[:12]}"
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and not settings.disobedient
            events = stream(response, created, rid, include_usage, form)
            return StreamingResponse(events, media_type="text/event-stream", headers=SIM_HEADER)
        async with generating():  # the client may leave meanwhile: the reply is generated to the end anyway
            await asyncio.sleep(settings.ttft_ms / 1000 + per_token_s * response.completion_tokens)
        if await request.is_disconnected():
            model.stats.abandoned += 1
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": MODEL_NAME,
                "system_fingerprint": "reasonray-simulated",
                "choices": [_choice_json(i, c, form) for i, c in enumerate(response.choices)],
                "usage": _usage_json(response, form),
            },
            headers=SIM_HEADER,
        )


def _sim_routes(app: FastAPI, settings: SimulatorSettings, model: SimulatedModel) -> None:
    # what tests teach the model (scripts, answer keys) and what they read back (stats, exchanges)
    @app.post("/v1/sim/scripts")
    async def add_script(request: Request) -> JSONResponse:
        body = await request.json()
        if not isinstance(body.get("name"), str) or not isinstance(body.get("replies"), list):
            return _error(400, "a script needs 'name' (string) and 'replies' (list of {content, tool_calls})")
        model.add_script(body["name"], body["replies"])
        return JSONResponse({"ok": True}, headers=SIM_HEADER)

    @app.post("/v1/sim/answers")
    async def add_answers(request: Request) -> JSONResponse:
        body = await request.json()
        answers, skill = body.get("answers"), body.get("skill", 1.0)
        if not isinstance(answers, dict) or not all(isinstance(v, str) for v in answers.values()):
            return _error(400, "an answer key needs 'answers' ({question: answer} with string answers) and optionally 'skill' (0-1)")
        try:
            known = model.add_answers(answers, float(skill))
        except (TypeError, ValueError) as exc:
            return _error(400, str(exc))
        return JSONResponse({"known": known, "skill": model.skill}, headers=SIM_HEADER)

    @app.get("/v1/sim/stats")
    async def stats() -> JSONResponse:
        s = model.stats  # the counts since the last reset (`generating`, a gauge of this moment, is not one)
        shown = ("requests", "faults", "scripted", "disobeyed", "rejected", "last_rejection", "abandoned", "most_generating")
        usage = {name: getattr(s, name) for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens")}
        return JSONResponse({**{name: getattr(s, name) for name in shown}, "usage": usage}, headers=SIM_HEADER)

    @app.get("/v1/sim/exchanges")
    async def exchanges() -> JSONResponse:
        return JSONResponse({"exchanges": msgspec.to_builtins(list(model.exchanges))}, headers=SIM_HEADER)

    # the fault, disobedience and reasoning plans, and the reset to the configured ones
    def plan_route(path: str, attribute: str, make: Callable[[dict[str, Any]], Any]) -> None:
        @app.post(path, name=attribute)
        async def set_plan(request: Request) -> JSONResponse:
            try:
                setattr(model, attribute, make(await request.json()))
            except (TypeError, ValueError) as exc:
                return _error(400, str(exc))
            return JSONResponse(dataclasses.asdict(getattr(model, attribute)), headers=SIM_HEADER)

    for path, (attribute, make) in _PLAN_ROUTES.items():
        plan_route(path, attribute, make)

    @app.post("/v1/sim/reset")
    async def reset() -> JSONResponse:
        model.reset()
        for attribute, plan in _plans(settings).items():
            setattr(model, attribute, plan)
        return JSONResponse({"ok": True}, headers=SIM_HEADER)


def _plans(settings: SimulatorSettings) -> dict[str, Any]:
    """The fault, disobedience and reasoning plans the settings configure, by the model's attribute names."""
    return {
        "faults": FaultPlan(settings.fault_rate, tuple(settings.fault_kinds)),
        "disobedience": Disobedience(settings.disobey_rate, tuple(settings.disobey_kinds)),
        "reasoning": ReasoningPlan(settings.reasoning, settings.thinking_tokens),
    }


# What each plan route sets on the model, from its JSON body.
_PLAN_ROUTES: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
    "/v1/sim/faults": ("faults", lambda body: FaultPlan(float(body.get("rate", 0.0)), tuple(body.get("kinds") or FAULT_KINDS))),
    "/v1/sim/disobey": ("disobedience", lambda body: Disobedience(float(body.get("rate", 0.0)), tuple(body.get("kinds") or DISOBEY_KINDS))),
    "/v1/sim/reasoning": (
        "reasoning",
        lambda body: ReasoningPlan(str(body.get("form", "off")), int(body.get("thinking_tokens", DEFAULT_THINKING_TOKENS))),
    ),
}


def _pieces(text: str, counter: TokenCounter, tokens_per_piece: int = 8) -> list[tuple[str, int]]:
    """Split text into pieces of about `tokens_per_piece` tokens (words as the unit); none for no text."""
    words = text.split(" ") if text else []
    pieces = [(" " if i else "") + " ".join(words[i : i + tokens_per_piece]) for i in range(0, len(words), tokens_per_piece)]
    return [(piece, counter.count(piece)) for piece in pieces]


KEEP_ALIVE_S = 75
"""How long an idle client connection stays open (uvicorn's default is 5 s): a load generator's pooled connections
idle between rounds would otherwise race the server's close and fail a call now and then, which a benchmark's
baseline (max_retries=0) counted as the model's failures."""


class SimulatorServer:
    """Runs the simulator in a background thread of this process (for `reasonray serve --llm simulated` and tests)."""

    def __init__(self, settings: SimulatorSettings) -> None:
        if settings.port == 0:
            settings.port = free_port(settings.host)
        self.settings = settings
        self.app = create_app(settings)
        config = uvicorn.Config(
            self.app, host=settings.host, port=settings.port, log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE_S
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="reasonray-simulator", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}/v1"

    def start(self, timeout_s: float = 20.0) -> SimulatorServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the simulated model did not start on {self.settings.host}:{self.settings.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def run(settings: SimulatorSettings) -> None:
    """Serve in the foreground until interrupted (`reasonray sim`)."""
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info", timeout_keep_alive=KEEP_ALIVE_S)
