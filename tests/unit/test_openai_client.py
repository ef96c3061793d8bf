"""The OpenAI implementation of the LLM protocol, over HTTP against the simulated model."""

import pytest

import reasonray.gateway.openai_client as oc
from reasonray.gateway.errors import (
    ProviderRejectedError,
    RemoteRequestsForbidden,
    TransientProviderError,
)
from reasonray.gateway.protocol import LLMRequest, Message, ToolCall, user
from reasonray.gateway.simulator.server import (
    SimulatorServer,
    SimulatorSettings,
    free_port,
)
from tests.unit.fixed_endpoint import fixed_endpoint


@pytest.fixture(scope="module")
def server():
    srv = SimulatorServer(SimulatorSettings(port=0, hang_s=3)).start()
    yield srv
    srv.stop()


BACKEND = {"name": "httpx"}


@pytest.fixture(autouse=True, params=["aiohttp", "httpx"])
def http_backend(request):
    """Every test runs over both transports of the openai client ([llm] http_backend)."""
    BACKEND["name"] = request.param
    return request.param


def llm_for(server, **kw):
    return oc.OpenAILLM("gpt-4.1", base_url=server.url, api_key="x", http_backend=BACKEND["name"], **kw)


async def test_a_completion_carries_text_usage_and_the_simulated_label(server):
    completion = await llm_for(server).complete(LLMRequest(messages=(user("What is 17 * 23?"),), max_tokens=200))
    assert "<answer>391</answer>" in completion.text
    assert completion.simulated and completion.model == "simulated"
    assert completion.usage.prompt_tokens > 0 and completion.latency_ms > 0


async def test_stop_sequence_that_matched_is_reported(server):
    completion = await llm_for(server).complete(LLMRequest(messages=(user("What is 1+1?"),), stop=("<answer>",)))
    assert completion.choices[0].stop_sequence == "<answer>"


async def test_tool_call_history_round_trips(server):
    history = (
        user("[[sim script=tc]]"),
        Message(role="assistant", tool_calls=(ToolCall(id="c1", name="calc", arguments="{}"),)),
        Message(role="tool", content="4", tool_call_id="c1"),
    )
    server.app.state.model.add_script("tc", [{"content": "done"}])
    assert (await llm_for(server).complete(LLMRequest(messages=history))).text == "done"


@pytest.mark.parametrize("kind,status", [("500", 500), ("429", 429)])
async def test_server_errors_and_rate_limits_are_transient(server, kind, status):
    with pytest.raises(TransientProviderError) as err:
        await llm_for(server).complete(LLMRequest(messages=(user(f"[[sim fault={kind}]] {kind} {BACKEND['name']}"),)))
    assert err.value.status_code == status
    if kind == "429":
        assert err.value.retry_after_s == 0.0


async def test_timeouts_and_refused_connections_are_transient(server):
    with pytest.raises(TransientProviderError, match="Timeout"):
        await llm_for(server, timeout_s=0.5).complete(LLMRequest(messages=(user(f"[[sim fault=timeout]] t {BACKEND['name']}"),)))
    dead = oc.OpenAILLM("m", base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="x", http_backend=BACKEND["name"])
    # httpx reports a refused connection as a connection error, openai's aiohttp transport as a connect timeout:
    # either way it is transient (retried, counted by the breaker) and names the endpoint
    with pytest.raises(TransientProviderError, match=r"Connection|Timeout") as refused:
        await dead.complete(LLMRequest(messages=(user("q"),)))
    assert dead.base_url in str(refused.value)


async def test_a_bad_request_is_rejected_not_retried(server):
    with pytest.raises(ProviderRejectedError) as err:
        await llm_for(server).complete(LLMRequest(messages=(user("[[sim think=abc]]"),)))
    assert err.value.status_code == 400 and "think takes a whole number" in str(err.value)


async def test_tests_cannot_reach_remote_endpoints():
    llm = oc.OpenAILLM("gpt-4.1", base_url="https://api.openai.com/v1", api_key="sk-test")
    with pytest.raises(RemoteRequestsForbidden):
        await llm.complete(LLMRequest(messages=(user("q"),)))
    with pytest.raises(RemoteRequestsForbidden):
        await llm.ping()


@pytest.mark.parametrize(
    "url,loopback",
    [
        ("http://127.0.0.1:1/v1", True),
        ("http://localhost/v1", True),
        ("http://[::1]:8/v1", True),
        ("https://api.openai.com/v1", False),
        ("http://10.0.0.1/v1", False),
    ],
)
def test_loopback_detection(url, loopback):
    assert oc.is_loopback_url(url) is loopback


@pytest.fixture
def fixed_answer():
    """An endpoint that answers every POST with 200 and the body the test sets (a proxy's page, a sparse server)."""
    with fixed_endpoint() as (answer, url):
        yield answer, url


async def test_a_200_that_is_not_a_chat_completion_is_rejected_naming_the_endpoint(fixed_answer):
    answer, url = fixed_answer
    llm = oc.OpenAILLM("m", base_url=url, api_key="x", http_backend=BACKEND["name"], discover=False)
    for body in (b"<html>login</html>", b'{"choices": "none"}'):
        answer["raw"] = body
        with pytest.raises(ProviderRejectedError, match="is not a chat completion") as err:
            await llm.complete(LLMRequest(messages=(user("q"),)))
        assert url in str(err.value) and err.value.status_code == 200


async def test_a_sparse_chat_completion_keeps_what_it_has(fixed_answer):
    """Servers leave members out (usage, finish_reason) and add their own (vLLM's stop_reason, a token id when no
    stop string matched): the completion keeps the text and defaults the rest."""
    answer, url = fixed_answer
    llm = oc.OpenAILLM("m", base_url=url, api_key="x", http_backend=BACKEND["name"], discover=False)
    answer["raw"] = (
        b'{"id": "x", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "stop_reason": 2}]}'
    )
    completion = await llm.complete(LLMRequest(messages=(user("q"),)))
    assert completion.text == "42" and completion.choices[0].finish_reason == "stop" and completion.choices[0].stop_sequence is None
    assert completion.usage.prompt_tokens == 0 and completion.model == "m"
