"""Counting in the model's own tokens, so budgets, chunks, cuts and `max_tokens` agree with the server.

A `ModelTokenCounter` counts with the best source it has, in this order:

- a tokenizer held in this process: the model's GGUF file (through llama-cpp-python, vocabulary only, no
  weights) or a Hugging Face `tokenizer.json` (through `tokenizers`): exact and fast;
- the server's tokenize endpoint (llama.cpp `/tokenize`, llama-cpp-python `/extras/tokenize`, vLLM
  `/tokenize`): exact, one small HTTP call per distinct text, cached;
- otherwise tiktoken's count scaled by what the server reports: the largest recent ratio of its token counts to
  ours (prompt and completion usage, tokenize answers), plus a safety margin, so an estimate errs on the high side.

A chat request's prompt is counted exactly when the model's GGUF file is at hand and the server formats with the
template it carries (llama-cpp-python's server without `--chat_format`): `count_chat` renders that Jinja template
with the messages and tools and tokenizes the result as the server does. This matters because llama-cpp-python
reports no usage in a stream, and ReasonRay streams to it: the prompt count charged is this one. Otherwise the
counter learns the chat framing the server adds around messages (ChatML markers, a system prompt the chat
template injects) from the prompt usage it reports, and `count_messages` adds it. `head` and `tail` cut by
the same count: `count(head(text, n)) <= n` always holds.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import httpx
import structlog

from reasonray.gateway.discovery import TOKENIZE_STYLES, EndpointInfo
from reasonray.gateway.protocol import Message
from reasonray.gateway.tokens import TokenCounter, count_messages, openai_message

log = structlog.get_logger(__name__)

MIN_CALIBRATION_TOKENS = 16
"""Texts shorter than this (in our count) say little about the ratio between two tokenizers; they are not used."""
MAX_USAGE_RATIO = 4.0
"""A reply's reported completion tokens above this many per token of its text (or below its inverse) count more than the
text: thinking out of sight that no `reasoning_tokens` named. Tokenizers differ far less; such a reply teaches no ratio."""
CALIBRATION_WINDOW = 32
"""Observations the ratio and the framing are taken over (the largest of them: counts err high, never low)."""
UNSEEN_FRAMING = 48
"""Tokens a prompt is assumed to carry beyond `count_messages`' framing until the server's usage has shown how many
(ChatML markers for a few messages and a system prompt a chat template injects take about this)."""
TEXT_CACHE_SIZE, CHAT_CACHE_SIZE = 16384, 256
"""Texts whose token ids and base counts are kept; chat prompts whose exact counts are (the calls in flight and their retries)."""
SERVER_RETRY_AFTER_S = 10.0
"""After the tokenize endpoint failed or timed out, counts are estimated for this long before it is asked again."""


class TokenSource(Protocol):
    """A tokenizer: `encode` gives the model's token ids of a text, or None when it cannot answer right now."""

    name: str

    def encode(self, text: str) -> list[int] | None: ...

    def decode(self, tokens: list[int]) -> str | None: ...


class GGUFVocab:
    """The tokenizer a GGUF model file carries, loaded without its weights (llama-cpp-python, vocab_only)."""

    def __init__(self, path: str) -> None:
        try:
            import llama_cpp
        except ImportError as exc:
            raise RuntimeError(f"counting with {path} needs llama-cpp-python (pip install llama-cpp-python)") from exc
        self.name = f"gguf:{Path(path).name}"
        self._llama = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)

    def count_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int | None:
        """A chat request's prompt tokens as llama-cpp-python's server counts them when it serves this file with its
        own template (no `--chat_format`): the GGUF's Jinja template rendered with the messages and tools, tokenized
        with special tokens and no added BOS (the template writes its own). None when the server would format the
        prompt otherwise (a template it recognises as a built-in format, or none in the file)."""
        template = self._chat_template
        if template is None:
            return None
        prompt = template(messages=messages, tools=tools or None).prompt
        return len(self._llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True))

    @property
    def renders_chat(self) -> bool:
        """Whether `count_chat` counts exactly (the file carries a template the server renders as it is)."""
        return self._chat_template is not None

    @functools.cached_property
    def _chat_template(self) -> Any:
        """The chat template llama-cpp-python's server renders prompts with (see count_chat); None when it would not."""
        from llama_cpp import llama_chat_format

        metadata = self._llama.metadata
        template = metadata.get("tokenizer.chat_template")
        # the server uses a built-in formatter instead when it recognises the template (its own rendering)
        if not template or llama_chat_format.guess_chat_format_from_gguf_metadata(metadata) is not None:
            return None
        model = self._llama._model
        eos, bos = self._llama.token_eos(), self._llama.token_bos()
        return llama_chat_format.Jinja2ChatFormatter(
            template=template,
            eos_token=model.token_get_text(eos) if eos != -1 else "",
            bos_token=model.token_get_text(bos) if bos != -1 else "",
            stop_token_ids=[eos],
        )

    def encode(self, text: str) -> list[int] | None:
        tokens: list[int] = self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)  # typed: llama-cpp-python is optional
        return tokens

    def decode(self, tokens: list[int]) -> str | None:
        raw: bytes = self._llama.detokenize(tokens)
        return raw.decode("utf-8", errors="ignore")


class TokenizerFile:
    """A Hugging Face `tokenizer.json` (vLLM's models ship one)."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        self.name = f"tokenizer:{Path(path).parent.name or Path(path).name}"
        self._tok = Tokenizer.from_file(path)

    def encode(self, text: str) -> list[int] | None:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int]) -> str | None:
        return self._tok.decode(tokens, skip_special_tokens=False)


def local_source(path: str) -> TokenSource:
    """The tokenizer in a .gguf or tokenizer.json file; a clear error for anything else."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"[llm] tokenizer names {path!r}, which is not a file (give a .gguf or tokenizer.json, or 'auto')")
    if path.endswith(".gguf"):
        return GGUFVocab(path)
    if path.endswith(".json"):
        return TokenizerFile(path)
    raise ValueError(f"[llm] tokenizer {path!r} is neither a .gguf model nor a tokenizer.json")


class ServerTokenizer:
    """The server's own tokenize (and detokenize) endpoint, called synchronously: counting happens between calls,
    in code that cannot await. `busy()` true means asking now would disturb the server (llama-cpp-python runs
    tokenize under the lock of generation and interrupts a stream for it), so the caller estimates instead."""

    def __init__(self, info: EndpointInfo, model: str, *, headers: dict[str, str] | None = None, busy: Callable[[], bool] = lambda: False):
        self.info, self.style, self.model, self.busy = info, info.tokenize_style or "", model, busy
        self.name = f"server:{self.style}"
        self._http = httpx.Client(timeout=2.0, headers=headers)
        self._down_until = 0.0

    def _post(self, url: str | None, body: dict[str, Any]) -> dict[str, Any] | None:
        if url is None or self.busy() or time.monotonic() < self._down_until:
            return None
        if self.style == "vllm":
            body = {"model": self.model, **body}
        try:
            response = self._http.post(url, json=body)
            response.raise_for_status()
            return cast(dict[str, Any], response.json())
        except (httpx.HTTPError, ValueError) as exc:
            self._down_until = time.monotonic() + SERVER_RETRY_AFTER_S
            log.warning(
                "tokens.server_unavailable", url=url, error=f"{type(exc).__name__}: {exc}"[:200], estimate_for_s=SERVER_RETRY_AFTER_S
            )
            return None

    def encode(self, text: str) -> list[int] | None:
        data = self._post(self.info.tokenize_url, {TOKENIZE_STYLES[self.style][1]: text})
        tokens = data.get("tokens") if data else None  # without the ids the endpoint puts before any text (a BOS token)
        return [int(t) for t in tokens[self.info.bos_tokens :]] if isinstance(tokens, list) else None

    def decode(self, tokens: list[int]) -> str | None:
        data = self._post(self.info.detokenize_url, {"tokens": tokens})
        text = data.get(TOKENIZE_STYLES[self.style][2]) if data else None
        return text if isinstance(text, str) else None


class _NoAnswer(Exception):
    """The source could not answer now: nothing to cache."""


class ModelTokenCounter:
    """The run's token counter (`ctx.tokens`): exact where a source answers, a calibrated estimate otherwise."""

    def __init__(
        self,
        base: TokenCounter,
        *,
        margin: float = 0.1,
        source: TokenSource | None = None,
        on_first_use: Callable[[], None] | None = None,
    ) -> None:
        self.base = base
        self.margin = margin
        self.source = source
        self.unseen_framing = UNSEEN_FRAMING
        self._on_first_use = on_first_use  # learns what to count with (discovery) before the first count
        self._ids = functools.lru_cache(maxsize=TEXT_CACHE_SIZE)(self._encode)
        self._base_count: Callable[[str], int] = functools.lru_cache(maxsize=TEXT_CACHE_SIZE)(base.count)
        # a streamed call counts its prompt twice, for its `max_tokens` and for its usage: rendered once
        self._chats = functools.lru_cache(maxsize=CHAT_CACHE_SIZE)(self._render_chat)
        self._ratios: deque[float] = deque(maxlen=CALIBRATION_WINDOW)
        # by whether the prompt opens with a system message: chat templates inject one when it does not
        self._overheads: dict[bool, deque[int]] = {True: deque(maxlen=CALIBRATION_WINDOW), False: deque(maxlen=CALIBRATION_WINDOW)}

    @property
    def encoding_name(self) -> str:
        return self.source.name if self.source is not None else f"calibrated:{self.base.encoding_name}"

    @property
    def exact(self) -> bool:
        """Counts come from the model's tokenizer (when its source answers), not from an estimate."""
        return self.source is not None

    @property
    def ratio(self) -> float:
        """Model tokens per base-encoding token, as the server has shown it (never below 1: an estimate errs high)."""
        return max(self._ratios, default=1.0)

    def framing(self, messages: tuple[Message, ...]) -> int:
        """Tokens the server adds to these messages beyond `count_messages`' own framing (its chat template's
        markers; a system prompt it injects when the messages bring none), as its usage has shown."""
        self._first_use()
        system = bool(messages) and messages[0].role == "system"
        seen, other = self._overheads[system], self._overheads[not system]
        return max(seen) if seen else max(other) if other else self.unseen_framing

    def _first_use(self) -> None:
        if self._on_first_use is not None:
            hook, self._on_first_use = self._on_first_use, None
            hook()

    def use(self, source: TokenSource | None) -> None:
        """Count with `source` from now on (discovery found a tokenizer, or the model behind the endpoint changed)."""
        if source is not self.source:
            self.source = source
            self._ids.cache_clear()
            self._chats.cache_clear()
            for seen in self._overheads.values():
                seen.clear()

    def _model_ids(self, text: str) -> list[int] | None:
        try:
            return self._ids(text) if self.source is not None else None
        except _NoAnswer:
            return None

    def _encode(self, text: str) -> list[int]:
        ids = self.source.encode(text) if self.source is not None else None
        if ids is None:
            raise _NoAnswer
        self.observe_ratio(self._base_count(text), len(ids))
        return ids

    def count(self, text: str) -> int:
        self._first_use()
        if not text:
            return 0
        ids = self._model_ids(text)  # else the calibrated estimate, with its margin
        return len(ids) if ids is not None else math.ceil(self._base_count(text) * self.ratio * (1 + self.margin))

    @property
    def renders_chat(self) -> bool:
        """Whether prompts count exactly through the model's chat template (then there is no framing to learn)."""
        return bool(getattr(self.source, "renders_chat", False))

    def count_chat(self, messages: tuple[Message, ...], tools: Sequence[dict[str, Any]] = ()) -> int | None:
        """A chat request's prompt tokens exactly as the server counts them, when the source can render the
        model's chat template (a GGUF file the server serves with its own template); None otherwise."""
        self._first_use()
        if not self.renders_chat:
            return None
        try:
            return self._chats(tuple(messages), json.dumps(list(tools), sort_keys=True, default=str))
        except _NoAnswer:
            return None

    def _render_chat(self, messages: tuple[Message, ...], tools: str) -> int:
        render = self.source.count_chat  # type: ignore[union-attr]  # a source that renders chats has it
        try:
            counted = render([openai_message(m) for m in messages], json.loads(tools))
        except Exception as exc:  # a template that fails on these messages: the server would say so; estimate here
            log.info("tokens.chat_template_failed", source=self.encoding_name, reason=str(exc)[:200])
            raise _NoAnswer from None
        if counted is None:
            raise _NoAnswer
        return int(counted)

    def head(self, text: str, n: int) -> str:
        return self._cut(text, n, from_end=False)

    def tail(self, text: str, n: int) -> str:
        return self._cut(text, n, from_end=True)

    def _cut(self, text: str, n: int, *, from_end: bool) -> str:
        n = max(n, 0)
        if self.count(text) <= n:
            return text
        target = n
        for _ in range(6):  # decoding a cut and encoding it again can differ by a token or two at the seam
            ids, piece = self._model_ids(text), None
            if ids is not None and self.source is not None:
                piece = self.source.decode(ids[len(ids) - target :] if from_end else ids[:target])
            if piece is None:  # the estimate's cut, in base tokens
                base_n = math.floor(target / (self.ratio * (1 + self.margin)))
                piece = self.base.tail(text, base_n) if from_end else self.base.head(text, base_n)
            over = self.count(piece) - n
            if over <= 0:
                return piece
            target -= over
            if target <= 0:
                break
        lo, hi = 0, len(text)  # else the longest piece, in characters, whose count fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            piece = text[len(text) - mid :] if from_end else text[:mid]
            if self.count(piece) <= n:
                lo = mid
            else:
                hi = mid - 1
        return text[len(text) - lo :] if from_end else text[:lo]

    def observe_ratio(self, base_tokens: int, model_tokens: int) -> None:
        """One text counted both ways (our base encoding, the model's tokenizer or usage)."""
        if base_tokens >= MIN_CALIBRATION_TOKENS and model_tokens > 0:
            self._ratios.append(model_tokens / base_tokens)

    def observe_usage(
        self,
        messages: tuple[Message, ...],
        prompt_tokens: int,
        completion_texts: Iterable[str] = (),
        completion_tokens: int = 0,
        *,
        hidden_tokens: int = 0,
    ) -> None:
        """What the server reported for a call: calibrates the estimate, and an exact count's framing.

        `completion_texts` are what was generated as text (thinking shown included); `hidden_tokens`, the part of
        `completion_tokens` never shown (a reasoning model's hidden thinking): the ratio is learnt from the rest only,
        since one reply with 50 tokens of answer after 2,000 hidden ones would otherwise inflate every later estimate."""
        if prompt_tokens <= 0 or self.renders_chat:  # an exact count has nothing to learn
            return
        shown = completion_tokens - hidden_tokens
        if not self.exact:
            texts = [t for t in completion_texts if t]
            if len(texts) == 1 and shown > 0:  # n > 1 reports one total for several texts
                base = self._base_count(texts[0])
                if base and 1 / MAX_USAGE_RATIO <= shown / base <= MAX_USAGE_RATIO:
                    self.observe_ratio(base, shown)
        # what the prompt's count misses (framing, an injected system prompt; for an estimate also a ratio too low)
        ours = count_messages(self, messages) - self.framing(messages)
        self._overheads[bool(messages) and messages[0].role == "system"].append(max(prompt_tokens - ours, 0))
