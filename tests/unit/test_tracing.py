"""OpenTelemetry through the kernel's tracing facade: spans exported to a local OTLP/HTTP receiver when
the standard variables say so, a caller's traceparent honoured, nothing at all when they are unset."""

from __future__ import annotations

import asyncio
import json

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.api.surfaces.openai_compat import OpenAICompat, respond
from reasonray.api.surfaces.streaming import StreamingCall, rpc_sse
from reasonray.api.surfaces.tracing import in_request_trace, request_span
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel import tracing
from reasonray.kernel.config import ReasoningSettings
from tests.otlp_receiver import OTLPReceiver

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def receiver(monkeypatch):
    server = OTLPReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "reasonray-unit")
    tracing.reset_for_tests()
    yield server
    tracing.reset_for_tests()
    server.stop()


@pytest.fixture
def untraced(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    tracing.reset_for_tests()
    yield
    tracing.reset_for_tests()


async def run(headers: dict[str, str], query: str = "What is 6 * 7?", strategy: str = "chain_of_thought") -> dict:
    rpc = local_dispatcher(ReasoningSettings(enabled_strategies=["chain_of_thought", "self_consistency"]), SimulatedLLM())
    call = {"jsonrpc": "2.0", "id": 1, "method": "reasoning.execute", "params": {"query": query, "strategy": strategy}}
    with request_span("/rpc", headers) as trace_id:
        payload, _ = await rpc.handle_payload(call, trace_id)
    return payload["result"]


@pytest.mark.parametrize("header", [TRACEPARENT, TRACEPARENT.upper().replace("00-", "00-", 1)])
def test_trace_id_from_a_w3c_traceparent(header):
    assert tracing.trace_id_from(header) == CALLER_TRACE
    assert tracing.trace_id_from("00-" + "0" * 32 + "-00f067aa0ba902b7-01") is None  # invalid per W3C
    assert tracing.trace_id_from("garbage") is None and tracing.trace_id_from(None) is None


async def test_a_request_with_a_traceparent_yields_request_strategy_and_genai_model_call_spans_under_the_callers_trace(receiver):
    result = await run({"traceparent": TRACEPARENT})
    assert result["trace_id"] == CALLER_TRACE
    tracing.flush()
    spans = receiver.wait_for(lambda s: any(x.name == "/rpc" for x in s))
    assert {s.trace_id for s in spans} == {CALLER_TRACE}
    assert {s.service for s in spans} == {"reasonray-unit"}
    by_name = {s.name: s for s in spans}
    request, strategy = by_name["/rpc"], by_name["strategy chain_of_thought"]
    assert request.parent_span_id == "00f067aa0ba902b7" and request.attributes["reasonray.trace_id"] == CALLER_TRACE
    assert strategy.parent_span_id == request.span_id
    [chat] = [s for s in spans if s.name.startswith("chat ")]
    assert chat.parent_span_id == strategy.span_id
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "simulated"
    assert chat.attributes["gen_ai.usage.input_tokens"] > 0 and chat.attributes["gen_ai.usage.output_tokens"] > 0
    assert "6 * 7" in chat.attributes["gen_ai.input.messages"]  # record = "full" (the default)


async def test_without_a_traceparent_the_run_takes_the_spans_trace_id_and_content_follows_the_record_setting(receiver):
    tracing.set_content(False)
    try:
        result = await run({})
    finally:
        tracing.set_content(True)
    tracing.flush()
    spans = receiver.wait_for(lambda s: any(x.name == "/rpc" for x in s))
    assert {s.trace_id for s in spans} == {result["trace_id"]}
    [chat] = [s for s in spans if s.name.startswith("chat ")]
    assert "gen_ai.input.messages" not in chat.attributes and "gen_ai.output.messages" not in chat.attributes


async def consumed_elsewhere(stream) -> list:
    """A streamed body is read after its handler returned, by another task (as the SSE response does)."""

    async def drain() -> list:
        return [item async for item in stream]

    return await asyncio.create_task(drain())


def spans_under_the_callers_trace(receiver, route: str, run_parent: str = "stream") -> dict:
    """The request's spans in the caller's trace; the run's strategy span is a child of `run_parent`, the
    stream's span (or the request's, where the run is admitted before the response starts)."""
    tracing.flush()
    spans = receiver.wait_for(lambda s: any(x.name.startswith("chat ") for x in s) and any(x.name == route for x in s))
    assert {s.trace_id for s in spans} == {CALLER_TRACE}
    by_name = {s.name: s for s in spans}
    request, stream, strategy = by_name[route], by_name[f"{route} stream"], by_name["strategy chain_of_thought"]
    assert request.parent_span_id == "00f067aa0ba902b7" and request.attributes["reasonray.trace_id"] == CALLER_TRACE
    assert stream.parent_span_id == request.span_id
    assert strategy.parent_span_id == {"stream": stream, "request": request}[run_parent].span_id
    return by_name


async def test_a_streamed_rpc_call_honours_the_traceparent_and_its_run_spans_join_the_request(receiver):
    """`reasoning.execute` with `stream: true` (SSE), as serve_app's /rpc route runs it."""
    rpc = local_dispatcher(ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"), SimulatedLLM())
    call = StreamingCall("reasoning.execute", {"query": "What is 6 * 7?"}, 1)
    with request_span("/rpc", {"traceparent": TRACEPARENT}) as trace_id:
        events = in_request_trace("/rpc stream", rpc_sse(rpc, call, trace_id))
    sent = await consumed_elsewhere(events)
    response = json.loads(sent[-1]["data"])
    assert trace_id == CALLER_TRACE and response["result"]["trace_id"] == CALLER_TRACE
    spans_under_the_callers_trace(receiver, "/rpc")


async def test_a_streamed_chat_completion_honours_the_traceparent_and_its_run_spans_join_the_request(receiver):
    """`POST /v1/chat/completions` with `stream: true`, as serve_app's route runs it."""
    rpc = local_dispatcher(ReasoningSettings(enabled_strategies=["chain_of_thought"], default_strategy="chain_of_thought"), SimulatedLLM())
    compat = OpenAICompat(rpc, counter_for_model("simulated"), "simulated")
    body = json.dumps({"model": "reasonray", "stream": True, "messages": [{"role": "user", "content": "What is 6 * 7?"}]})
    with request_span("/v1/chat/completions", {"traceparent": TRACEPARENT}) as trace_id:
        reply = await respond(compat, body.encode(), trace_id)
        chunks = in_request_trace("/v1/chat/completions stream", reply)
    sent = await consumed_elsewhere(chunks)
    assert sent[-1] == "[DONE]" and any("42" in chunk for chunk in sent)
    # progress chunks carry a `reasonray` marker too; the finish chunk is the one that names the trace
    finish = next(json.loads(c) for c in sent if c != "[DONE]" and "trace_id" in json.loads(c).get("reasonray", {}))
    assert finish["reasonray"]["trace_id"] == CALLER_TRACE, finish
    # the run is admitted (auth, limits) before the response starts, so its spans hang from the request's
    spans_under_the_callers_trace(receiver, "/v1/chat/completions", run_parent="request")


async def test_unset_means_no_exporter_no_spans_and_the_traceparent_still_names_the_run(untraced):
    result = await run({"traceparent": TRACEPARENT})
    assert result["trace_id"] == CALLER_TRACE
    assert tracing.inject() == {}  # no exporter: no context to carry
    with tracing.span("anything") as span:
        assert span is tracing.NO_SPAN


def test_export_env_carries_only_otel_variables_and_only_when_configured():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SERVICE_NAME": "s", "PATH": "/bin"}
    assert tracing.export_env(env) == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SERVICE_NAME": "s"}
    assert tracing.export_env({"OTEL_SERVICE_NAME": "s"}) == {}
    assert tracing.export_env({**env, "OTEL_SDK_DISABLED": "true"}) == {}
