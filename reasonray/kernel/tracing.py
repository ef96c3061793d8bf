"""Tracing facade: OpenTelemetry spans when the standard variables configure an exporter, nothing otherwise.

The service, the gateway's ObservedLLM, the fan-out, the tool executor and the memory loop open spans
through `span(...)`; strategies never do. Configuration is OpenTelemetry's own `OTEL_*` variables, read once
per process on first use (docs/interop.md lists them). With no exporter configured, `span()` yields one shared
no-op object and the OpenTelemetry SDK is never imported: no exporter, no thread, no cost beyond a flag test.
Ray worker processes get the same variables through the deployment's runtime environment (`export_env`), so
every process exports to the same backend.

A W3C `traceparent` is honoured whether tracing is on or off: `trace_id_from` gives the caller's trace
id (32 hex) for ReasonRay's own trace id, so the event log, the logs and the tracing backend agree.
Prompt and completion text go into spans only when `set_content(True)` (the `[events] record` setting).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from importlib import import_module
from typing import Any, Literal

Kind = Literal["internal", "server", "client"]
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")  # all-zero ids are invalid


def trace_id_from(traceparent: str | None) -> str | None:
    """The trace id of a well-formed W3C traceparent header (32 lowercase hex), else None."""
    match = _TRACEPARENT.match((traceparent or "").strip().lower())
    return match[1] if match else None


def configured(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables (of this process, by default) ask for trace export."""
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true" or env.get("OTEL_TRACES_EXPORTER", "").lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def export_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The OTEL_* variables of this process, for Ray workers' runtime environment ({} when tracing is off)."""
    return {k: v for k, v in env.items() if k.startswith("OTEL_")} if configured(env) else {}


class _NoSpan:
    """What `span()` yields when tracing is off (and the API every span handle has)."""

    def set(self, attributes: Mapping[str, Any]) -> None:
        pass

    def error(self, exc: BaseException) -> None:
        pass

    @property
    def trace_id(self) -> str | None:
        return None


NO_SPAN = _NoSpan()


class _Span(_NoSpan):
    def __init__(self, span: Any) -> None:
        self.span = span

    def set(self, attributes: Mapping[str, Any]) -> None:
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def error(self, exc: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:300]))

    @property
    def trace_id(self) -> str | None:
        context = self.span.get_span_context()
        return format(context.trace_id, "032x") if context.is_valid else None


class _Tracing:
    """The process's tracer provider, built from the environment on first use."""

    def __init__(self) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
        transport = "grpc" if protocol == "grpc" else "http"  # each exporter imported only when chosen
        exporter: SpanExporter = import_module(f"opentelemetry.exporter.otlp.proto.{transport}.trace_exporter").OTLPSpanExporter()
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "reasonray"}
        self.provider = TracerProvider(resource=Resource.create(attributes))  # sampler: OTEL_TRACES_SAMPLER
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("reasonray")
        self.propagator = TraceContextTextMapPropagator()
        self.kinds = {"internal": trace.SpanKind.INTERNAL, "server": trace.SpanKind.SERVER, "client": trace.SpanKind.CLIENT}


_lock = threading.Lock()
_state: _Tracing | None = None
_checked = False
_content = True  # `[events] record = "full"` semantics until told otherwise


def _tracing() -> _Tracing | None:
    global _state, _checked
    if _checked:
        return _state
    with _lock:
        if not _checked:
            _state = _Tracing() if configured() else None
            _checked = True
    return _state


def set_content(allowed: bool) -> None:
    """Whether prompt and completion text may go into spans (the `[events] record` setting)."""
    global _content
    _content = allowed


def content_allowed() -> bool:
    return _content


_NO_BLOCK = nullcontext(NO_SPAN)  # what `span()` returns when tracing is off: one shared object, nothing to do


def span(
    name: str, attributes: Mapping[str, Any] | None = None, *, kind: Kind = "internal", parent: Mapping[str, str] | None = None
) -> AbstractContextManager[_NoSpan]:
    """A span around the block (a no-op when tracing is off). `parent`: headers or a carrier from `inject`,
    whose context becomes the parent (a remote caller's traceparent, a fanning-out run's context).
    Attributes with a None value are left out."""
    state = _state if _checked else _tracing()
    if state is None:
        return _NO_BLOCK
    return _span(state, name, attributes, kind, parent)


@contextmanager
def _span(
    state: _Tracing, name: str, attributes: Mapping[str, Any] | None, kind: Kind, parent: Mapping[str, str] | None
) -> Iterator[_NoSpan]:
    context = state.propagator.extract(parent) if parent else None
    with state.tracer.start_as_current_span(name, context=context, kind=state.kinds[kind], record_exception=False) as made:
        handle = _Span(made)
        handle.set(attributes or {})
        try:
            yield handle
        except BaseException as exc:
            handle.error(exc)
            raise


def inject() -> dict[str, str]:
    """The current span's context as a W3C carrier ({} when tracing is off), to travel with a branch."""
    state = _tracing()
    if state is None:
        return {}
    carrier: dict[str, str] = {}
    state.propagator.inject(carrier)
    return carrier


def current_trace_id() -> str | None:
    """The trace id (32 hex) of the current span, None when tracing is off or no span is open."""
    if _tracing() is None:
        return None
    from opentelemetry import trace

    return _Span(trace.get_current_span()).trace_id


def flush(timeout_ms: int = 5000) -> None:
    """Export what is buffered (tests, benchmarks, and before a process exits)."""
    state = _tracing()
    if state is not None:
        state.provider.force_flush(timeout_ms)


def reset_for_tests() -> None:
    """Forget the configuration, so the next span reads the environment again."""
    global _state, _checked
    with _lock:
        if _state is not None:
            _state.provider.shutdown()
        _state, _checked = None, False
