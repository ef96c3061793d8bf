"""The OpenAI and MCP surfaces with `[auth] jwt_secret` set, through the clients people use: the openai SDK
at /v1, the mcp SDK over Streamable HTTP at /mcp, and `reasonray mcp` over stdio.

For each: no token is refused (401 / OpenAI's error shape / an MCP error, or a stdio server that will
not start), a token whose role lacks the strategy or the method is refused with 403 / -32003, a valid
token works, and another principal's session is out of reach.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import httpx2
import openai
import pytest
from mcp import Client as McpClient
from mcp import MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from reasonray.api.access.auth import mint_token
from tests.integration.conftest import own_app
from tests.serving import MCP_STDIO, mcp_stdio_env

pytestmark = pytest.mark.integration

SECRET = "surfaces-secret-" + "z" * 32
ROLES = {
    "reasoner": {"methods": ["*"], "strategies": ["*"]},
    "cot_only": {"methods": ["*"], "strategies": ["chain_of_thought"]},
    "lister": {"methods": ["reasoning.strategies"], "strategies": ["*"]},
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
ASK = [{"role": "user", "content": "What is 17 * 23?"}]


def token(sub: str, *roles: str, secret: str = SECRET) -> str:
    return mint_token(secret, sub, list(roles), 600)


@pytest.fixture(scope="module")
def secured(serve_base, simulator):
    with own_app(serve_base, simulator.url, "surfaces-auth", auth={"jwt_secret": SECRET, "roles": ROLES}) as (client, settings):
        yield str(client.base_url).rstrip("/"), settings


def sdk(base: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0, timeout=120)


# -- the openai SDK --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_openai_refuses_a_missing_or_forged_token_with_401_in_openais_shape(secured, stream):
    base, _ = secured
    forged = token("alice", "reasoner", secret="another-secret-" + "y" * 32)
    for api_key, why in [("unused", "malformed token"), (forged, "invalid token: signature verification failed")]:
        with pytest.raises(openai.AuthenticationError) as refused:
            sdk(base, api_key).chat.completions.create(model="reasonray", messages=ASK, stream=stream)
        error = refused.value
        assert error.status_code == 401 and error.response.headers["WWW-Authenticate"].startswith("Bearer")
        assert error.type == "authentication_error" and error.code == "unauthenticated" and why in error.message
        assert error.body["reasonray"]["code"] == -32016
        with pytest.raises(openai.AuthenticationError) as listing:
            sdk(base, api_key).models.list()
        assert listing.value.body["reasonray"]["code"] == -32016 and why in listing.value.message
    # the SDK always sends its api_key; without any Authorization header the answer has the same shape
    bare = httpx.post(f"{base}/v1/chat/completions", json={"model": "reasonray", "messages": ASK, "stream": stream}, timeout=60)
    assert bare.status_code == 401 and bare.json()["error"]["type"] == "authentication_error"
    assert bare.json()["error"]["code"] == "unauthenticated" and "missing credentials" in bare.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_refuses_a_role_without_the_strategy_or_the_method_with_403(secured, stream):
    base, _ = secured
    with pytest.raises(openai.PermissionDeniedError) as strategy:  # streamed: refused before the stream starts
        sdk(base, token("carol", "cot_only")).chat.completions.create(model="reasonray/tree_of_thought", messages=ASK, stream=stream)
    assert strategy.value.status_code == 403 and strategy.value.type == "permission_error"
    assert strategy.value.body["reasonray"]["code"] == -32003 and strategy.value.body["reasonray"]["data"]["strategy"] == "tree_of_thought"
    with pytest.raises(openai.PermissionDeniedError) as method:
        sdk(base, token("dave", "lister")).chat.completions.create(model="reasonray", messages=ASK, stream=stream)
    assert method.value.body["reasonray"]["code"] == -32003 and "reasoning.execute" in method.value.message
    assert "reasonray" in {m.id for m in sdk(base, token("dave", "lister")).models.list()}  # what the role may call works


def test_openai_with_a_valid_token_answers_plain_and_streamed(secured):
    base, _ = secured
    client = sdk(base, token("alice", "cot_only"))
    plain = client.chat.completions.create(model="reasonray/chain_of_thought", messages=ASK)
    assert plain.choices[0].message.content == "391" and plain.usage.total_tokens > 0
    chunks = list(
        client.chat.completions.create(
            model="reasonray/chain_of_thought", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "391"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0


def test_openai_tool_round_trip_resumes_only_the_callers_own_session(secured):
    base, _ = secured
    messages = [{"role": "user", "content": 'Weather? [[sim call=get_weather {"city": "Oslo"}]]'}]
    alice = sdk(base, token("alice", "reasoner"))
    first = alice.chat.completions.create(model="reasonray", messages=messages, tools=[WEATHER])
    assert first.choices[0].finish_reason == "tool_calls"
    [call] = first.choices[0].message.tool_calls
    answered = [
        *messages,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Snow"},
    ]
    with pytest.raises(openai.PermissionDeniedError) as stolen:
        sdk(base, token("bob", "reasoner")).chat.completions.create(model="reasonray", messages=answered, tools=[WEATHER])
    assert stolen.value.body["reasonray"]["code"] == -32003
    second = alice.chat.completions.create(model="reasonray", messages=answered, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "Snow"


# -- the mcp SDK over Streamable HTTP --------------------------------------------------------------------------


def mcp_http(base: str, bearer: str | None) -> McpClient:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    return McpClient(streamable_http_client(f"{base}/mcp", http_client=http))


def error_of(result) -> dict:
    assert result.is_error, result.structured_content
    return json.loads(result.content[0].text)


def _mcp_errors(exc: BaseException) -> list[MCPError]:
    if isinstance(exc, MCPError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        return [e for inner in exc.exceptions for e in _mcp_errors(inner)]
    return []


def test_mcp_over_http_refuses_a_missing_token_before_any_message(secured):
    base, _ = secured

    async def connect(bearer: str | None) -> None:
        async with mcp_http(base, bearer) as mcp:
            await mcp.list_tools()

    for bearer in (None, token("alice", "reasoner", secret="another-secret-" + "y" * 32)):
        with pytest.raises(BaseException) as refused:
            asyncio.run(connect(bearer))
        [error] = _mcp_errors(refused.value)
        assert error.error.code == -32016, error.error


def test_mcp_over_http_runs_each_call_as_the_tokens_principal(secured):
    base, _ = secured

    async def exercise() -> dict:
        seen: dict = {}
        async with mcp_http(base, token("alice", "reasoner")) as alice:
            seen["reason"] = await alice.call_tool("reason", {"query": "What is 17 * 23?", "strategy": "tree_of_thought"})
            session = (await alice.call_tool("session_create", {"server_tools": ["calculator"]})).structured_content
            seen["turn"] = await alice.call_tool("session_turn", {"session_id": session["session_id"], "message": "What is 6 * 7?"})
        async with mcp_http(base, token("bob", "reasoner")) as bob:
            seen["bob_get"] = await bob.call_tool("session_get", {"session_id": session["session_id"]})
            seen["bob_nothing"] = await bob.call_tool("session_get", {"session_id": "0" * 32})
            seen["bob_turn"] = await bob.call_tool("session_turn", {"session_id": session["session_id"], "message": "hi"})
            try:
                await bob.read_resource(f"reasonray://sessions/{session['session_id']}")
                seen["bob_resource"] = None
            except MCPError as exc:
                seen["bob_resource"] = exc.code
        async with mcp_http(base, token("carol", "cot_only")) as carol:
            seen["carol_tot"] = await carol.call_tool("reason", {"query": "2+2?", "strategy": "tree_of_thought"})
        async with mcp_http(base, token("dave", "lister")) as dave:
            seen["dave_session"] = await dave.call_tool("session_create", {})
            seen["dave_strategies"] = (await dave.read_resource("reasonray://strategies")).contents[0].text
        async with mcp_http(base, token("alice", "reasoner")) as alice:
            seen["alice_get"] = await alice.call_tool("session_get", {"session_id": session["session_id"]})
        return seen

    seen = asyncio.run(exercise())
    assert not seen["reason"].is_error and seen["reason"].structured_content["answer"] == "391"
    assert seen["turn"].structured_content["answer"] == "42"
    theirs, nothing = error_of(seen["bob_get"]), error_of(seen["bob_nothing"])
    assert theirs["code"] == nothing["code"] == -32003 and theirs["message"].split("'")[0] == nothing["message"].split("'")[0]
    assert error_of(seen["bob_turn"])["code"] == -32003
    assert seen["bob_resource"] == -32003
    carol = error_of(seen["carol_tot"])
    assert carol["code"] == -32003 and carol["data"]["strategy"] == "tree_of_thought"
    assert error_of(seen["dave_session"])["code"] == -32003 and "chain_of_thought" in seen["dave_strategies"]
    assert not seen["alice_get"].is_error and seen["alice_get"].structured_content["turn"] == 1


# -- `reasonray mcp` over stdio ----------------------------------------------------------------------------


def stdio_env(sim_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    return mcp_stdio_env(sim_url, data_dir, REASONRAY_MEMORY__ENABLED="false", REASONRAY_AUTH__JWT_SECRET=SECRET, **extra)


REPO = Path(__file__).resolve().parents[2]


def stdio_config(tmp_path: Path) -> str:
    """The repository's config.toml with this module's roles (the secret comes from the environment)."""
    roles = "".join(
        f"\n[auth.roles.{name}]\nmethods = {json.dumps(role['methods'])}\nstrategies = {json.dumps(role['strategies'])}\n"
        for name, role in ROLES.items()
    )
    path = tmp_path / "config.toml"
    path.write_text((REPO / "config.toml").read_text() + roles)
    return str(path)


def test_stdio_refuses_to_start_without_a_valid_token_when_auth_is_configured(simulator, tmp_path):
    missing = subprocess.run(
        MCP_STDIO, env=stdio_env(simulator.url, tmp_path), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert missing.returncode == 2, missing.stderr
    assert "no bearer token was given" in missing.stderr and "--token" in missing.stderr and "REASONRAY_TOKEN" in missing.stderr
    assert "error_type: unauthenticated" in missing.stderr and missing.stdout == ""
    forged = token("alice", "reasoner", secret="another-secret-" + "y" * 32)
    refused = subprocess.run(
        [*MCP_STDIO, "--token", forged],
        env=stdio_env(simulator.url, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert refused.returncode == 2 and "was refused: invalid token: signature verification failed" in refused.stderr
    expired = mint_token(SECRET, "alice", ["reasoner"], -3600)
    env = stdio_env(simulator.url, tmp_path, REASONRAY_TOKEN=expired)
    late = subprocess.run(MCP_STDIO, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert late.returncode == 2 and "token expired" in late.stderr


def test_stdio_runs_every_call_as_the_tokens_principal_through_the_guard(simulator, tmp_path):
    config = stdio_config(tmp_path)

    def server(sub: str, *roles: str) -> StdioServerParameters:
        env = stdio_env(simulator.url, tmp_path, REASONRAY_TOKEN=token(sub, *roles))
        return StdioServerParameters(command=MCP_STDIO[0], args=[*MCP_STDIO[1:], "--config", config], env=env)

    async def exercise() -> dict:
        seen: dict = {}
        async with McpClient(server("alice", "reasoner")) as alice:
            seen["reason"] = await alice.call_tool("reason", {"query": "What is 17 * 23?", "strategy": "tree_of_thought"})
            seen["session"] = (await alice.call_tool("session_create", {})).structured_content
        async with McpClient(server("bob", "cot_only")) as bob:  # the same data directory: alice's records are there
            seen["bob_get"] = await bob.call_tool("session_get", {"session_id": seen["session"]["session_id"]})
            seen["bob_tot"] = await bob.call_tool("reason", {"query": "2+2?", "strategy": "tree_of_thought"})
            seen["bob_cot"] = await bob.call_tool("reason", {"query": "What is 2 + 2?"})
        async with McpClient(server("dave", "lister")) as dave:
            seen["dave_close"] = await dave.call_tool("session_close", {"session_id": seen["session"]["session_id"]})
        return seen

    seen = asyncio.run(exercise())
    assert not seen["reason"].is_error and seen["reason"].structured_content["answer"] == "391"
    theirs = error_of(seen["bob_get"])
    assert theirs["code"] == -32003 and theirs["message"].startswith("forbidden: no session")
    forbidden = error_of(seen["bob_tot"])
    assert forbidden["code"] == -32003 and forbidden["data"]["strategy"] == "tree_of_thought"
    assert not seen["bob_cot"].is_error and seen["bob_cot"].structured_content["answer"] == "4"
    assert error_of(seen["dave_close"])["data"]["method"] == "session.close"  # the role may not call it at all
    audited = [json.loads(line) for line in (tmp_path / "audit" / "audit.jsonl").read_text().splitlines()]
    assert {(r["principal"], r["method"], r["outcome"]) for r in audited} >= {
        ("alice", "reasoning.execute", "ok"),
        ("alice", "session.create", "ok"),
        ("bob", "session.get", "forbidden"),
        ("dave", "session.close", "forbidden"),
    }
