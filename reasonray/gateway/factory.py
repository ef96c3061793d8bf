"""Builds the LLM stack a deployment uses: OpenAI-compatible client, retries and breaker, response cache."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from reasonray.gateway.cache import CacheStore, CachingLLM, SharedCacheStore
from reasonray.gateway.errors import LLMConfigError
from reasonray.gateway.metered import MeteredLLM
from reasonray.gateway.openai_client import OpenAILLM
from reasonray.gateway.protocol import LLM
from reasonray.gateway.resilience import ResilientLLM, RetryPolicy, breaker_for
from reasonray.gateway.simulator.engine import MODEL_NAME
from reasonray.kernel.config import Settings
from reasonray.kernel.telemetry import Metrics


def client_for(settings: Settings, environ: Mapping[str, str] | None = None) -> OpenAILLM:
    """The raw client for the configured provider; a real provider without its key fails here, at start-up."""
    env, llm = os.environ if environ is None else environ, settings.llm
    simulated = settings.resolved_provider(env) == "simulated"
    options = {
        "timeout_s": llm.request_timeout_s,
        # the simulated model's plain answers say which stop sequence matched; real servers need the stream to stop
        "stream": llm.stream if llm.stream is not None else not simulated,
        **{name: getattr(llm, name) for name in ENDPOINT_OPTIONS},
    }
    if simulated:
        if not llm.base_url:
            raise LLMConfigError(
                "[llm] provider is simulated but no base_url names a running simulated model: "
                "start one with `reasonray sim --port 8001` and set REASONRAY_LLM__BASE_URL=http://127.0.0.1:8001/v1, "
                "or run `reasonray serve --llm simulated`, which starts it for you"
            )
        return OpenAILLM(MODEL_NAME, base_url=llm.base_url, api_key="simulated", **options)
    key = env.get(llm.api_key_env, "")
    if not key and llm.api_key_required:
        raise LLMConfigError(
            f"[llm] provider is openai but the environment variable {llm.api_key_env} is not set: "
            f"export {llm.api_key_env}=<your key>, or set [llm] api_key_required = false for a keyless local server"
        )
    return OpenAILLM(llm.model, base_url=llm.base_url, api_key=key or None, max_tokens_param=llm.max_tokens_param, **options)


ENDPOINT_OPTIONS = (
    *("http_backend", "queue_timeout_s", "context_length", "max_concurrency", "adaptive_concurrency_limit", "structured_output"),
    *("tool_choice", "tokenizer", "token_margin", "discover", "discovery_ttl_s", "default_max_tokens", "idle_timeout_s"),
    *("generation_deadline_s", "thinks", "thinks_in_text", "refuses", "takes_reasoning_effort", "prefix_continuation"),
    *("thinking_room", "reasoning_effort", "thinking_budget", "extra_body", "chat_template"),
)
"""The `[llm]` keys the client takes as they are, under the same names: what it says of the endpoint's capacity and tokens."""


_shared_caches: dict[tuple[Path, int, float], SharedCacheStore] = {}
_shared_caches_lock = threading.Lock()


def shared_cache(settings: Settings, app_name: str) -> SharedCacheStore | None:
    """The response cache an application's processes on this machine share (`<data_dir>/cache/<app>.sqlite3`),
    one per process, or None when `[llm.cache]` is off."""
    cache = settings.llm.cache
    if not cache.enabled:
        return None
    key = (Path(settings.data_dir).resolve() / "cache" / f"{app_name}.sqlite3", cache.max_entries, cache.ttl_s)
    with _shared_caches_lock:
        if key not in _shared_caches:
            _shared_caches[key] = SharedCacheStore(key[0], max_entries=cache.max_entries, ttl_s=cache.ttl_s)
        return _shared_caches[key]


def build_llm(
    settings: Settings, client: OpenAILLM, cache_store: CacheStore | None, metrics: Metrics | None = None
) -> tuple[LLM, ResilientLLM]:
    """The stack strategies see (metered, then cache outside retries), and its resilient layer for health reports."""
    r, b = settings.llm.retry, settings.llm.circuit_breaker
    resilient = ResilientLLM(
        client,
        RetryPolicy(r.max_attempts, r.initial_backoff_s, r.max_backoff_s, r.jitter_s, r.deadline_s),
        breaker_for(client.base_url or client.model, **b.model_dump()),  # one per endpoint in this process
        endpoint=client.base_url,
    )
    llm: LLM = resilient
    caching = cache_store is not None and settings.llm.cache.enabled
    if cache_store is not None and caching:
        llm = CachingLLM(resilient, cache_store)
    if metrics is not None:
        llm = MeteredLLM(llm, metrics, caching=caching, breaker=resilient.breaker, endpoint=client.base_url or "openai")
    return llm, resilient
