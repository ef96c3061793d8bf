"""A stand-in for llama.cpp's servers over real HTTP, for the gateway's tests: its own tokenizer (digits one per
token, words in pieces of three letters: far from cl100k), ChatML framing with an injected system prompt, one
generation at a time, no usage chunk when streaming, and a generation that goes on for a client that left
unless it was streamed. `flavour` picks the paths: llama-cpp-python (`/extras/tokenize`, no `/props`),
llama.cpp (`/tokenize`, `/props` with n_ctx and slots) or opaque (neither)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from reasonray.gateway.simulator.server import free_port

TOKEN = re.compile(r"\d|[A-Za-z]{1,3}|\s|[^\w\s]|_")
SYSTEM_PROMPT = "You are a helpful AI assistant named Double."


@dataclass
class Stats:
    generations_started: int = 0
    generations_finished: int = 0
    tokens_generated: int = 0
    running: int = 0
    max_running: int = 0
    at_server: int = 0  # calls received and not yet done (running or waiting for the one generation slot)
    max_at_server: int = 0
    max_tokens_seen: list[int | None] = field(default_factory=list)
    abandoned_at: list[int] = field(default_factory=list)  # tokens generated when a streamed client left
    usage: list[tuple[int, int]] = field(default_factory=list)  # (prompt, completion) of each plain answer, by its count


class LlamaDouble:
    def __init__(
        self,
        *,
        flavour: str = "llama-cpp-python",
        n_ctx: int = 4096,
        seconds_per_token: float = 0.01,
        vocab_offset: int = 0,
        model_path: str = "/nowhere/m.gguf",
    ) -> None:
        self.flavour = flavour
        self.model_path = model_path  # what llama.cpp's /props names: the model file it serves
        self.n_ctx = n_ctx
        self.seconds_per_token = seconds_per_token
        self.vocab_offset = vocab_offset  # another offset: another model's ids for the same text
        self.stats = Stats()
        self._vocab: dict[str, int] = {}
        self._pieces: dict[int, str] = {}
        self._lock = asyncio.Lock()
        self.port = free_port()
        self.app = self._app()
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LlamaDouble:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            assert time.monotonic() < deadline, "the llama double did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def tokenize(self, text: str) -> list[int]:
        ids = []
        for piece in TOKEN.findall(text):
            if piece not in self._vocab:
                self._vocab[piece] = len(self._vocab) + 1 + self.vocab_offset
                self._pieces[self._vocab[piece]] = piece
            ids.append(self._vocab[piece])
        return ids

    def detokenize(self, ids: list[int]) -> str:
        return "".join(self._pieces.get(i, "") for i in ids)

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        if not messages or messages[0]["role"] != "system":
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, *messages]
        # ChatML: <|im_start|>role\ncontent<|im_end|>\n, the markers one token each; the reply primed the same way
        return sum(4 + len(self.tokenize(m["role"])) + len(self.tokenize(m.get("content") or "")) for m in messages) + 3

    def _app(self) -> FastAPI:
        app = FastAPI()
        root = "/extras" if self.flavour == "llama-cpp-python" else ""
        field_in, field_out = ("input", "text") if self.flavour == "llama-cpp-python" else ("content", "content")

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            owner = {"llama-cpp-python": "me", "llama.cpp": "llamacpp"}.get(self.flavour, "someone")
            return JSONResponse({"object": "list", "data": [{"id": "smollm2", "object": "model", "owned_by": owner}]})

        if self.flavour == "llama.cpp":

            @app.get("/props")
            async def props() -> JSONResponse:
                return JSONResponse({"default_generation_settings": {"n_ctx": self.n_ctx}, "total_slots": 1, "model_path": self.model_path})

        if self.flavour != "opaque":  # opaque: a server that says nothing about itself

            @app.post(f"{root}/tokenize")
            async def tokenize(request: Request) -> JSONResponse:
                return JSONResponse({"tokens": self.tokenize((await request.json())[field_in])})

            @app.post(f"{root}/detokenize")
            async def detokenize(request: Request) -> JSONResponse:
                return JSONResponse({field_out: self.detokenize((await request.json())["tokens"])})

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self.stats.at_server += 1
            self.stats.max_at_server = max(self.stats.max_at_server, self.stats.at_server)
            prompt = self.prompt_tokens(body["messages"])
            max_tokens = body.get("max_tokens")
            self.stats.max_tokens_seen.append(max_tokens)
            if prompt + (max_tokens or 0) > self.n_ctx:
                self.stats.at_server -= 1
                message = f"Requested tokens ({prompt + (max_tokens or 0)}) exceed context window of {self.n_ctx}"
                return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=400)
            wanted = int(m.group(1)) if (m := re.search(r"\[\[say (\d+)\]\]", body["messages"][-1].get("content") or "")) else 5
            length = min(wanted, max_tokens or self.n_ctx - prompt)
            finish = "length" if length < wanted else "stop"
            if body.get("stream"):
                return StreamingResponse(self._stream(length, finish), media_type="text/event-stream")
            async with self._generating():
                text = await self._generate(length)
            usage = {"prompt_tokens": prompt, "completion_tokens": length, "total_tokens": prompt + length}
            self.stats.usage.append((prompt, length))
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            return JSONResponse(
                {"id": "c", "object": "chat.completion", "created": 0, "model": "smollm2", "choices": [choice], "usage": usage}
            )

        return app

    def _generating(self) -> Any:
        double = self

        class Generating:
            async def __aenter__(self) -> None:
                await double._lock.acquire()
                double.stats.generations_started += 1
                double.stats.running += 1
                double.stats.max_running = max(double.stats.max_running, double.stats.running)

            async def __aexit__(self, *exc: object) -> None:
                double.stats.running -= 1
                double.stats.at_server -= 1
                double._lock.release()

        return Generating()

    async def _generate(self, length: int) -> str:
        words = []
        for _ in range(length):
            await asyncio.sleep(self.seconds_per_token)
            words.append("7")  # one token by this tokenizer, as a generated token is
            self.stats.tokens_generated += 1
        self.stats.generations_finished += 1
        return "".join(words)

    async def _stream(self, length: int, finish: str) -> Any:
        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            return (
                "data: "
                + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "smollm2", "choices": [choice]})
                + "\n\n"
            )

        async with self._generating():
            generated = 0
            try:
                yield chunk({"role": "assistant", "content": ""})
                for _ in range(length):
                    await asyncio.sleep(self.seconds_per_token)
                    generated += 1
                    self.stats.tokens_generated += 1
                    yield chunk({"content": "7"})
                self.stats.generations_finished += 1
                yield chunk({}, finish)
                yield "data: [DONE]\n\n"
            except BaseException:  # the client left: like llama.cpp, stop generating
                self.stats.abandoned_at.append(generated)
                raise
