"""The LLM stack a deployment builds from its settings (reasonray.gateway.factory): which client, and
retries, breaker, cache and metrics in the order the settings ask for, over HTTP to the simulated model."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from reasonray.gateway.cache import LRUTTLCache
from reasonray.gateway.errors import LLMConfigError, ProviderRejectedError, ProviderUnavailableError
from reasonray.gateway.factory import build_llm, client_for
from reasonray.gateway.openai_client import OpenAILLM
from reasonray.gateway.protocol import LLMRequest, user
from reasonray.gateway.simulator.engine import MODEL_NAME
from reasonray.gateway.simulator.server import SimulatorServer, SimulatorSettings
from reasonray.kernel.config import Settings
from tests.unit.recording_metrics import RecordingMetrics


@pytest.fixture
def server():
    """A simulator per test: each has its own URL, so each stack gets a breaker of its own."""
    srv = SimulatorServer(SimulatorSettings(port=0)).start()
    yield srv
    srv.stop()


def requests_served(server) -> int:
    return httpx.get(f"{server.url.rstrip('/')}/sim/stats").json()["requests"]


def settings(server, **llm) -> Settings:
    retry = {"max_attempts": 3, "initial_backoff_s": 0.0, "max_backoff_s": 0.0, "jitter_s": 0.0, **llm.pop("retry", {})}
    return Settings.model_validate(
        {"llm": {"provider": "simulated", "base_url": server.url, "retry": retry, "cache": {"enabled": True}, **llm}}
    )


OPENED: list[OpenAILLM] = []


@pytest.fixture(autouse=True)
async def close_clients():
    yield
    while OPENED:
        await OPENED.pop().close()


def client(chosen: Settings, environ: dict[str, str] | None = None) -> OpenAILLM:
    made = client_for(chosen, environ={} if environ is None else environ)
    OPENED.append(made)
    return made


ASK = LLMRequest(messages=(user("What is 17 * 23?"),), temperature=0.0)


# -- which client -------------------------------------------------------------------------------------


def test_a_simulated_provider_without_a_url_fails_at_start_naming_how_to_start_one():
    with pytest.raises(LLMConfigError) as raised:
        client_for(Settings.model_validate({"llm": {"provider": "simulated"}}), environ={})
    assert "reasonray sim" in str(raised.value) and "REASONRAY_LLM__BASE_URL" in str(raised.value)


def test_a_simulated_provider_talks_to_the_simulated_model_at_its_url(server):
    made = client(settings(server))
    assert made.model == MODEL_NAME and made.base_url.rstrip("/") == server.url.rstrip("/")


def test_a_real_provider_without_its_key_fails_at_start_naming_the_variable():
    chosen = Settings.model_validate({"llm": {"provider": "openai", "api_key_env": "MY_ENDPOINT_KEY"}})
    with pytest.raises(LLMConfigError) as raised:
        client_for(chosen, environ={"OPENAI_API_KEY": "not this one"})
    assert "MY_ENDPOINT_KEY" in str(raised.value) and "api_key_required" in str(raised.value)


def test_a_keyless_local_server_needs_no_key_and_gets_the_configured_model_and_url(server):
    chosen = Settings.model_validate(
        {"llm": {"provider": "openai", "base_url": server.url, "model": "my-local-model", "api_key_required": False}}
    )
    made = client(chosen)
    assert made.model == "my-local-model" and made.base_url.rstrip("/") == server.url.rstrip("/")


async def test_the_key_from_the_named_variable_is_sent_as_the_bearer_token():
    seen: list[str | None] = []
    probes: list[str | None] = []  # discovery's (tokenize endpoints this server does not have) carry the key too

    class Endpoint(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            (seen if self.path == "/v1/chat/completions" else probes).append(self.headers.get("Authorization"))
            self.send_response(400)  # rejected: not retried, and the test has what it came for
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "seen"}}')

        def log_message(self, *args: object) -> None:
            pass

    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{endpoint.server_address[1]}/v1"
        chosen = Settings.model_validate({"llm": {"provider": "openai", "api_key_env": "MY_ENDPOINT_KEY", "base_url": url}})
        with pytest.raises(ProviderRejectedError):
            await client(chosen, {"MY_ENDPOINT_KEY": "sk-local-123"}).complete(ASK)
    finally:
        endpoint.shutdown()
    assert seen == ["Bearer sk-local-123"]
    assert probes and set(probes) == {"Bearer sk-local-123"}


# -- retries, cache, metrics --------------------------------------------------------------------------


async def test_transient_faults_are_retried_up_to_the_configured_attempts(server):
    llm, resilient = build_llm(settings(server, cache={"enabled": False}), client(settings(server)), None)
    request = LLMRequest(messages=(user("[[sim fault=500 times=2]] What is 17 * 23?"),), temperature=0.0)
    completion = await llm.complete(request)
    assert "391" in completion.text and completion.attempts == 3
    assert requests_served(server) == 3
    assert resilient.retry.max_attempts == 3


async def test_past_the_configured_attempts_the_call_fails_as_provider_unavailable(server):
    chosen = settings(server, retry={"max_attempts": 2}, cache={"enabled": False})
    llm, _ = build_llm(chosen, client(chosen), None)
    with pytest.raises(ProviderUnavailableError) as raised:
        await llm.complete(LLMRequest(messages=(user("[[sim fault=500 times=5]] What is 17 * 23?"),), temperature=0.0))
    assert raised.value.attempts == 2 and requests_served(server) == 2


async def test_with_the_cache_on_a_repeated_call_is_served_without_reaching_the_model(server):
    chosen = settings(server)
    llm, _ = build_llm(chosen, client(chosen), LRUTTLCache())
    first, second = await llm.complete(ASK), await llm.complete(ASK)
    assert second.text == first.text and second.cached and not first.cached
    assert requests_served(server) == 1


async def test_with_the_cache_off_a_store_given_is_not_used(server):
    chosen = settings(server, cache={"enabled": False})
    store = LRUTTLCache()
    llm, _ = build_llm(chosen, client(chosen), store)
    await llm.complete(ASK)
    await llm.complete(ASK)
    assert requests_served(server) == 2


async def test_metrics_count_calls_hits_and_misses_and_report_the_breaker_of_the_endpoint(server):
    chosen = settings(server)
    metrics = RecordingMetrics()
    llm, _ = build_llm(chosen, client(chosen), LRUTTLCache(), metrics)
    await llm.complete(ASK)
    await llm.complete(ASK)
    assert metrics.total("reasonray_llm_calls", outcome="ok") == 1 and metrics.total("reasonray_llm_calls", outcome="cached") == 1
    assert metrics.total("reasonray_llm_cache_misses") == 1 and metrics.total("reasonray_llm_cache_hits") == 1
    [(_, _, tags), *_] = [r for r in metrics.records if r[0] == "reasonray_llm_breaker_state"]
    assert tags["endpoint"].rstrip("/") == server.url.rstrip("/")


async def test_the_breaker_opens_after_the_configured_faults_and_then_fails_fast(server):
    chosen = settings(
        server,
        retry={"max_attempts": 1},
        cache={"enabled": False},
        circuit_breaker={"minimum_calls": 2, "failure_rate_threshold": 0.5, "reset_timeout_s": 60},
    )
    llm, resilient = build_llm(chosen, client(chosen), None)
    for _ in range(2):
        with pytest.raises(ProviderUnavailableError):
            await llm.complete(LLMRequest(messages=(user("[[sim fault=500 times=2]] What is 1 + 1?"),), temperature=0.0))
    assert resilient.breaker.state == "open"
    served = requests_served(server)
    with pytest.raises(ProviderUnavailableError):
        await llm.complete(ASK)
    assert requests_served(server) == served  # refused by the breaker, not sent
    # another stack for the same endpoint in this process shares that breaker
    _, again = build_llm(chosen, client(chosen), None)
    assert again.breaker is resilient.breaker
