"""A recording proxy in front of the real model server: every request ReasonRay sends goes through it
unchanged, and it keeps what the server answered (the usage it reported, the text, tool calls), so the
tests can hold ReasonRay's own counts against the server's.

llama-cpp-python's server reports no usage in a stream (it ignores `stream_options.include_usage`), and
ReasonRay streams to it (a closed stream is how a timed-out call stops the server). For a streamed call the
proxy therefore asks the server itself, once the stream has ended: the prompt's tokens are the
`prompt_tokens` the server reports for the same request sent plainly with `max_tokens: 1`, and the answer's
are the server's own tokenizer's count of the text it streamed (`/extras/tokenize/count`, less the BOS it
adds to any text). Those two requests go straight to the server and are not recorded as calls."""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx

from reasonray.gateway.openai_client import FRAMING_PROBE
from tests.background_http import BackgroundHTTP

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "accept-encoding"}


@dataclass
class Call:
    """One request to the model server, as the server saw and answered it."""

    number: int
    path: str
    arrived: float  # time.monotonic() when ReasonRay sent it
    request: dict[str, Any]
    purpose: str | None
    finished: float | None = None
    status: int | None = None
    streamed: bool = False
    usage: dict[str, Any] | None = None  # what the server reported (for a stream: what it counts when asked)
    content: str = ""
    finish_reason: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    client_left: bool = False  # ReasonRay closed the connection before the answer was written


class Recorder(BackgroundHTTP):
    """The proxy: `url` is the OpenAI-compatible base URL to give ReasonRay instead of the server's."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")  # e.g. http://127.0.0.1:PORT/v1
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._http = httpx.Client(timeout=httpx.Timeout(900.0, connect=10.0))
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: the tests print what they need
                pass

            def do_GET(self) -> None:
                recorder._forward(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                recorder._forward(self, self.rfile.read(length))

        self._serve(Handler, name="model-recorder")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        super().stop()
        self._http.close()

    def mark(self) -> float:
        return time.monotonic()

    def since(self, mark: float, until: float | None = None) -> list[Call]:
        """The completion calls ReasonRay sent for runs after `mark` (and before `until`): not the gateway's framing
        probes (two one-token calls per process and endpoint, the first time it streams to a llama.cpp server)."""
        with self._lock:
            return [
                c
                for c in self.calls
                if c.path.endswith("/chat/completions")
                and c.purpose != FRAMING_PROBE
                and c.arrived >= mark
                and (until is None or c.arrived < until)
            ]

    def wait_idle(self, timeout_s: float = 600.0) -> None:
        """Until every call has been answered (the server runs one at a time and finishes abandoned ones)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if all(c.finished is not None for c in self.calls):
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the model server still had calls in flight after {timeout_s:g} s")

    # -- the proxy ---------------------------------------------------------------------------------------
    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        path = handler.path.removeprefix("/v1")
        request = json.loads(body) if body else {}
        call = Call(
            number=next(self._numbers),
            path=handler.path,
            arrived=time.monotonic(),
            request=request if isinstance(request, dict) else {},
            purpose=handler.headers.get("X-ReasonRay-Purpose"),
        )
        with self._lock:
            self.calls.append(call)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            with self._http.stream(handler.command, self.upstream + path, content=body, headers=headers) as upstream:
                call.status = upstream.status_code
                call.streamed = upstream.headers.get("content-type", "").startswith("text/event-stream")
                if call.streamed:
                    self._relay_stream(handler, upstream, call)
                    if call.usage is None and upstream.status_code == 200 and path.endswith("/chat/completions"):
                        call.usage = self._server_count(call, headers)
                else:
                    data = upstream.read()
                    self._note_response(call, data)
                    self._reply(handler, upstream, data)
        except (BrokenPipeError, ConnectionResetError):
            call.client_left = True
        except httpx.HTTPError as exc:
            call.status = 502
            try:
                message = json.dumps({"error": {"message": f"recorder: {exc}"}}).encode()
                handler.send_response(502)
                handler.send_header("Content-Type", "application/json")
                handler.send_header("Content-Length", str(len(message)))
                handler.end_headers()
                handler.wfile.write(message)
            except OSError:
                call.client_left = True
        finally:
            call.finished = time.monotonic()

    def _server_count(self, call: Call, headers: dict[str, str]) -> dict[str, Any] | None:
        """The usage the server would have reported for a streamed call (see the module's docstring)."""
        plain = {k: v for k, v in call.request.items() if k not in ("stream", "stream_options", "max_tokens", "max_completion_tokens")}
        try:
            answer = self._http.post(self.upstream + "/chat/completions", json={**plain, "stream": False, "max_tokens": 1}, headers=headers)
            prompt = answer.json()["usage"]["prompt_tokens"]
            extras = self.upstream.removesuffix("/v1") + "/extras/tokenize/count"
            model = call.request.get("model")
            counted = self._http.post(extras, json={"input": call.content, "model": model}).json()["count"]
            nothing = self._http.post(extras, json={"input": "", "model": model}).json()["count"]  # the BOS it adds
        except (httpx.HTTPError, KeyError, ValueError):
            return None
        completion = counted - nothing if call.content else 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion, "asked": True}

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, upstream: httpx.Response, data: bytes) -> None:
        handler.send_response(upstream.status_code)
        for key, value in upstream.headers.items():
            if key.lower() not in HOP_BY_HOP:
                handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _relay_stream(self, handler: BaseHTTPRequestHandler, upstream: httpx.Response, call: Call) -> None:
        handler.send_response(upstream.status_code)
        for key, value in upstream.headers.items():
            if key.lower() not in HOP_BY_HOP:
                handler.send_header(key, value)
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
        buffer = b""
        for chunk in upstream.iter_raw():
            handler.wfile.write(chunk)  # a client that left raises here, and closing `upstream` tells the server
            handler.wfile.flush()
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                self._note_event(call, event)

    @staticmethod
    def _note_response(call: Call, data: bytes) -> None:
        try:
            body = json.loads(data)
        except json.JSONDecodeError:
            return
        if not isinstance(body, dict):
            return
        call.usage = body.get("usage")
        choices = body.get("choices") or [{}]
        message = choices[0].get("message") or {}
        call.content = message.get("content") or ""
        call.finish_reason = choices[0].get("finish_reason")
        call.tool_calls = message.get("tool_calls") or []

    @staticmethod
    def _note_event(call: Call, event: bytes) -> None:
        for line in event.decode(errors="replace").splitlines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            try:
                chunk = json.loads(line[5:])
            except json.JSONDecodeError:
                continue
            if chunk.get("usage"):
                call.usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                call.content += (choice.get("delta") or {}).get("content") or ""
                call.finish_reason = choice.get("finish_reason") or call.finish_reason
