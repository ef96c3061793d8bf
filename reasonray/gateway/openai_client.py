"""The LLM protocol over any OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, OpenRouter, the simulator).

The official `openai.AsyncOpenAI` client does the HTTP; its own retries are off because
`gateway.resilience` owns retry policy. Provider errors are sorted here into transient (worth
another attempt) and rejected (not).
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
import weakref
from typing import Any
from urllib.parse import urlparse

import openai

from reasonray.gateway.errors import (
    LLMConfigError,
    ProviderRejectedError,
    RemoteRequestsForbidden,
    TransientProviderError,
)
from reasonray.gateway.protocol import (
    PURPOSE_HEADER,
    Choice,
    Completion,
    LLMRequest,
    Message,
    ToolCall,
    Usage,
)

# The test suite sets this to False so that no test can reach a real provider by accident.
ALLOW_REMOTE_REQUESTS = True

TRANSIENT_STATUS = frozenset({408, 409, 425, 429})


def is_loopback_url(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _message_param(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.name:
        out["name"] = m.name
    return out


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class OpenAILLM:
    """Chat completions through the official openai client."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_tokens_param: str = "max_tokens",
        http_backend: str = "httpx",
    ) -> None:
        if not model:
            raise LLMConfigError("[llm] model is empty: name the model the endpoint serves")
        self._model = model
        self._options: dict[str, Any] = {"base_url": base_url or None, "api_key": api_key or "not-needed", "timeout": timeout_s}
        self._http_backend = http_backend
        # one client per event loop: a connection pool belongs to the loop that opened it (tests, notebooks and
        # evaluation workers may drive one LLM from several loops)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = weakref.WeakKeyDictionary()
        self.base_url = str(self._new_client().base_url)
        self._max_tokens_param = max_tokens_param

    @property
    def model(self) -> str:
        return self._model

    def _new_client(self) -> openai.AsyncOpenAI:
        # aiohttp: the SDK's own DefaultAioHttpClient (openai[aiohttp]); measured here at about 2.0 ms of CPU per call at
        # 64 concurrent against 3.4 ms for httpx, which matters where one process multiplexes hundreds of calls
        timeout = self._options["timeout"]
        http_client = openai.DefaultAioHttpClient(timeout=timeout) if self._http_backend == "aiohttp" else None
        return openai.AsyncOpenAI(**self._options, max_retries=0, http_client=http_client)

    @property
    def _client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = self._new_client()
        return client

    def _check_allowed(self) -> None:
        if not ALLOW_REMOTE_REQUESTS and not is_loopback_url(self.base_url):
            raise RemoteRequestsForbidden(f"requests to {self.base_url} are switched off (tests allow loopback only)")

    async def ping(self) -> None:
        """Raise unless the endpoint answers `GET /models`."""
        self._check_allowed()
        await self._client.models.list()

    async def close(self) -> None:
        await self._client.close()

    def _params(self, request: LLMRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self._model,
            "messages": [_message_param(m) for m in request.messages],
            "temperature": request.temperature,
        }
        if request.max_tokens is not None:
            params[self._max_tokens_param] = request.max_tokens
        if request.stop:
            params["stop"] = list(request.stop)
        if request.n != 1:
            params["n"] = request.n
        if request.seed is not None:
            params["seed"] = request.seed
        if request.tools:
            params["tools"] = list(request.tools)
        if request.tool_choice is not None:
            params["tool_choice"] = request.tool_choice
        if request.response_format is not None:
            params["response_format"] = request.response_format
        for name in ("top_p", "presence_penalty", "frequency_penalty"):
            if (value := getattr(request, name)) is not None:
                params[name] = value
        if request.purpose:  # a header, not a body field: strict endpoints reject unknown body fields
            params["extra_headers"] = {PURPOSE_HEADER: request.purpose}
        return params

    async def complete(self, request: LLMRequest) -> Completion:
        self._check_allowed()
        started = time.perf_counter()
        try:
            response = await self._client.chat.completions.create(**self._params(request))
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            raise TransientProviderError(f"{type(exc).__name__}: {exc} ({self.base_url})") from exc
        except openai.APIStatusError as exc:
            status = exc.status_code
            detail = f"HTTP {status} from {self.base_url}: {exc.message}"
            if status in TRANSIENT_STATUS or status >= 500:
                raise TransientProviderError(detail, status_code=status, retry_after_s=_retry_after(exc)) from exc
            raise ProviderRejectedError(detail, status_code=status) from exc
        latency_ms = (time.perf_counter() - started) * 1000
        return _completion(response, latency_ms)


def _completion(response: Any, latency_ms: float) -> Completion:
    choices = []
    for c in response.choices:
        calls = tuple(ToolCall(id=t.id, name=t.function.name, arguments=t.function.arguments or "{}") for t in (c.message.tool_calls or []))
        extra = c.model_extra or {}  # vLLM and the simulator say which stop sequence matched
        stop_sequence = extra.get("stop_reason") if isinstance(extra.get("stop_reason"), str) else None
        choices.append(
            Choice(
                text=c.message.content or "",
                finish_reason=c.finish_reason or "stop",
                tool_calls=calls,
                stop_sequence=stop_sequence,
            )
        )
    usage = response.usage
    return Completion(
        choices=tuple(choices),
        usage=Usage(usage.prompt_tokens, usage.completion_tokens) if usage else Usage(),
        model=response.model,
        latency_ms=latency_ms,
        simulated=response.model.startswith("simulated"),
    )
