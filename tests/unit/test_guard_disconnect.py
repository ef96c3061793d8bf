"""A caller that goes away leaves no work behind: the HTTP front door (`HttpGuard`) cancels the route of a
POST when its connection reports `http.disconnect`, whatever ingress carries it (Serve's proxy or HAProxy
straight to the replica), and a route that finishes first is left alone."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from reasonray.api.surfaces.guard import HttpGuard

BODY = json.dumps({"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "x"}, "id": 1}).encode()


def post_scope() -> dict:
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
    return {"type": "http", "method": "POST", "path": "/rpc", "root_path": "", "headers": headers}


class Connection:
    """The server's side of one connection: the body, then `http.disconnect` once `leave()` is called."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.sent: list[dict] = []
        self.body_given = False

    def leave(self) -> None:
        self.left.set()

    async def receive(self) -> dict:
        if not self.body_given:
            self.body_given = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)


async def test_a_caller_that_leaves_cancels_the_route_it_was_waiting_for():
    state = {"started": asyncio.Event(), "cancelled": False, "body": None}

    async def route(scope, receive, send) -> None:
        state["body"] = (await receive())["body"]
        state["started"].set()
        try:
            await asyncio.sleep(3600)  # a remote agent that never answers
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise

    connection = Connection()
    served = asyncio.create_task(HttpGuard(route)(post_scope(), connection.receive, connection.send))
    await asyncio.wait_for(state["started"].wait(), 5)
    assert state["body"] == BODY  # the route read the body the guard had already read
    connection.leave()
    await asyncio.wait_for(served, 5)  # the guard returns: nothing is left running, no error for the server
    assert state["cancelled"] and connection.sent == []


async def answers_ok(scope, receive, send) -> None:
    """A route that reads the request, works a moment and answers 200 "ok"."""
    await receive()
    await asyncio.sleep(0.05)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_a_route_that_finishes_answers_and_is_not_cancelled():
    connection = Connection()
    await asyncio.wait_for(HttpGuard(answers_ok)(post_scope(), connection.receive, connection.send), 5)
    assert [m["type"] for m in connection.sent] == ["http.response.start", "http.response.body"]
    assert connection.sent[1]["body"] == b"ok"


async def test_a_streaming_route_hears_the_disconnect_when_the_caller_really_leaves():
    heard: list[str] = []
    streaming = asyncio.Event()

    async def route(scope, receive, send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        streaming.set()
        try:
            heard.append((await receive())["type"])  # what an SSE response listens for
        except asyncio.CancelledError:
            heard.append("cancelled")
            raise

    connection = Connection()
    served = asyncio.create_task(HttpGuard(route)(post_scope(), connection.receive, connection.send))
    await asyncio.wait_for(streaming.wait(), 5)
    await asyncio.sleep(0.05)
    assert heard == []  # no disconnect before the caller leaves
    connection.leave()
    await asyncio.wait_for(served, 5)
    assert heard in (["http.disconnect"], ["cancelled"])


async def test_the_server_cancelling_the_request_is_not_swallowed():
    started = asyncio.Event()

    async def route(scope, receive, send) -> None:
        await receive()
        started.set()
        await asyncio.sleep(3600)

    connection = Connection()
    served = asyncio.create_task(HttpGuard(route)(post_scope(), connection.receive, connection.send))
    await asyncio.wait_for(started.wait(), 5)
    served.cancel()  # the server stopping, not the caller leaving
    with pytest.raises(asyncio.CancelledError):
        await served


async def test_a_route_cancelled_from_two_sides_finishes_its_clean_up():
    """The caller's disconnect and the server's own cancel of the same request: the route is cancelled once, so
    its clean-up (closing a remote agent's connection) is not interrupted by the second."""
    started, cleaned = asyncio.Event(), asyncio.Event()

    async def route(scope, receive, send) -> None:
        await receive()
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.2)  # closing a connection takes a moment
            cleaned.set()

    connection = Connection()
    served = asyncio.create_task(HttpGuard(route)(post_scope(), connection.receive, connection.send))
    await asyncio.wait_for(started.wait(), 5)
    connection.leave()
    await asyncio.sleep(0.05)  # the guard has cancelled the route, which is cleaning up
    served.cancel()  # and the server cancels the request too
    with contextlib.suppress(asyncio.CancelledError):
        await served
    await asyncio.wait_for(cleaned.wait(), 5)


async def test_a_connection_that_cannot_be_watched_leaves_the_route_to_finish_and_says_so():
    from structlog.testing import capture_logs

    class Unwatchable(Connection):
        async def receive(self) -> dict:
            if not self.body_given:
                return await super().receive()
            raise RuntimeError("receive() on a connection another loop owns")

    connection = Unwatchable()
    with capture_logs() as logs:
        await asyncio.wait_for(HttpGuard(answers_ok)(post_scope(), connection.receive, connection.send), 5)
    assert connection.sent[1]["body"] == b"ok"  # not cancelled: a watch that failed is not a caller that left
    [warning] = [e for e in logs if e["event"] == "guard.disconnect_watch_failed"]
    assert warning["log_level"] == "warning" and "another loop owns" in warning["error"]
