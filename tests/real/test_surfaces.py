"""Sessions with server and client tools, streaming, the OpenAI surface (openai SDK) and MCP (mcp SDK), each
against the real model over HTTP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
from mcp import Client as McpClient

from reasonray.client import ReasonRayError
from tests.client_tools import WEATHER
from tests.real.conftest import assert_classified, assert_counts_match, measured


def _turns(client, session_id: str, message: str) -> tuple[list[dict[str, Any]], ReasonRayError | None]:
    """One user turn to its end: resumed with a result for each client call the model made (at most 3 rounds)."""
    seen: list[dict[str, Any]] = []
    try:
        result = client.turn(session_id, message)
        seen.append(result)
        for _ in range(3):
            if result["status"] != "awaiting_client_tools":
                break
            results = [{"tool_call_id": c["tool_call_id"], "content": "Sunny, 21 C"} for c in result["pending_tool_calls"]]
            result = client.resume(session_id, results)
            seen.append(result)
    except ReasonRayError as exc:
        return seen, exc
    return seen, None


def test_a_session_with_server_and_client_tools(client, recorder):
    session = client.create_session(server_tools=["calculator"], client_tools=[WEATHER], max_llm_calls=6)
    sid = session["session_id"]

    (steps, error), _, calls = measured(recorder, lambda: _turns(client, sid, "What is the weather in Lisbon, and what is 12 * 12?"))
    assert steps or error is not None
    if error is not None:
        assert_classified(error)
    for step in steps:
        assert step["status"] in {"completed", "awaiting_client_tools"}, step
        for call in step["pending_tool_calls"]:  # handed to the client: a declared client tool, object arguments
            assert call["name"] == "get_weather" and isinstance(call["arguments"], dict) and call["tool_call_id"], call
        for event in step["trace"]:
            if event.get("type") == "TOOL_EXECUTED":
                assert event["tool"] == "calculator", event
    if error is None:
        assert steps[-1]["status"] == "completed" and steps[-1]["answer"].strip()
    # what the turns charged is what the server counted
    prompt = sum(s["usage"]["prompt_tokens"] for s in steps)
    completion = sum(s["usage"]["completion_tokens"] for s in steps)
    if error is None:
        assert (prompt, completion) == (
            sum(c.usage["prompt_tokens"] for c in calls if c.usage),
            sum(c.usage["completion_tokens"] for c in calls if c.usage),
        )
    state = client.get_session(sid)
    assert state["status"] in {"idle", "awaiting_client_tools", "failed"}, state
    client.close_session(sid)


def test_the_session_keeps_its_history_across_turns(client, recorder):
    sid = client.create_session(server_tools=["calculator"], max_llm_calls=4)["session_id"]
    for message in ("My name is Ada.", "What is my name?"):
        (_steps, error), _, _ = measured(recorder, lambda message=message: _turns(client, sid, message))
        if error is not None:
            assert_classified(error)
            return
    second = recorder.calls[-1].request["messages"]
    assert any("My name is Ada." in (m.get("content") or "") for m in second if m["role"] == "user"), second
    client.close_session(sid)


def test_jsonrpc_stream_sends_events_then_the_result(client, recorder):
    events, error, calls = measured(
        recorder,
        lambda: list(client.execute_stream("What is 5 + 12?", strategy="chain_of_thought", strategy_config={"max_tokens": 96})),
    )
    if error is not None:
        assert_classified(error)
        return
    assert events is not None and events[-1].type == "result", [e.type for e in events]
    assert any(e.type == "LLM_INVOCATION" for e in events[:-1])
    result = events[-1].data
    assert result["answer"].strip()
    assert_counts_match(result["metrics"], calls)


def _sdk(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.url}/v1", api_key="unused", max_retries=0, timeout=600)


def test_openai_sdk_completion_reports_the_servers_usage(service, recorder):
    sdk = _sdk(service)
    completion, error, calls = measured(
        recorder,
        lambda: sdk.chat.completions.create(
            model="reasonray/self_consistency",
            messages=[{"role": "user", "content": "What is 9 + 8?"}],
            extra_body={"reasoning": {"strategy_config": {"samples": 3, "max_tokens": 96}}},
        ),
    )
    assert error is None
    assert completion is not None
    assert completion.choices[0].message.content.strip()
    assert completion.usage.prompt_tokens == sum(c.usage["prompt_tokens"] for c in calls if c.usage)
    assert completion.usage.completion_tokens == sum(c.usage["completion_tokens"] for c in calls if c.usage)
    assert completion.model_extra["reasonray"]["metrics"]["llm_calls"] == len(calls)


def test_openai_sdk_stream_ends_with_the_answer_and_usage(service, recorder):
    sdk = _sdk(service)

    def stream() -> list[Any]:
        return list(
            sdk.chat.completions.create(
                model="reasonray/chain_of_thought",
                messages=[{"role": "user", "content": "What is 3 + 4?"}],
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"reasoning": {"strategy_config": {"max_tokens": 96}}},
            )
        )

    chunks, error, calls = measured(recorder, stream)
    assert error is None and chunks
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    usage = next(c.usage for c in reversed(chunks) if c.usage)
    assert usage.completion_tokens == sum(c.usage["completion_tokens"] for c in calls if c.usage)
    assert usage.prompt_tokens == sum(c.usage["prompt_tokens"] for c in calls if c.usage)


def test_openai_sdk_errors_keep_openais_shape(service):
    sdk = _sdk(service)
    try:
        sdk.chat.completions.create(
            model="reasonray/bounded_context",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"reasoning": {"strategy_config": {"chunk_size": 2048, "carryover_size": 4096}}},
        )
    except openai.BadRequestError as exc:
        assert exc.code == "invalid_params"
    else:
        raise AssertionError("a carryover above the chunk size was accepted")


async def _mcp_reason(url: str) -> tuple[Any, Any]:
    async with McpClient(url) as mcp:
        tools = {t.name for t in (await mcp.list_tools()).tools}
        result = await mcp.call_tool("reason", {"query": "What is 6 + 7?", "strategy": "chain_of_thought"})
        return tools, result


def test_mcp_reason_tool_answers_from_the_real_model(service, recorder):
    (tools, result), error, calls = measured(recorder, lambda: asyncio.run(_mcp_reason(f"{service.url}/mcp")))
    assert error is None and "reason" in tools
    if result.is_error:
        body = json.loads(result.content[0].text)
        assert body["code"] in {-32001, -32010, -32013, -32015}, body
        return
    content = result.structured_content
    assert content["answer"].strip() and content["metrics"]["model"] == "smollm2"
    assert_counts_match(content["metrics"], calls)
