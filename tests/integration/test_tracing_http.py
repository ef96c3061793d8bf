"""OpenTelemetry against the running service: a request with a W3C traceparent yields spans for the
request, the strategy, each self-consistency branch (Ray tasks in other processes) and each model
call, all under the caller's trace id, received by a local OTLP/HTTP receiver."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import own_app, result_of
from tests.otlp_receiver import OTLPReceiver

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


def execute(client, query: str, trace_id: str, **params):
    call = {"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": query, **params}, "id": 1}
    return client.post("/rpc", json=call, headers={"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"})


@pytest.fixture(scope="module")
def traced(serve_base, simulator):
    receiver = OTLPReceiver().start()
    with pytest.MonkeyPatch.context() as env:  # what `OTEL_... reasonray serve` would have in its environment
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        env.setenv("OTEL_SERVICE_NAME", "reasonray-it")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        with own_app(serve_base, simulator.url, "traced") as (client, _):
            env.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
            yield client, receiver
    receiver.stop()


def test_one_request_with_a_traceparent_yields_request_strategy_branch_and_model_call_spans_in_the_callers_trace(traced):
    client, receiver = traced
    run = result_of(execute(client, "What is 12 * 12?", CALLER_TRACE, strategy="self_consistency", strategy_config={"samples": 3}))
    assert run["trace_id"] == CALLER_TRACE

    def complete(spans):
        ours = [s for s in spans if s.trace_id == CALLER_TRACE]
        return (
            sum(s.name.startswith("branch ") for s in ours) == 3
            and sum(s.name.startswith("chat ") for s in ours) == 3
            and any(s.name == "/rpc" for s in ours)
        )

    spans = [s for s in receiver.wait_for(complete, timeout_s=60) if s.trace_id == CALLER_TRACE]
    by_id = {s.span_id: s for s in spans}
    [request] = [s for s in spans if s.name == "/rpc"]
    [strategy] = [s for s in spans if s.name == "strategy self_consistency"]
    branches = [s for s in spans if s.name.startswith("branch ")]
    calls = [s for s in spans if s.name.startswith("chat ")]
    assert request.parent_span_id == CALLER_SPAN and strategy.parent_span_id == request.span_id
    assert sorted(b.name for b in branches) == [f"branch self_consistency.sample[{i}]" for i in range(3)]
    assert all(b.parent_span_id == strategy.span_id for b in branches)  # the context travelled with the Ray task
    assert {by_id[c.parent_span_id].name for c in calls} <= {b.name for b in branches}
    for call in calls:
        assert call.attributes["gen_ai.operation.name"] == "chat" and call.attributes["gen_ai.request.model"] == "simulated"
        assert call.attributes["gen_ai.usage.input_tokens"] > 0 and call.attributes["gen_ai.usage.output_tokens"] > 0
    assert {s.service for s in spans} == {"reasonray-it"}


def test_without_otel_variables_nothing_is_exported_and_the_traceparent_still_names_the_run(api, traced):
    _, receiver = traced
    untraced = "1" * 32
    run = result_of(execute(api, "What is 2 + 2?", untraced))
    assert run["trace_id"] == untraced  # ReasonRay's trace id, event log and logs agree with the caller's
    client, _ = traced
    marker = "2" * 32  # a request to the traced app after it: once its spans are in, the other's would be too
    result_of(execute(client, "What is 3 + 3?", marker))
    spans = receiver.wait_for(lambda s: any(x.trace_id == marker and x.name == "/rpc" for x in s))
    assert not [s for s in spans if s.trace_id == untraced]


def test_streamed_rpc_and_streamed_chat_completions_honour_the_traceparent(traced):
    """`stream: true` on /rpc (SSE) and on /v1/chat/completions: the run takes the caller's trace id, and
    its spans (strategy, model calls) hang under the request in the caller's trace: under the stream's span
    on /rpc, under the request's own span for a chat completion (admitted before the response starts, so a
    refusal is still an HTTP error; docs/interop.md)."""
    client, receiver = traced
    rpc_trace, chat_trace = "3" * 32, "4" * 32
    params = {"query": "What is 5 + 5?", "strategy": "chain_of_thought", "stream": True}
    call = {"jsonrpc": "2.0", "method": "reasoning.execute", "params": params, "id": 1}
    streamed = client.post("/rpc", json=call, headers={"traceparent": f"00-{rpc_trace}-{CALLER_SPAN}-01"})
    assert streamed.headers["x-trace-id"] == rpc_trace
    lines = streamed.text.splitlines()
    response = json.loads(lines[lines.index("event: response") + 1].removeprefix("data: "))
    assert response["result"]["trace_id"] == rpc_trace
    chat = {"model": "reasonray", "stream": True, "messages": [{"role": "user", "content": "What is 5 + 5?"}]}
    chunks = client.post("/v1/chat/completions", json=chat, headers={"traceparent": f"00-{chat_trace}-{CALLER_SPAN}-01"})
    assert chunks.headers["x-trace-id"] == chat_trace and "[DONE]" in chunks.text

    def complete(spans):
        return all(
            any(s.trace_id == trace and s.name.startswith("chat ") for s in spans) and any(s.name == f"{route} stream" for s in spans)
            for trace, route in ((rpc_trace, "/rpc"), (chat_trace, "/v1/chat/completions"))
        )

    spans = receiver.wait_for(complete, timeout_s=60)
    for trace, route in ((rpc_trace, "/rpc"), (chat_trace, "/v1/chat/completions")):
        ours = {s.name: s for s in spans if s.trace_id == trace}
        request, stream, strategy = ours[route], ours[f"{route} stream"], ours["strategy chain_of_thought"]
        assert request.parent_span_id == CALLER_SPAN and stream.parent_span_id == request.span_id
        assert strategy.parent_span_id == (stream.span_id if route == "/rpc" else request.span_id)
