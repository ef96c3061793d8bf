"""The service as the clients people already use see it: the openai SDK and LangChain at /v1, the mcp
SDK at /mcp, JSON-RPC streaming and rpc.discover through reasonray.Client."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from langchain_openai import ChatOpenAI
from mcp import Client as McpClient

from reasonray import AsyncClient, Client, ReasonRayError
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from tests.client_tools import WEATHER
from tests.integration.conftest import own_app
from tests.serving import MCP_STDIO, mcp_stdio_env
from tests.unit.test_openrpc import meta_validator

# 30 bounded-context iterations, then the final answer (the reasoning needs about 60 chunks)
THIRTY_CHUNKS = {"chunk_size": 1024, "carryover_size": 512, "max_iterations": 30, "on_max_iterations": "final_answer"}


@pytest.fixture(scope="module")
def sdk(api, serve_base):
    return openai.OpenAI(base_url=f"{serve_base}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def slow(serve_base):
    """An application whose model takes 40 ms per call: a 30-chunk run lasts over a second."""
    simulator = SimulatorServer(SimulatorSettings(port=0, ttft_ms=40)).start()
    try:
        with own_app(serve_base, simulator.url, "clients-slow") as (client, _):
            yield openai.OpenAI(base_url=str(client.base_url).rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=120), simulator
    finally:
        simulator.stop()


def test_models_list_every_enabled_strategy(sdk, api):
    ids = [m.id for m in sdk.models.list()]
    enabled = [s["name"] for s in api.get("/v1/strategies").json()["strategies"]]
    assert ids == ["reasonray", *(f"reasonray/{s}" for s in enabled)]


def test_plain_completion_has_the_answer_real_usage_and_reasonray_metrics(sdk):
    completion = sdk.chat.completions.create(
        model="reasonray/chain_of_thought",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 17 * 23?"}],
    )
    choice = completion.choices[0]
    assert choice.message.content == "391" and choice.finish_reason == "stop"
    extra = completion.model_extra["reasonray"]
    metrics = extra["metrics"]
    assert completion.usage.prompt_tokens == metrics["prompt_tokens"] and completion.usage.completion_tokens == metrics["completion_tokens"]
    assert completion.usage.total_tokens == metrics["total_tokens"]
    assert 0 < completion.usage.completion_tokens_details.reasoning_tokens < completion.usage.completion_tokens
    assert completion.id == f"chatcmpl-{extra['trace_id']}" and extra["strategy_used"] == "chain_of_thought"


def test_usage_sums_every_call_of_a_multi_call_run(sdk):
    completion = sdk.chat.completions.create(
        model="bounded_context:any-model",
        messages=[{"role": "user", "content": "[[sim think=30000 answer=7]] Work it out."}],
        extra_body={"reasoning": {"strategy_config": {"max_iterations": 10}}},
    )
    metrics = completion.model_extra["reasonray"]["metrics"]
    assert completion.choices[0].message.content == "7" and metrics["llm_calls"] >= 3
    assert completion.usage.completion_tokens == metrics["completion_tokens"] > 20000


def test_extra_body_reasoning_chooses_the_strategy_and_its_config(sdk):
    completion = sdk.chat.completions.create(
        model="reasonray",
        messages=[{"role": "user", "content": "What is 6 * 7?"}],
        extra_body={"reasoning": {"strategy": "self_consistency", "strategy_config": {"samples": 3}}},
    )
    extra = completion.model_extra["reasonray"]
    assert completion.choices[0].message.content == "42"
    assert extra["strategy_used"] == "self_consistency" and extra["resolution"]["config_sources"]["samples"] == "request"


def test_errors_have_openais_shape_and_status(sdk):
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.status_code == 404 and unknown.value.code == "model_not_found" and "reasonray/" in unknown.value.message
    with pytest.raises(openai.NotFoundError) as not_enabled:  # streamed: refused before the stream starts, not in a chunk
        sdk.chat.completions.create(model="reasonray/no_such_strategy", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert not_enabled.value.code == "model_not_found" and not_enabled.value.body["reasonray"]["code"] == -32002
    with pytest.raises(openai.BadRequestError) as bad_config:
        sdk.chat.completions.create(
            model="reasonray/bounded_context",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"reasoning": {"strategy_config": {"chunk_size": 4096, "carryover_size": 8192}}},
        )
    assert bad_config.value.code == "invalid_params" and bad_config.value.body["reasonray"]["code"] == -32602
    with pytest.raises(openai.BadRequestError) as no_user:
        sdk.chat.completions.create(model="reasonray", messages=[{"role": "system", "content": "only a system message"}])
    assert no_user.value.param == "messages"


def test_stream_sends_progress_as_it_happens_then_the_answer_usage_and_done(slow):
    sdk, _ = slow
    started = time.monotonic()
    stream = sdk.chat.completions.create(
        model="reasonray/bounded_context",
        messages=[{"role": "user", "content": "[[sim think=60000 answer=7]] go"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"reasoning": {"strategy_config": THIRTY_CHUNKS}},
    )
    arrivals, reasoning, content, finish, usage, extra = [], [], "", None, None, {}
    for chunk in stream:
        arrivals.append(time.monotonic() - started)
        extra = (chunk.model_extra or {}).get("reasonray") or extra
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta.model_extra or {}
            if delta.get("reasoning_content"):
                reasoning.append((arrivals[-1], delta["reasoning_content"]))
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    iterations = [t for t, text in reasoning if text.startswith("[iteration")]
    assert len(iterations) == 30 and content == "7" and finish == "stop"
    # the stream opened, and progress arrived, while the run went on (over a second: 30 calls of 40 ms at least),
    # not all at its end; how soon after the request is the machine's business (seconds on a loaded CI runner)
    assert arrivals[-1] - arrivals[0] > 1.0 and arrivals[-1] - iterations[0] > 1.0, (arrivals[0], iterations[0], arrivals[-1])
    metrics = extra["metrics"]  # on the finish chunk
    assert metrics["llm_calls"] >= 31 and usage.completion_tokens == metrics["completion_tokens"] > 30 * 300
    assert usage.prompt_tokens == metrics["prompt_tokens"]


def test_client_disconnect_cancels_the_run(slow):
    sdk, simulator = slow
    requests = lambda: httpx.get(f"{simulator.url}/sim/stats").json()["requests"]
    stream = sdk.chat.completions.create(
        model="reasonray/bounded_context",
        messages=[{"role": "user", "content": "[[sim think=60000 answer=8]] cancel me"}],
        stream=True,
        extra_body={"reasoning": {"strategy_config": THIRTY_CHUNKS}},
    )
    seen = 0
    for chunk in stream:
        delta = chunk.choices[0].delta.model_extra or {} if chunk.choices else {}
        seen += str(delta.get("reasoning_content", "")).startswith("[iteration")
        if seen == 3:
            break
    stream.close()
    at_close = requests()
    time.sleep(1.0)  # a run still going would make about 25 more calls in this second
    assert requests() - at_close <= 2


def test_tools_hand_off_to_the_client_and_resume_with_the_tool_result(sdk):
    messages = [{"role": "user", "content": 'Weather in Oslo? [[sim call=get_weather {"city": "Oslo"}]]'}]
    first = sdk.chat.completions.create(model="reasonray", messages=messages, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    messages += [choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "Snow"}]
    second = sdk.chat.completions.create(model="reasonray", messages=messages, tools=[WEATHER])
    assert second.choices[0].message.content == "Snow" and second.choices[0].finish_reason == "stop"
    assert second.model_extra["reasonray"]["session_id"] == first.model_extra["reasonray"]["session_id"]
    assert second.usage.prompt_tokens > 0 and second.usage.total_tokens == second.usage.prompt_tokens + second.usage.completion_tokens


def test_langchain_chat_openai_answers_and_streams(api, serve_base):
    llm = ChatOpenAI(base_url=f"{serve_base}/v1", api_key="unused", model="reasonray/chain_of_thought", max_retries=0)
    assert llm.invoke("What is 17 * 23?").content == "391"
    assert "".join(chunk.content for chunk in llm.stream("What is 17 * 23?")) == "391"


def test_jsonrpc_stream_sends_the_events_then_the_response(api, serve_base):
    with Client(serve_base) as rr:
        events = list(rr.execute_stream("[[sim think=9000 answer=5]] go", strategy="bounded_context"))
        traced = list(rr.execute_stream("What is 17 * 23?", include_trace=True))
        with pytest.raises(ReasonRayError) as failed:
            list(rr.execute_stream("q", strategy="no_such_strategy"))
    kinds = [e.type for e in events]
    assert kinds[0] == "LLM_INVOCATION" and "ITERATION_END" in kinds and kinds[-2:] == ["RUN_END", "result"]
    assert events[-1].data["answer"] == "5" and {e.data["trace_id"] for e in events[:-1]} == {events[-1].data["trace_id"]}
    invocation = events[0].data
    assert "messages" not in invocation and "<thinking>" not in invocation["responses"][0]  # no trace asked: no thinking
    assert "<thinking>" in traced[0].data["responses"][0] and traced[0].data["messages"]
    assert failed.value.code == -32002


def test_rpc_discover_is_a_valid_openrpc_document_of_every_method(api, serve_base):
    with Client(serve_base) as rr:
        document = rr.discover()
        methods = rr.call("reasoning.strategies")  # any call works through `call`
    meta_validator().validate(document)
    names = {m["name"] for m in document["methods"]}
    assert {"reasoning.execute", "session.turn", "memory.retrieve", "solve_coding_task", "rpc.discover"} <= names
    assert methods["default_strategy"]


@pytest.mark.parametrize("page", ["docs/api.md", "docs/openai.md", "docs/mcp.md"])
def test_the_python_examples_of_the_client_pages_run_against_the_service(api, serve_base, monkeypatch, page):
    from tests.docs_examples import blocks

    monkeypatch.setenv("REASONRAY_URL", serve_base)
    code = blocks(page, "python")
    assert code
    namespace = {"__name__": "docs_example"}
    for block in code:  # in order, sharing names, as a reader runs them
        exec(compile(block, page, "exec"), namespace)


def test_async_client_sessions(api, serve_base):
    async def run():
        async with AsyncClient(serve_base) as rr:
            session = await rr.create_session(client_tools=[WEATHER])
            turn = await rr.turn(session["session_id"], '[[sim call=get_weather {"city": "Rome"}]]')
            [pending] = turn["pending_tool_calls"]
            done = await rr.resume(session["session_id"], [{"tool_call_id": pending["tool_call_id"], "content": "Sun"}])
            events = [e.type async for e in rr.execute_stream("What is 2 + 2?")]
            return done, events

    done, events = asyncio.run(run())
    assert done["answer"] == "Sun" and events[-1] == "result"


# -- MCP ----------------------------------------------------------------------------------------------
def _tool_arguments(memory_id: str, session_id: str) -> dict[str, dict]:
    return {
        "reason": {"query": "What is 17 * 23?", "strategy": "chain_of_thought"},
        "solve_coding_task": {"task": "Write add(a, b) returning a + b.", "enable_matts": False, "tests": "assert add(2, 3) == 5"},
        "retrieve_memories": {"query": "add two numbers"},
        "get_memory_genealogy": {"memory_id": memory_id},
        "get_statistics": {},
        "session_create": {"server_tools": ["calculator"]},
        "session_turn": {"session_id": session_id, "message": "What is 6 * 7?"},
        "session_get": {"session_id": session_id},
        "session_resume": {"session_id": session_id, "tool_results": [{"tool_call_id": "none", "content": "x"}]},
        "session_close": {"session_id": session_id},
    }


async def _exercise_mcp(server) -> dict[str, object]:
    async with McpClient(server) as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        session = (await mcp.call_tool("session_create", {"server_tools": ["calculator"]})).structured_content
        stored = await mcp.call_tool(
            "solve_coding_task", {"task": "Write add(a, b).", "enable_matts": False, "tests": "assert add(2, 3) == 5"}
        )
        memory_ids = stored.structured_content["memories_stored"]
        results = {}
        for name, arguments in _tool_arguments(memory_ids[0] if memory_ids else "missing", session["session_id"]).items():
            jsonschema.validate(arguments, tools[name].input_schema)
            results[name] = await mcp.call_tool(name, arguments)
        resources = [str(r.uri) for r in (await mcp.list_resources()).resources]
        strategies = await mcp.read_resource("reasonray://strategies")
        return {"tools": tools, "results": results, "resources": resources, "strategies": json.loads(strategies.contents[0].text)}


def _check_mcp(seen: dict) -> None:
    tools, results = seen["tools"], seen["results"]
    assert set(tools) == set(_tool_arguments("m", "s"))
    for name, result in results.items():
        if name == "session_resume":  # no calls are pending: the JSON-RPC error comes back as a tool error
            assert result.is_error and json.loads(result.content[0].text)["code"] == -32007
            continue
        assert not result.is_error, (name, result.content)
        assert result.structured_content == json.loads(result.content[0].text)
        if tools[name].output_schema:
            jsonschema.validate(result.structured_content, tools[name].output_schema)
    assert results["reason"].structured_content["answer"] == "391"
    assert results["session_turn"].structured_content["answer"] == "42"
    assert "traces" in results["get_statistics"].structured_content
    assert "reasonray://strategies" in seen["resources"] and seen["strategies"]["default_strategy"]


def test_mcp_over_streamable_http(api, serve_base):
    _check_mcp(asyncio.run(_exercise_mcp(f"{serve_base}/mcp")))


# slow suite: every tool of the checks above, over stdio (a minute of the default run); the default run covers the
# stdio transport with tests/integration/test_surfaces_auth_http.py's tool calls and the exit below, and every tool
# over streamable HTTP
@pytest.mark.slow
def test_every_mcp_tool_over_stdio(simulator, tmp_path):
    from mcp import StdioServerParameters

    server = StdioServerParameters(command=MCP_STDIO[0], args=MCP_STDIO[1:], env=mcp_stdio_env(simulator.url, tmp_path))
    _check_mcp(asyncio.run(_exercise_mcp(server)))


def test_mcp_over_stdio_fails_fast_without_a_model_key(simulator, tmp_path):
    env = mcp_stdio_env(simulator.url, tmp_path)
    keyless = {k: v for k, v in env.items() if k != "REASONRAY_LLM__BASE_URL"} | {"REASONRAY_LLM__PROVIDER": "openai"}
    failed = subprocess.run(MCP_STDIO, env=keyless, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 2 and "OPENAI_API_KEY is not set" in failed.stderr


def test_mcp_over_stdio_closes_its_model_client_at_exit(simulator, tmp_path):
    env = mcp_stdio_env(simulator.url, tmp_path) | {"PYTHONASYNCIODEBUG": "1"}
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "reason", "arguments": {"query": "What is 6 * 7?"}}},
    ]
    proc = subprocess.Popen(
        MCP_STDIO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    for message in messages:
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
    replies = [json.loads(proc.stdout.readline()) for _ in range(2)]
    assert replies[1]["result"]["structuredContent"]["answer"] == "42"  # the model client was used
    _, stderr = proc.communicate(timeout=60)  # closes stdin: the client goes away, the server ends
    assert proc.returncode == 0, stderr
    assert "Unclosed client session" not in stderr and "Unclosed connector" not in stderr, stderr


def test_mcp_over_stdio_logs_on_stderr_at_the_operators_level(simulator, tmp_path):
    """A warning logged while `reasonray mcp` starts (here: no tiktoken files and no way to fetch them, through a
    proxy nobody listens on) goes to stderr, never into the protocol on stdout; info lines stay out at level warning."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    (tmp_path / "no-tiktoken").mkdir()
    no_files = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "no-tiktoken"), "HTTPS_PROXY": closed, "HTTP_PROXY": closed}
    env = mcp_stdio_env(simulator.url, tmp_path, **no_files, NO_PROXY="127.0.0.1,localhost")
    initialize = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "reason", "arguments": {"query": "What is 6 * 7?"}}},
    ]
    sent = "".join(json.dumps(message) + "\n" for message in messages)
    with subprocess.Popen(MCP_STDIO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(sent)
        proc.stdin.flush()
        replies = [json.loads(proc.stdout.readline()) for _ in range(2)]  # a log line here would not parse
        _, stderr = proc.communicate(timeout=60)
    assert [reply["id"] for reply in replies] == [1, 2] and replies[1]["result"]["structuredContent"]["answer"] == "42"
    assert "tokenizer.fallback_estimate" in stderr  # the warning was logged, on stderr
    assert "[info" not in stderr and '"level": "info"' not in stderr, stderr


def test_ask_and_the_client_pass_reasoning_effort_and_show_the_models_thinking(api, serve_base):
    """`reasonray ask --reasoning-effort --show-reasoning` against a model that thinks (the simulator's field form):
    the effort reaches the model, the thinking is shown apart from the answer, and counted."""
    question = "[[sim reasoning=field thinking=40]] What is 6 * 7?"
    with Client(serve_base) as rr:
        result = rr.execute(question, strategy="chain_of_thought", reasoning_effort="low", thinking_budget=4096)
    assert result["answer"] == "42" and result["reasoning"] and result["reasoning"] != result["answer"]
    assert result["metrics"]["reasoning_tokens"] > 0
    cli = Path(sys.executable).parent / "reasonray"
    shown = subprocess.run(
        [cli, "ask", question, "--url", serve_base, "--reasoning-effort", "low", "--show-reasoning", "--strategy", "chain_of_thought"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    thinking, _, rest = shown.stdout.partition("</thinking>\n")
    assert thinking.startswith("<thinking>\n") and len(thinking) > len("<thinking>\n") + 10
    assert rest.splitlines()[0] == "42"
