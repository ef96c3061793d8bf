"""A local OTLP/HTTP trace receiver for tests and benchmarks: spans decoded with opentelemetry-proto."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

from tests.background_http import BackgroundHTTP


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    service: str
    status_code: int


@dataclass
class OTLPReceiver(BackgroundHTTP):
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0

    def __post_init__(self) -> None:
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._serve(Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _take(self, request: ExportTraceServiceRequest) -> None:
        with self._changed:
            self.requests += 1
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for s in scope.spans:
                        self.spans.append(
                            ReceivedSpan(
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_span_id=s.parent_span_id.hex(),
                                kind=s.kind,
                                attributes={a.key: _value(a.value) for a in s.attributes},
                                service=resource.get("service.name", ""),
                                status_code=s.status.code,
                            )
                        )
            self._changed.notify_all()

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 60) -> list[ReceivedSpan]:
        """The spans received once `done(spans)` holds (waits on arrivals, no polling); fails after the timeout."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(list(self.spans)), timeout_s):
                raise AssertionError(f"spans not received within {timeout_s} s; got {[s.name for s in self.spans]}")
            return list(self.spans)
