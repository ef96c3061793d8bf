"""The request's span and trace id, from the caller's W3C `traceparent` (docs/interop.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from typing import TypeVar

from reasonray.api.access.auth import principal_trace_id
from reasonray.api.methods import accept_trace_id
from reasonray.kernel import tracing

T = TypeVar("T")


@contextmanager
def request_span(route: str, headers: Mapping[str, str]) -> Iterator[str | None]:
    """A server span around one HTTP request, child of the caller's `traceparent` when there is one,
    yielding the trace id the request's runs take: the traceparent's trace id, else a well-formed
    `X-Trace-Id`, else (tracing on) the new span's trace id, else None (the dispatcher makes one).
    So ReasonRay's trace id, its event log and the tracing backend name the same trace."""
    with tracing.span(route, {"http.request.method": "POST", "http.route": route}, kind="server", parent=headers) as span:
        given = tracing.trace_id_from(headers.get("traceparent")) or accept_trace_id(headers.get("x-trace-id"))
        trace_id = principal_trace_id(given) or span.trace_id  # a caller's chosen id is its own (docs/security.md)
        span.set({"reasonray.trace_id": trace_id})
        yield trace_id


def in_request_trace(name: str, stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """`stream` (a streamed response's body), consumed inside a span that continues the current request
    span's trace. Call it inside `request_span`: a streamed response outlives its handler, so the runs it
    starts while streaming would otherwise open spans in no trace, or in a new one."""
    return _continued(name, tracing.inject(), stream)


async def _continued(name: str, carrier: dict[str, str], stream: AsyncIterator[T]) -> AsyncIterator[T]:
    with tracing.span(name, parent=carrier):  # opened and closed in the task that consumes the stream
        async for item in stream:
            yield item
