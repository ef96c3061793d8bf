"""The LLM protocol over any OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, OpenRouter, the simulator).

The official `openai.AsyncOpenAI` client does the HTTP; its own retries are off because
`gateway.resilience` owns retry policy. Provider errors are sorted here into transient (worth
another attempt) and rejected (not).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Awaitable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import msgspec
import openai
import structlog
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from reasonray.gateway import thinking
from reasonray.gateway.capabilities import Capabilities
from reasonray.gateway.chat_template import ChatTemplate
from reasonray.gateway.concurrency import Ticket, limiter_for
from reasonray.gateway.discovery import CALIBRATION_TEXT, EndpointInfo, context_length_in, discover_sync
from reasonray.gateway.errors import (
    LLMConfigError,
    ProviderRejectedError,
    ProviderUnavailableError,
    RemoteRequestsForbidden,
    TransientProviderError,
)
from reasonray.gateway.families import PrefixContinuation, traits_for
from reasonray.gateway.model_tokens import GGUFVocab, ModelTokenCounter, ServerTokenizer, TokenSource, local_source
from reasonray.gateway.protocol import PURPOSE_HEADER, Completion, LLMRequest, Message
from reasonray.gateway.refusals import REFUSABLE, ParameterRefused, RefusalBook, refusal_book, refused_param
from reasonray.gateway.replies import WIRE, ReplyReader, StreamParts, WireCompletion, WireMessage, provider_error
from reasonray.gateway.tokens import TokenCounter, count_messages, counter_for_model, openai_message
from reasonray.kernel.config import is_loopback_host

log = structlog.get_logger(__name__)

# The test suite sets this to False so that no test can reach a real provider by accident.
ALLOW_REMOTE_REQUESTS = True

TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
# the purpose header of the gateway's own calls that learn a chat template's framing (no run's, and no run counts them)
FRAMING_PROBE = "framing_probe"


def is_loopback_url(url: str) -> bool:
    return is_loopback_host(urlparse(url).hostname or "")


class OpenAILLM:
    """Chat completions through the official openai client, within what the endpoint can take.

    Each call waits for a slot of the endpoint's `EndpointLimiter`, so a server that runs one request at a time
    gets one at a time; `timeout_s` counts from when the server starts on the call (its first streamed token),
    `queue_timeout_s` bounds the wait before that. Streamed calls (`stream=True`) close their stream when they
    are cancelled or time out, which makes llama.cpp and vLLM stop generating. `max_tokens` defaults by purpose
    and never exceeds what the context window leaves after the prompt, counted in the model's tokens (`tokens`).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_tokens_param: str | None = None,
        http_backend: str = "httpx",
        stream: bool = False,
        queue_timeout_s: float = 600.0,
        context_length: int | None = None,
        max_concurrency: int | None = None,
        adaptive_concurrency_limit: int = 256,
        structured_output: bool | None = None,
        tool_choice: bool | None = None,
        tokenizer: str = "auto",
        token_margin: float = 0.1,
        discover: bool = True,
        discovery_ttl_s: float = 60.0,
        default_max_tokens: Mapping[str, int] | None = None,
        idle_timeout_s: float | None = None,
        generation_deadline_s: float = 1800.0,
        thinks: bool | None = None,
        thinks_in_text: bool | None = None,
        refuses: Iterable[str] = (),
        takes_reasoning_effort: bool | None = None,
        prefix_continuation: PrefixContinuation | None = None,
        thinking_room: int | None = None,
        reasoning_effort: str | None = None,
        thinking_budget: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        refusals: RefusalBook | None = None,
        chat_template: str | None = None,
    ) -> None:
        if not model:
            raise LLMConfigError("[llm] model is empty: name the model the endpoint serves")
        self.model = model
        self._queue_timeout_s = queue_timeout_s
        self._stream = stream
        self._idle_timeout_s, self._generation_deadline_s = idle_timeout_s or timeout_s, generation_deadline_s
        self._open_transport(base_url, api_key, http_backend, timeout_s)
        # the model family's traits, each overridden where the configuration states it (refusals added to its own)
        family, stated = traits_for(model), {"max_tokens_param": max_tokens_param, "thinks": thinks, "thinking_room": thinking_room}
        stated |= {"takes_reasoning_effort": takes_reasoning_effort, "prefix_continuation": prefix_continuation}
        stated = {name: value for name, value in stated.items() if value is not None}
        self.traits = msgspec.structs.replace(family, refuses=family.refuses | frozenset(refuses), **stated)
        if self.traits.prefix_continuation == "completions" and not chat_template:
            raise LLMConfigError(
                '[llm] prefix_continuation = "completions" needs [llm] chat_template: the model\'s tokenizer_config.json or Jinja file'
            )
        self._template = ChatTemplate(chat_template) if chat_template else None  # the prompt of completions continuations
        self._reasoning_effort, self._thinking_budget = reasoning_effort, thinking_budget
        self._extra_body = dict(extra_body or {})
        self._refusals = refusals
        # what the configuration states; unset (None): discovered, or learnt from the server's answers
        self._structured_output, self._tool_choice = structured_output, tool_choice
        self._context_length, self._max_concurrency = context_length, max_concurrency
        self._default_max_tokens = dict(default_max_tokens or {})
        self.limiter = limiter_for(self.base_url, ceiling=adaptive_concurrency_limit)
        if max_concurrency is not None:
            self.limiter.configure(max_concurrency)
        self._tokenizer = tokenizer
        self._discover = discover and base_url is not None  # OpenAI's own API has none of the probed endpoints
        self._sync_discovery = threading.Lock()
        self.tokens: TokenCounter = self._initial_counter(tokenizer, token_margin)
        self._discovery_ttl_s = discovery_ttl_s
        self._discovered_at: float | None = None
        self._discovering: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
        self.endpoint: EndpointInfo = EndpointInfo(flavour="openai" if base_url is None else "unknown")
        self._learned_context: int | None = None
        self._framing_learned_for: str | None = None
        # reads every reply form into one Choice; `thinks_in_text` for a model that thinks in its text under a name not known
        self.replies = ReplyReader(model, thinks=thinks_in_text)

    def _open_transport(self, base_url: str | None, api_key: str | None, http_backend: str, timeout_s: float) -> None:
        """The client options and the first client (which settles `base_url`)."""
        self._api_key, self._http_backend = api_key, http_backend
        # a streamed call's deadlines are ours: the queue's, then the generation's (it fails when its tokens stop coming,
        # not while they come, up to a generous overall deadline); the transport's only catches a dead socket
        transport_timeout = self._idle_timeout_s + self._queue_timeout_s if self._stream else timeout_s
        self._options: dict[str, Any] = {"base_url": base_url or None, "api_key": api_key or "not-needed", "timeout": transport_timeout}
        # one client per event loop: a connection pool belongs to the loop that opened it (tests, notebooks and
        # evaluation workers may drive one LLM from several loops)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = weakref.WeakKeyDictionary()
        self.base_url = str(self._new_client().base_url)

    def _initial_counter(self, tokenizer: str, margin: float) -> TokenCounter:
        base = counter_for_model(self.model)
        if tokenizer == "tiktoken":
            return base
        try:
            source = None if tokenizer in ("auto", "server", "calibrated") else local_source(tokenizer)
        except (OSError, ValueError, RuntimeError) as exc:  # a missing file, another format, llama-cpp-python absent
            raise LLMConfigError(str(exc)) from exc
        return ModelTokenCounter(base, margin=margin, source=source, on_first_use=self.discover_now if self._discover else None)

    @property
    def capabilities(self) -> Capabilities:
        """What this endpoint can do: configuration first, then what discovery and the server's answers showed."""
        info = self.endpoint
        enforcing = info.flavour in ("openai", "vllm")
        return Capabilities(
            structured_output=enforcing if self._structured_output is None else self._structured_output,
            tool_choice=enforcing if self._tool_choice is None else self._tool_choice,
            tokenize=isinstance(self.tokens, ModelTokenCounter) and self.tokens.exact,
            context_length=self.context_length,
            max_concurrency=self._max_concurrency or info.max_concurrency or self.limiter.learned,
        )

    @property
    def context_length(self) -> int | None:
        return self._context_length or self.endpoint.context_length or self._learned_context

    @property
    def backend(self) -> str:
        """What answers: the endpoint, the model name and the server's fingerprint of the model behind it."""
        return f"{self.base_url}|{self.model}|{self.endpoint.fingerprint}"

    def _new_client(self) -> openai.AsyncOpenAI:
        # aiohttp: the SDK's own DefaultAioHttpClient (openai[aiohttp]); measured here at about 2.0 ms of CPU per call at
        # 64 concurrent against 3.4 ms for httpx, which matters where one process multiplexes hundreds of calls
        http_client = openai.DefaultAioHttpClient(timeout=self._options["timeout"]) if self._http_backend == "aiohttp" else None
        return openai.AsyncOpenAI(**self._options, max_retries=0, http_client=http_client)

    @property
    def _client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        if (client := self._clients.get(loop)) is None:
            client = self._clients[loop] = self._new_client()
        return client

    def _check_allowed(self) -> None:
        if not ALLOW_REMOTE_REQUESTS and not is_loopback_url(self.base_url):
            raise RemoteRequestsForbidden(f"requests to {self.base_url} are switched off (tests allow loopback only)")

    async def _chat(self, params: dict[str, Any]) -> WireCompletion:
        """POST /chat/completions through the SDK's generic `post`: the request `chat.completions.create` sends (same
        auth, headers, timeouts and error classes), without its walk over every message to transform typed params (ours
        are plain JSON already) and with the answer decoded by msgspec into only what a Completion keeps. Together they
        were a seventh of the replica's CPU with 64 runs in flight. Params with a `prompt` go to /completions instead."""
        path = "/completions" if "prompt" in params else "/chat/completions"
        with self.limiter.sending():
            response: httpx.Response = await self._post(path, params, cast_to=httpx.Response)
        try:
            reply = WIRE.decode(response.content)
        except msgspec.DecodeError as exc:
            raise ProviderRejectedError(
                f"HTTP {response.status_code} from {self.base_url} is not a chat completion: {exc} (is [llm] base_url the API root, "
                "e.g. http://host:8000/v1?)",
                status_code=response.status_code,
            ) from None
        # a raw completion carries on the prompt's open thinking: R1 text (thinking up to `</think>`, then the answer; no tag: unfinished)
        if path == "/completions":
            for c in reply.choices or ():
                c.message = WireMessage(content=thinking.OPEN + (c.text or ""))
        return reply

    async def _post(self, path: str, params: dict[str, Any], **how: Any) -> Any:
        """POST a call's params: their `extra_headers` (the purpose) as the SDK's request headers, the rest as the body."""
        body = dict(params)
        headers = body.pop("extra_headers", None)
        return await self._client.post(path, body=body, options={"headers": headers} if headers else {}, **how)

    async def ping(self) -> None:
        """Raise unless the endpoint answers `GET /models`."""
        self._check_allowed()
        await self._client.models.list()

    async def close(self) -> None:
        await self._client.close()

    async def discover(self, *, force: bool = False) -> Capabilities:
        """Ask the endpoint what it is (once per `discovery_ttl_s`; concurrent callers share one probe)."""
        fresh = self._discovered_at is not None and time.monotonic() - self._discovered_at < self._discovery_ttl_s
        if not self._discover or (fresh and not force):
            return self.capabilities
        self._check_allowed()
        seen = self._discovered_at
        async with self._discovering.setdefault(asyncio.get_running_loop(), asyncio.Lock()):
            if self._discovered_at == seen:  # no probe ended while this caller waited for the one running
                self._apply(await asyncio.to_thread(discover_sync, self.base_url, self.model, api_key=self._api_key))
        return self.capabilities

    def discover_now(self) -> None:
        """Discovery, synchronously, once: for a count needed before the first call (a strategy sizing its first
        prompt to a chunk), which must already be in the model's tokens. It blocks for the few probe requests."""
        with self._sync_discovery:
            if self._discover and self._discovered_at is None and (ALLOW_REMOTE_REQUESTS or is_loopback_url(self.base_url)):
                self._apply(discover_sync(self.base_url, self.model, api_key=self._api_key))

    def _apply(self, info: EndpointInfo) -> None:
        changed = info.fingerprint != self.endpoint.fingerprint
        self.endpoint, self._discovered_at = info, time.monotonic()
        if changed:
            self._learned_context = None
        if self._max_concurrency is None:
            self.limiter.configure(info.max_concurrency)
        counter = self.tokens
        if not isinstance(counter, ModelTokenCounter) or self._tokenizer not in ("auto", "server", "calibrated"):
            return
        if info.calibration_tokens:
            counter.observe_ratio(counter.base.count(CALIBRATION_TEXT), info.calibration_tokens)
        if info.flavour in ("simulator", "openai"):
            counter.unseen_framing = 0  # they count a prompt as count_messages does
        if changed and self._tokenizer != "calibrated":
            counter.use(self._source_for(info))

    def _source_for(self, info: EndpointInfo) -> TokenSource | None:
        if self._tokenizer == "auto" and info.model_path and info.model_path.endswith(".gguf") and Path(info.model_path).is_file():
            try:  # the server's own model file, on this machine: count in process, no HTTP
                return GGUFVocab(info.model_path)
            except Exception as exc:  # llama-cpp-python missing or the file unreadable: the server can still count
                log.info("tokens.gguf_unavailable", path=info.model_path, reason=str(exc)[:200])
        if info.tokenize_url is None or info.tokenize_style is None:
            return None
        serial = info.flavour == "llama-cpp-python"  # tokenize waits for its model lock and interrupts a running stream
        limiter = self.limiter
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else None
        return ServerTokenizer(info, self.model, headers=headers, busy=(lambda: limiter.on_the_wire > 0) if serial else (lambda: False))

    @property
    def refusals(self) -> RefusalBook:
        """Where this client learns and remembers what its model refuses (the process's book unless given one)."""
        return self._refusals if self._refusals is not None else refusal_book()

    def refused(self) -> frozenset[str]:
        """The parameters left out of this model's calls: its family's, configured, and learnt from its refusals."""
        return self.traits.refuses | self.refusals.refused(self.base_url, self.model)

    def _visible_cap(self, request: LLMRequest) -> int | None:
        """The call's own `max_tokens`, else its purpose's default."""
        defaults = self._default_max_tokens
        return request.max_tokens or defaults.get(request.purpose or "default", defaults.get("default"))

    def _max_tokens(self, request: LLMRequest, limit: int | None = None) -> int | None:
        """The call's `max_tokens`: `limit`, else its own, else its purpose's default, plus room for a thinking model's
        thinking on the visible cap of a call of ours (a purpose) or one that set none; never more than the context leaves."""
        wanted = self._visible_cap(request) if limit is None else limit
        if limit is None and wanted is not None and self.traits.thinks and (request.purpose or request.max_tokens is None):
            budgets = (request.thinking_budget, self._thinking_budget, self.traits.thinking_room)
            wanted += next(b for b in budgets if b is not None)
        context = self.context_length
        if context is None:
            return wanted
        prompt = count_messages(self.tokens, request.messages, request.tools)
        room = context - prompt
        if room < 1:
            raise ProviderRejectedError(
                f"the prompt is {prompt} tokens by the model's count ({self.tokens.encoding_name}) and the model's context "
                f"is {context}: nothing is left to answer in; shorten the prompt (or set budget.max_prompt_tokens)",
                status_code=400,
            )
        return min(wanted, room) if wanted is not None else room

    def _params(
        self, request: LLMRequest, *, prefix: str | None = None, limit: int | None = None, effort: str | None = None
    ) -> dict[str, Any]:
        """The call's JSON body, without what the model refuses; `prefix` is text the reply continues as the model's own
        (the endpoint's prefix continuation), `limit` its output limit, `effort` the `reasoning_effort` sent."""
        refused = self.refused()
        messages = [openai_message(m) for m in request.messages]
        if "system" in refused:  # the system text goes to the head of the first user message (openai_message: content is text)
            system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
            messages = [m for m in messages if m["role"] != "system"]
            if (first := next((i for i, m in enumerate(messages) if m["role"] == "user"), None)) is None:
                messages.insert(0, {"role": "user", "content": system})
            else:
                messages[first] = {**messages[first], "content": f"{system}\n\n{messages[first]['content']}"}
        continuation = self.traits.prefix_continuation if prefix is not None else "none"
        if continuation in ("continue_final_message", "deepseek_prefix"):
            messages.append({"role": "assistant", "content": prefix, **({"prefix": True} if continuation == "deepseek_prefix" else {})})
        params: dict[str, Any] = {"model": self.model, "messages": messages}
        names = ("temperature", "seed", "tool_choice", "response_format", "top_p", "presence_penalty", "frequency_penalty")
        wanted = {name: getattr(request, name) for name in names} | {"stop": list(request.stop) or None, "reasoning_effort": effort}
        wanted |= {"n": request.n if request.n != 1 else None, "tools": list(request.tools) or None}
        wanted["max_completion_tokens" if "max_tokens" in refused else self.traits.max_tokens_param] = self._max_tokens(request, limit)
        if request.logprobs is not None and "logprobs" not in refused:  # top_logprobs is refused with logprobs
            wanted |= {"logprobs": True, "top_logprobs": request.logprobs or None}
        # sent where the request (or the client) sets them, unless the model refuses them
        params |= {name: value for name, value in wanted.items() if value is not None and name not in refused}
        params |= self._extra_body | (request.extra_body or {})
        if continuation == "continue_final_message":
            params.update(continue_final_message=True, add_generation_prompt=False)
        elif continuation == "completions" and self._template is not None and prefix is not None:
            # one raw prompt, the model's own template around the messages, continued from `prefix`; what the
            # completions endpoint takes of the chat body (no tools, and its logprobs are a count, not a switch)
            params["prompt"] = self._template.continuing(params.pop("messages"), prefix)
            for name in ("tools", "tool_choice", "logprobs", "top_logprobs"):
                params.pop(name, None)
        if request.purpose:  # a header, not a body field: strict endpoints reject unknown body fields
            params["extra_headers"] = {PURPOSE_HEADER: request.purpose}
        return params

    def _translate(self, exc: Exception, params: dict[str, Any] | None = None) -> Exception:
        if type(exc) is openai.APIError:  # an error event in a 200's stream: the provider's own words say what it is
            return provider_error(exc.body if exc.body is not None else exc.message, where=self.base_url)
        if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
            self._discovered_at = None  # the server went away or restarted: check what it serves before the next call
            return TransientProviderError(f"{type(exc).__name__}: {exc} ({self.base_url})")
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = f"HTTP {status} from {self.base_url}: {exc.message}"
            if status in TRANSIENT_STATUS or status >= 500:
                retry_after = None
                with contextlib.suppress(ValueError):  # absent, or an HTTP date rather than seconds
                    retry_after = float(exc.response.headers.get("retry-after", ""))
                return TransientProviderError(detail, status_code=status, retry_after_s=retry_after)
            if (context := context_length_in(str(exc.message))) is not None:
                self._learned_context = context  # the next calls are fitted to it
            elif status == 400 and params and (param := refused_param(str(exc.message), getattr(exc, "param", None), params)):
                return ParameterRefused(detail, param=param, status_code=status)
            return ProviderRejectedError(detail, status_code=status)
        return exc

    async def complete(self, request: LLMRequest) -> Completion:
        self._check_allowed()
        if self._discover:  # not otherwise: this runs on every call, and discover() would only build the capabilities
            await self.discover()
        chosen = thinking.plan(
            request, self.traits, refused=self.refused(), default_effort=self._reasoning_effort, default_budget=self._thinking_budget
        )
        if chosen.control in ("forced", "continued"):
            completion = await thinking.controlled(self._learning, request, chosen, visible_cap=self._visible_cap(request))
        else:
            limit = None
            if chosen.control == "unsupported" and chosen.budget is not None and not self.traits.thinks:
                limit = (self._max_tokens(request) or 0) + chosen.budget  # room at least, where nothing enforces it
            completion = await self._learning(request, None, limit, effort=chosen.effort)
            if chosen.control:
                completion = msgspec.structs.replace(completion, thinking_control=chosen.control)
        if request.stop and "stop" in self.refused():  # the reply cut at its first stop sequence, as the server would have
            choices = []
            for choice in completion.choices:
                if hits := [(i, s) for s in request.stop if s and (i := choice.text.find(s)) >= 0]:
                    at, seq = min(hits)
                    choice = msgspec.structs.replace(choice, text=choice.text[:at], finish_reason="stop", stop_sequence=seq)
                choices.append(choice)
            completion = msgspec.structs.replace(completion, choices=tuple(choices))
        return completion

    async def _learning(self, request: LLMRequest, prefix: str | None, limit: int | None, *, effort: str | None = None) -> Completion:
        """One call, sent again without each parameter the model refuses (remembered, so the next calls leave it out);
        and again fitted to the context length a refusal named."""
        for _ in range(len(REFUSABLE) + 1):
            context = self.context_length
            try:
                return await self._complete(request, prefix, limit, effort)
            except ParameterRefused as exc:
                self.refusals.record(self.base_url, self.model, exc.param)
            except ProviderRejectedError:
                if context is not None or self.context_length is None:
                    raise
                # the server's refusal named its context length: the same call, fitted to it, can be answered
                return await self._complete(request, prefix, limit, effort)
        return await self._complete(request, prefix, limit, effort)

    async def _complete(
        self, request: LLMRequest, prefix: str | None = None, limit: int | None = None, effort: str | None = None
    ) -> Completion:
        queued = time.perf_counter()
        try:
            async with asyncio.timeout(self._queue_timeout_s):
                ticket = await self.limiter.acquire()
        except TimeoutError:
            raise ProviderUnavailableError(
                f"no turn at {self.base_url} within queue_timeout_s={self._queue_timeout_s:g}: {self.limiter.in_flight} call(s) "
                f"running (limit {self.limiter.limit}) and {self.limiter.waiting} waiting; lower the load or raise [llm] queue_timeout_s",
                cause="queue_timeout",
            ) from None
        started = time.perf_counter()
        params: dict[str, Any] = {}
        try:
            if await self._learned_framing():
                started = time.perf_counter()
            # in the slot: a serial server's tokenize answers only between generations
            params = self._params(request, prefix=prefix, limit=limit, effort=effort)
            # plain: the server cut streams even when called serially; a raw completion (`prompt`) is never streamed
            if self._stream and not self.limiter.plain and "prompt" not in params:
                completion, reported = await self._streamed(params, request, ticket, self._queue_timeout_s - (started - queued))
            else:
                response = await self._chat(params)
                self.limiter.started(ticket)
                completion, reported = (
                    self.replies.completion(response, counter=self.tokens, where=self.base_url),
                    response.usage is not None,
                )
        except openai.OpenAIError as exc:
            raise self._translate(exc, params) from exc
        finally:
            self.limiter.release(ticket)
        completion = msgspec.structs.replace(completion, latency_ms=(time.perf_counter() - started) * 1000)
        if reported:
            self._learn_context(params.get("max_tokens", params.get("max_completion_tokens")), completion)
        if reported and not request.tools and prefix is None:  # a continuation's prompt holds its prefix too
            self._observe(request.messages, completion)
        return completion

    def _learn_context(self, max_tokens: int | None, completion: Completion) -> None:
        """A reply cut by length before its `max_tokens` ran out met the end of the model's context (llama-cpp-python
        caps generation there and advertises no context length): prompt and reply then fill it, and the next calls,
        and the strategies that fit their prompts to `capabilities.context_length`, are fitted to it."""
        if self.context_length is not None and self._learned_context is None:
            return  # configured or advertised: what the server says of itself wins
        if max_tokens is None or len(completion.choices) != 1 or completion.choices[0].finish_reason != "length":
            return
        usage = completion.usage
        if usage.prompt_tokens <= 0 or not 0 < usage.completion_tokens < max_tokens:
            return
        filled = usage.prompt_tokens + usage.completion_tokens
        if self._learned_context is None or filled < self._learned_context:
            self._learned_context = filled
            log.info("llm.context_length.learned", base_url=self.base_url, context_length=filled, source="length stop below max_tokens")

    async def _learned_framing(self) -> bool:
        """Two plain one-token calls, with and without a system message (a template may inject one), for the usage they
        report, where the framing is not known yet: a streamed answer from llama.cpp reports no usage, so nothing would
        ever show the framing its chat template adds. False (and no call) where there is nothing to learn, or where the
        model's own chat template counts a prompt exactly."""
        tokens, fingerprint = self.tokens, self.endpoint.fingerprint
        if not self._stream or self._framing_learned_for == fingerprint or not isinstance(tokens, ModelTokenCounter) or tokens.renders_chat:
            return False
        self._framing_learned_for = fingerprint
        for probe in ((Message(role="user", content="Hi"),), (Message(role="system", content="Hi"), Message(role="user", content="Hi"))):
            params = self._params(LLMRequest(probe, purpose=FRAMING_PROBE), limit=1)  # the gateway's own call, of no run
            response = await self._chat(params)
            if response.usage is not None:
                self._observe(probe, self.replies.completion(response, counter=self.tokens, where=self.base_url))
        return True

    def _observe(self, messages: tuple[Message, ...], completion: Completion) -> None:
        if isinstance(self.tokens, ModelTokenCounter) and completion.usage.prompt_tokens:
            usage = completion.usage
            # the thinking is part of the completion's count: counted with the text where it was shown, taken off the
            # total where it was hidden (an answer of 50 tokens after 2,000 hidden ones says nothing of the ratio)
            texts = [c.reasoning + c.text for c in completion.choices]
            hidden = usage.reasoning_tokens if not any(c.reasoning for c in completion.choices) else 0
            self.tokens.observe_usage(messages, usage.prompt_tokens, texts, usage.completion_tokens, hidden_tokens=hidden)

    async def _streamed(self, params: dict[str, Any], request: LLMRequest, ticket: Ticket, queue_left_s: float) -> tuple[Completion, bool]:
        params = {**params, "stream": True, "stream_options": {"include_usage": True}}
        parts = StreamParts()
        not_started = f"the server at {self.base_url} did not start on the call within queue_timeout_s={self._queue_timeout_s:g}"

        async def queued(step: Awaitable[Any]) -> Any:
            try:
                async with asyncio.timeout(max(queue_left_s, 0.001)):
                    return await step
            except TimeoutError:
                raise TransientProviderError(not_started) from None

        with self.limiter.sending():
            stream_cls = openai.AsyncStream[ChatCompletionChunk]
            stream = await queued(self._post("/chat/completions", params, cast_to=ChatCompletion, stream=True, stream_cls=stream_cls))
            chunks = aiter(stream)
            try:
                # llama.cpp sends its first chunk once it has started on the call: the queue's time ends there
                with contextlib.suppress(StopAsyncIteration):
                    parts.add(await queued(anext(chunks)))
                self.limiter.started(ticket)
                await self._read_stream(chunks, parts, request)
            finally:
                await stream.close()  # on cancel and timeout too: a closed stream is how the server learns to stop
        return self._assembled(parts, request), parts.usage is not None

    def _assembled(self, parts: StreamParts, request: LLMRequest) -> Completion:
        """A whole stream as a Completion; a stream cut short raises, charged with what it cost."""
        if not parts.texts or any(c.finish_reason is None for c in parts.choices.values()):  # the server cut it short
            self.limiter.stream_cut()  # the next attempt (and every process's next call) is not sent alongside another
            cut = TransientProviderError(
                f"the stream from {self.base_url} ended before the model finished (the server cut it short, e.g. "
                "llama-cpp-python interrupting it for another request)"
            )
            raise parts.spent_on(cut, self.tokens, request)
        reply = parts.reply(self.model)
        # llama.cpp streams without a usage chunk: its prompt is counted as the model does
        prompt = None if reply.usage is not None else count_messages(self.tokens, request.messages, request.tools)
        return self.replies.completion(reply, counter=self.tokens, where=self.base_url, prompt_tokens=prompt)

    async def _read_stream(self, chunks: Any, parts: StreamParts, request: LLMRequest) -> None:
        """The rest of a stream into `parts`; it fails when no chunk has come for `idle_timeout_s` (a model still producing
        tokens is never cut for its total time, however long it thinks) or at the overall `generation_deadline_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._generation_deadline_s
        try:
            async with asyncio.timeout_at(min(loop.time() + self._idle_timeout_s, deadline)) as timer:
                async for chunk in chunks:
                    parts.add(chunk)
                    timer.reschedule(min(loop.time() + self._idle_timeout_s, deadline))
        except TimeoutError:
            if loop.time() >= deadline:
                why = f"was still generating after generation_deadline_s={self._generation_deadline_s:g}"
            else:
                why = f"sent no token for idle_timeout_s={self._idle_timeout_s:g}"
            timeout = TransientProviderError(f"Timeout: the model at {self.base_url} {why} (the stream was closed, which stops it)")
            raise parts.spent_on(timeout, self.tokens, request) from None
