"""The HTTP front door: what a request must be before any handler sees it (docs/security.md).

An ASGI middleware, so it holds for every route (`/rpc`, the REST mirrors, health, docs):

- `Host` must be in `[server] allowed_hosts` (loopback names by default): a page on another origin
  that rebinds its DNS name to 127.0.0.1 still sends its own name, and is refused (400).
- A POST must say `Content-Type: application/json` (415 otherwise; on `/a2a` with A2A's -32005): browsers send `text/plain` and form
  bodies cross-origin without a preflight, JSON only after one, which fails unless `[server]
  cors_origins` lists the origin (CORS is off by default).
- A POST must say its `Content-Length` (411) and it must not exceed `[limits] max_body_bytes` (413);
  the body is read up to that and no further.
- A JSON body must nest no deeper than `[limits] max_json_depth`, hold no lone surrogates in its
  strings and no NaN, Infinity or number beyond a float's range (none can be encoded in an answer): 400 with a JSON-RPC -32600 error, before any call
  in it runs. A body that is not JSON passes to the route, which answers it (-32700 on /rpc).

Every refusal is a JSON body in the JSON-RPC error shape whose message names the rule and the
config key.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from reasonray.api.jsonrpc import INVALID_PARAMS, INVALID_REQUEST

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = structlog.get_logger(__name__)

LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "::1"]
CONTENT_TYPE_NOT_SUPPORTED = -32005  # A2A's ContentTypeNotSupportedError, which its clients and the TCK expect on /a2a
JSON_MEDIA = frozenset({"application/json", "application/a2a+json"})
SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate cannot be encoded, so no answer can echo it


@dataclass
class GuardSettings:
    allowed_hosts: list[str] = field(default_factory=lambda: list(LOOPBACK_HOSTS))
    cors_origins: list[str] = field(default_factory=list)
    max_body_bytes: int = 1_000_000
    max_json_depth: int = 32


class Refusal(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def host_name(header: str) -> str:
    """`example.com:8000` -> `example.com`, `[::1]:8000` -> `::1`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def check_host(headers: dict[str, str], settings: GuardSettings) -> None:
    name = host_name(headers.get("host", ""))
    if "*" not in settings.allowed_hosts and name not in [h.lower() for h in settings.allowed_hosts]:
        raise Refusal(400, INVALID_REQUEST, f"host {name!r} is not allowed; add it to [server] allowed_hosts to serve it")


def check_post_headers(headers: dict[str, str], settings: GuardSettings, path: str = "") -> int:
    """The body's declared length, after the content type and length rules."""
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media not in JSON_MEDIA:
        code = CONTENT_TYPE_NOT_SUPPORTED if path == "/a2a" or path.startswith("/a2a/") else INVALID_REQUEST
        raise Refusal(415, code, f"Content-Type must be application/json, not {media or 'missing'!r}")
    length = headers.get("content-length")
    if length is None or not length.isdigit():
        raise Refusal(411, INVALID_REQUEST, "a POST must carry a Content-Length header (chunked bodies are refused)")
    if int(length) > settings.max_body_bytes:
        raise Refusal(
            413, INVALID_PARAMS, f"the body has {int(length)} bytes; the cap is {settings.max_body_bytes} ([limits] max_body_bytes)"
        )
    return int(length)


def check_body(body: bytes, settings: GuardSettings) -> None:
    """Refuse what json and the encoder would choke on: nesting that overflows the stack, lone surrogates."""
    if not body.strip():
        return
    try:
        depth, where = _walk(json.loads(body, parse_constant=_no_constant, parse_float=_finite_float))
    except NotFinite as exc:
        raise Refusal(
            400, INVALID_REQUEST, f"the JSON holds {exc}, which JSON (RFC 8259) does not allow and no answer can echo; send a finite number"
        ) from None
    except RecursionError:  # deeper than json's own recursion limit: deeper than any cap
        depth, where = settings.max_json_depth + 1, None
    except ValueError:  # not JSON: the route answers that itself (JSON-RPC -32700, the REST mirrors 422)
        return
    if depth > settings.max_json_depth:
        raise Refusal(
            400, INVALID_REQUEST, f"the JSON nests deeper than the cap of {settings.max_json_depth} levels ([limits] max_json_depth)"
        )
    if where is not None:
        raise Refusal(400, INVALID_REQUEST, f"a string at {where} holds a lone surrogate (not valid Unicode)")


class NotFinite(ValueError):
    """NaN, Infinity or a number too large for a float in a JSON body."""


def _no_constant(name: str) -> Any:
    raise NotFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise NotFinite(f"{text[:40]} (beyond a float's range)")
    return value


def _walk(value: Any) -> tuple[int, str | None]:
    """(deepest nesting, where the first lone surrogate is), without recursion."""
    deepest = 0
    stack = [(value, "$", 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str) and SURROGATE.search(item):
            return deepest, where
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str) and SURROGATE.search(key):
                    return deepest, f"{where} (a key)"
                stack.append((child, f"{where}.{key}" if isinstance(item, dict) else f"{where}[{key}]", depth + 1))
    return deepest, None


class HttpGuard:
    """ASGI middleware applying the rules above, configured through the application object
    (`app.state.guard`, a `GuardSettings`); an application without one gets the loopback defaults."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings: GuardSettings = getattr(getattr(scope.get("app"), "state", None), "guard", None) or GuardSettings()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        cors = origin is not None and (origin in settings.cors_origins or "*" in settings.cors_origins)
        body: bytes | None = None  # a POST's, read here in full
        try:
            check_host(headers, settings)
            if scope["method"] == "OPTIONS" and cors:
                await _respond(send, 204, None, _cors_headers(origin, preflight=True))
                return
            if scope["method"] == "POST":
                length = check_post_headers(headers, settings, app_path(scope))
                body = await _read(receive, length, settings)
                check_body(body, settings)
        except Refusal as refusal:
            error = {"jsonrpc": "2.0", "error": {"code": refusal.code, "message": refusal.message}, "id": None}
            await _respond(send, refusal.status, error, _cors_headers(origin) if cors else [])
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_cors_headers(origin)]
            await send(message)

        answer = send_with_cors if cors else send
        if body is None:
            await self.app(scope, receive, answer)
        else:
            await _until_disconnect(lambda replayed: self.app(scope, replayed, answer), body, receive)


def app_path(scope: Scope) -> str:
    """The request's path within the application (below its route prefix, when Serve mounts it under one)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return str(path[len(root) :] if root and path.startswith(root) else path)


async def _read(receive: Receive, length: int, settings: GuardSettings) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refusal(400, INVALID_REQUEST, "the client went away before the body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > min(length, settings.max_body_bytes):
            raise Refusal(
                413, INVALID_PARAMS, f"the body is longer than its Content-Length ({length}) or the cap ([limits] max_body_bytes)"
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _until_disconnect(run: Callable[[Receive], Awaitable[None]], body: bytes, upstream: Receive) -> None:
    """Run the route with the body already read, and cancel it when the client goes away: a caller that leaves
    leaves no work behind (a remote agent's call, a model's generation, a slot of its limits). The connection's
    other messages come from the watch here, so a streaming response that listens for `http.disconnect`
    (SSE) still gets it, when the client really leaves."""
    gone = asyncio.Event()
    unread: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if unread:
            return unread.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    route = asyncio.ensure_future(run(receive))
    route.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved, if it ends unawaited
    stopped = False

    def stop() -> None:
        # once, however many say so (the caller's disconnect here, Serve's own watch, the server stopping): a second
        # cancel would interrupt the route's clean-up, such as closing its connection to a remote agent
        nonlocal stopped
        if not stopped:
            stopped = True
            route.cancel()

    async def watch() -> None:
        while True:
            message = await upstream()
            if message["type"] == "http.disconnect":
                gone.set()
                stop()
                return

    watcher = asyncio.ensure_future(watch())
    watcher.add_done_callback(_watch_ended)
    try:
        await asyncio.shield(route)
    except asyncio.CancelledError:
        stop()
        if not gone.is_set():  # cancelled from outside (the server stopping): not ours to swallow
            raise
    finally:
        watcher.cancel()


def _watch_ended(watcher: asyncio.Future[None]) -> None:
    # a watch that failed leaves its route running until it ends by itself (a remote agent's call timeout at
    # worst): the operator's log says so, with why
    if not watcher.cancelled() and (error := watcher.exception()) is not None:
        log.warning("guard.disconnect_watch_failed", error=f"{type(error).__name__}: {error}"[:500])


def _cors_headers(origin: str | None, preflight: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [(b"access-control-allow-origin", (origin or "").encode("latin-1")), (b"vary", b"Origin")]
    if preflight:
        headers += [
            (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
            (b"access-control-allow-headers", b"Content-Type, Authorization, X-Trace-Id"),
            (b"access-control-max-age", b"600"),
        ]
    return headers


async def _respond(send: Send, status: int, body: dict[str, Any] | None, extra: list[tuple[bytes, bytes]]) -> None:
    data = b"" if body is None else json.dumps(body).encode()
    headers = [(b"content-length", str(len(data)).encode())] + ([(b"content-type", b"application/json")] if body else []) + extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
