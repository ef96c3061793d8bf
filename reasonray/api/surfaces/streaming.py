"""A run's events as they happen: subscribe to a method call's runs, and `reasoning.execute` over SSE.

`ReasoningService.execute` hands every event to the listener in `RUN_LISTENER` as well as to its
recorder, so a transport subscribes without any strategy knowing: `stream_call` sets a queue as the
listener in the context of one `Dispatcher.call` (the method table, guard included) and yields the
events, then the call's result; a failed call raises its `RpcError`. Cancelling the consumer (the
client went away) cancels the call, and with it the run.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from reasonray.api.jsonrpc import Dispatcher, RpcError, error_response, result_response, well_formed, wire
from reasonray.api.service import RUN_LISTENER
from reasonray.kernel.events import Event, to_dict
from reasonray.kernel.tags import strip_thinking

_DONE = object()


@dataclass(frozen=True)
class Admitted:
    """The first item of a stream whose call passed validation and the guard: its handler runs now.
    A call refused before that raises its `RpcError` instead, so a transport can still answer it
    with an HTTP error rather than a stream."""


@dataclass(frozen=True)
class CallResult:
    """The last item of a stream: the call's typed result (`Dispatcher.run`)."""

    value: Any


ADMITTED = Admitted()


async def stream_call(
    rpc: Dispatcher, method: str, params: Any, trace_id: str | None = None
) -> AsyncGenerator[Admitted | Event | CallResult, None]:
    """`Admitted`, the events of the runs the call starts as they happen, then its `CallResult`; raises the
    call's `RpcError` when it fails (before `Admitted` when it was refused)."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    loop, thread = asyncio.get_running_loop(), threading.get_ident()

    def listen(event: Event) -> None:  # events from other threads are handed to the loop
        if threading.get_ident() == thread:
            queue.put_nowait(event)
        else:
            loop.call_soon_threadsafe(queue.put_nowait, event)

    context = contextvars.copy_context()  # the caller's principal (auth) and trace go along with the call
    context.run(RUN_LISTENER.set, listen)
    call = rpc.run(method, params, trace_id, admitted=lambda: queue.put_nowait(ADMITTED))
    task = asyncio.create_task(call, context=context)
    task.add_done_callback(lambda _: queue.put_nowait(_DONE))
    try:
        while (item := await queue.get()) is not _DONE:
            yield item
        while not queue.empty():  # events handed over from another thread just before the end (_DONE came once)
            yield queue.get_nowait()
        yield CallResult(task.result())  # raises the call's RpcError
    finally:
        if not task.done():  # the consumer stopped early (client disconnected): stop the run
            task.cancel()


class StreamingCall(NamedTuple):
    """A JSON-RPC call to answer as a stream: its method, its params (without `stream`) and its id."""

    method: str
    params: dict[str, Any]
    id: Any


def streaming_call(rpc: Dispatcher, body: bytes) -> StreamingCall | None:
    """The call, without `stream`, when `body` is one well-formed JSON-RPC call asking for a streamed answer
    of a method registered with `stream=True` (anything else is answered by the dispatcher, malformed
    requests included)."""
    if b'"stream"' not in body:  # the common case costs a substring search, not a second parse
        return None
    try:
        call = json.loads(body)
    except ValueError:
        return None
    method = rpc.methods.get(call["method"]) if well_formed(call) else None
    if method is None or not method.stream or not isinstance(call.get("params"), dict):
        return None
    params = dict(call["params"])
    if params.pop("stream", False) is not True:
        return None
    return StreamingCall(call["method"], params, call.get("id"))


def public_event(event: Event, *, full_text: bool) -> str:
    """An event as a stream shows it (its JSON): with its full text (thinking included) only when the caller
    asked for the trace; otherwise prompts and the model's thinking are left out and replies and thoughts
    carry no `<thinking>`."""
    data = to_dict(event)
    if not full_text:
        data.pop("messages", None)
        data.pop("reasoning", None)
        if "responses" in data:
            data["responses"] = [strip_thinking(r) for r in data["responses"]]
        if isinstance(data.get("text"), str):
            data["text"] = strip_thinking(data["text"])
    return json.dumps(data)


async def rpc_sse(rpc: Dispatcher, call: StreamingCall, trace_id: str | None) -> AsyncIterator[dict[str, str]]:
    """`reasoning.execute` with `stream: true` as Server-Sent Events: one `event: <TYPE>` per run event
    (data: the event as JSON), then `event: response` carrying the JSON-RPC response (result or error)."""
    full_text = bool(call.params.get("include_trace"))
    try:
        async for item in stream_call(rpc, call.method, call.params, trace_id):
            if isinstance(item, CallResult):
                response = result_response(call.id, wire(item.value))
            elif not isinstance(item, Admitted):
                yield {"event": str(item.__struct_config__.tag), "data": public_event(item, full_text=full_text)}
    except RpcError as error:
        response = error_response(call.id, error)
    yield {"event": "response", "data": json.dumps(response)}
