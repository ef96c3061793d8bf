"""Every form a server hands a reply over in, read into the same `Choice` and `Usage`.

A reasoning model's thinking arrives in one of three forms: a separate field of the message and of every
stream delta (`reasoning_content`, or `reasoning`: vLLM and SGLang with a reasoning parser, DeepSeek,
OpenRouter), raw text ending in `</think>` (the same models without a parser; R1-style chat templates write
the opening tag into the prompt, so the reply holds only the closing one), or only a count
(`usage.completion_tokens_details.reasoning_tokens`: OpenAI's o-series and gpt-5). Whatever the form, the
Choice's `text` is the answer alone, `reasoning` the thinking, and a reply that ended inside its thinking has
no answer (`thinking_unfinished`). The plain and the streamed path of `openai_client` both end here, as
vLLM's `ReasoningParser` and LiteLLM's `reasoning_content` normalisation each keep one reading of it.

`<thinking>` is also the tag ReasonRay's own prompts ask any model to reason in, before an `<answer>`: a
model not known to think natively keeps those blocks in its text, where `kernel.tags` strips them from
everything fed forward (reading them as native thinking would make every prompted model look like a
thinking one). Only `<think>` (a leading block, or its closing tag alone) and `<thinking>` from a model
known to think in its text are taken out as thinking here.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any, cast

import msgspec

from reasonray.gateway.errors import ProviderRejectedError, TransientProviderError
from reasonray.gateway.protocol import Choice, Completion, FinishReason, LLMRequest, ToolCall, Usage
from reasonray.gateway.tokens import TokenCounter, count_messages

_TAG = re.compile(r"<(/?)(think|thinking)\s*>", re.IGNORECASE)
_OPENS = re.compile(r"\s*<think(?:ing)?\s*>", re.IGNORECASE)
# families whose chat templates open the thinking in the prompt (`<think>\n` after the assistant's header): with no
# reasoning parser the reply is thinking from its first token, so one cut before `</think>` holds no tag at all.
# Hybrid Qwen3 writes its own opening tag (and its template closes an empty one when thinking is switched off).
_THINKS_IN_TEXT = re.compile(r"deepseek-r1|r1-distill|\bqwq|qwen3.*thinking", re.IGNORECASE)
_TRANSIENT_WORDS = ("overload", "rate_limit", "rate limit", "server_error", "unavailable", "timeout", "timed out", "capacity", "busy")


def split_thinking(content: str, finish_reason: str, *, thinks: bool) -> tuple[str, str, bool, int]:
    """Raw reply text as (answer, thinking, unfinished, where the answer starts in `content`).

    `thinks`: the model is known to think in its text, so `<thinking>` is its own and a reply cut by length
    with no closing tag was cut inside the thinking its template opened."""
    # the hot path: no tag to take out, no search
    first = _TAG.search(content) if "think>" in content or (thinks and "thinking>" in content) else None
    if first is None:
        if thinks and finish_reason == "length":
            return "", content, True, len(content)
        return content, "", False, 0
    native = first.group(2).lower() == "think" or thinks
    if first.group(1):  # a closing tag first: everything before it was thinking (R1's opening tag is in the prompt)
        return content[first.end() :].lstrip(), content[: first.start()].strip(), False, first.end()
    if not native or content[: first.start()].strip():  # prompted scratch, or an aside after answer text
        return content, "", False, 0
    close = re.compile(rf"</{first.group(2)}\s*>", re.IGNORECASE).search(content, first.end())
    if close is None:
        return "", content[first.end() :].strip(), True, len(content)
    return content[close.end() :].lstrip(), content[first.end() : close.start()].strip(), False, close.end()


class ReplyReader:
    """Reads one endpoint's replies; learns from them whether its model thinks in its text.

    `thinks_in_text` starts from the model's name (or what the configuration says) and turns on at the first reply
    whose text closed thinking it never opened (the R1 form: the template opens it in the prompt). From then on a
    reply cut by `max_tokens` with no closing tag is unfinished thinking, never an answer. Thinking in a separate
    field, or opened by the reply itself, teaches nothing of the kind."""

    __slots__ = ("thinks_in_text",)

    def __init__(self, model: str, *, thinks: bool | None = None) -> None:
        self.thinks_in_text = _THINKS_IN_TEXT.search(model) is not None if thinks is None else thinks

    def completion(self, response: WireCompletion, *, counter: TokenCounter, where: str, prompt_tokens: int | None = None) -> Completion:
        """A decoded answer as a Completion; a 200 that holds an error or no choice raises, classified. `prompt_tokens`:
        the prompt's count where the answer has no usage and must be counted here (a stream without a usage chunk)."""
        if response.error is not None:
            raise provider_error(response.error, where=where)
        if response.choices is None:  # some other JSON: a proxy's, a framework's 404 body, another endpoint's
            raise ProviderRejectedError(
                f"HTTP 200 from {where} is not a chat completion (it has no `choices`; is [llm] base_url the API root, "
                "e.g. http://host:8000/v1?)",
                status_code=200,
            )
        if not response.choices:
            raise ProviderRejectedError(
                f"HTTP 200 from {where} holds no choice (`choices: []`): the server answered nothing", status_code=200
            )
        choices = [self._choice(c) for c in response.choices]
        u = response.usage
        if u is not None:
            hidden = u.completion_tokens_details.reasoning_tokens if u.completion_tokens_details is not None else None
            usage = read_usage(u.prompt_tokens, u.completion_tokens, hidden, choices, counter)
        elif prompt_tokens is not None:  # counted as the model counts, the thinking included
            usage = read_usage(prompt_tokens, sum(counter.count(c.reasoning) + _shown(c, counter) for c in choices), None, choices, counter)
        else:
            usage = Usage()
        return Completion(
            choices=settle(choices, usage), usage=usage, model=response.model, simulated=response.model.startswith("simulated")
        )

    def _choice(self, c: WireChoice) -> Choice:
        """One choice of a reply, whatever form its thinking came in (a separate field, tags in the text, or none)."""
        m = c.message
        reasoning = next((r for r in (m.reasoning_content, m.reasoning) if isinstance(r, str) and r), None)
        choice = read_choice(
            m.content,
            reasoning,
            c.finish_reason,
            thinks=self.thinks_in_text,
            tool_calls=tuple(ToolCall(id=t.id, name=t.function.name, arguments=t.function.arguments or "{}") for t in m.tool_calls or ()),
            stop_sequence=c.stop_reason if isinstance(c.stop_reason, str) else None,
            logprobs=(c.logprobs.content or ()) if c.logprobs is not None else (),
        )
        if not reasoning and choice.reasoning and not choice.thinking_unfinished and not _OPENS.match(m.content or ""):
            self.thinks_in_text = True  # thinking closed that the reply never opened: the template opens it
        return choice


def read_choice(
    content: str | None,
    reasoning: str | None,
    finish_reason: str | None,
    *,
    thinks: bool,
    tool_calls: tuple[ToolCall, ...] = (),
    stop_sequence: str | None = None,
    logprobs: Sequence[Any] = (),
) -> Choice:
    """One choice, `thinks` saying whether the model is known to think in its text; `stop_sequence` the one that ended
    its text, `logprobs` its tokens' log-probabilities as the server sent them."""
    finish, text = finish_reason or "stop", content or ""
    if reasoning:  # a reasoning parser split it: content is the answer, null when the budget ran out while thinking
        unfinished, start = finish == "length" and not text.strip() and not tool_calls, 0
    else:
        text, reasoning, unfinished, start = split_thinking(text, finish, thinks=thinks and not tool_calls)
    # the log-probabilities of the answer's tokens: those that end after `start` characters of thinking in the text
    answer = [t for t, end in zip(logprobs, itertools.accumulate(len(t.token or "") for t in logprobs), strict=True) if end > start]
    return Choice(
        text=text,
        finish_reason=cast(FinishReason, finish),  # the provider's own word for it
        tool_calls=tool_calls,
        stop_sequence=stop_sequence,
        reasoning=reasoning,
        token_logprobs=tuple(float(t.logprob) for t in answer),
        top_logprobs=tuple(tuple(float(a.logprob) for a in t.top_logprobs) for t in answer if t.top_logprobs),
        thinking_unfinished=unfinished,
    )


def read_usage(
    prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None, choices: Sequence[Choice], counter: TokenCounter
) -> Usage:
    """The reply's counts: the server's `reasoning_tokens` where it reports them, else the thinking's share of the
    server's completion total, the shares counted as the model does (so a counter's safety margin cancels out)."""
    if not reasoning_tokens and any(c.reasoning for c in choices):
        thought = sum(counter.count(c.reasoning) for c in choices)
        shown = sum(_shown(c, counter) for c in choices)
        reasoning_tokens = round(completion_tokens * thought / (thought + shown)) if thought + shown else 0
    return Usage(prompt_tokens, completion_tokens, reasoning_tokens or 0)


def _shown(choice: Choice, counter: TokenCounter) -> int:
    """The tokens of a choice's answer: its text and its tool calls."""
    return counter.count(choice.text) + sum(counter.count(t.name + t.arguments) for t in choice.tool_calls)


def settle(choices: list[Choice], usage: Usage) -> tuple[Choice, ...]:
    """The choices, with a reply whose hidden thinking used up every token it was given marked unfinished: cut by
    length with no text and nothing but thinking counted (OpenAI's reasoning models out of `max_completion_tokens`)."""
    c = choices[0] if len(choices) == 1 else None
    spent_thinking = 0 < usage.reasoning_tokens >= usage.completion_tokens
    if c is not None and spent_thinking and c.finish_reason == "length" and not c.text and not c.tool_calls:
        return (msgspec.structs.replace(c, thinking_unfinished=True),)
    return tuple(choices)


def provider_error(error: Any, *, where: str) -> TransientProviderError | ProviderRejectedError:
    """An error the provider sent inside a 200 (a body `{"error": ...}`, a stream's error event), in its own words:
    transient where its type, code or status says so (overloaded, rate limited, a server error), else a rejection."""
    fields = error if isinstance(error, dict) else {"message": str(error)}
    message = str(fields.get("message") or fields.get("error") or fields)[:500]
    kind = " ".join(str(fields.get(k) or "") for k in ("type", "code", "status")).strip()
    numbers = (fields.get("status"), fields.get("code"), fields.get("status_code"))
    statuses = [int(v) for v in numbers if isinstance(v, int) or (isinstance(v, str) and v.isdigit() and len(v) == 3)]
    detail = f"{where} sent an error{f' ({kind})' if kind else ''}: {message}"
    words = f"{kind} {message}".lower()
    transient = any(s == 429 or s == 408 or s >= 500 for s in statuses) or any(w in words for w in _TRANSIENT_WORDS)
    return (TransientProviderError if transient else ProviderRejectedError)(detail, status_code=statuses[0] if statuses else 200)


# -- the plain (non-streamed) answer, decoded by msgspec into only what a Completion keeps -------------------------


class WireFunction(msgspec.Struct):
    name: str = ""
    arguments: str | None = None


class WireToolCall(msgspec.Struct):
    id: str = ""
    function: WireFunction = msgspec.field(default_factory=WireFunction)


class WireMessage(msgspec.Struct):
    content: str | None = None
    tool_calls: list[WireToolCall] | None = None
    reasoning_content: Any = None  # vLLM (older), SGLang, DeepSeek
    reasoning: Any = None  # vLLM (newer), OpenRouter; typed loosely: a server's own shape must not fail the whole reply


class WireAlternative(msgspec.Struct):
    logprob: float = 0.0


class WireTokenLogprob(msgspec.Struct):
    token: str = ""
    logprob: float = 0.0
    top_logprobs: list[WireAlternative] | None = None


class WireLogprobs(msgspec.Struct):
    content: list[WireTokenLogprob] | None = None


class WireChoice(msgspec.Struct):
    message: WireMessage = msgspec.field(default_factory=WireMessage)
    text: str | None = None  # a raw completion's (/v1/completions), in place of a message
    finish_reason: str | None = None
    stop_reason: Any = None  # vLLM and the simulator say which stop sequence matched (a token id when none did)
    logprobs: WireLogprobs | None = None


class WireCompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class WireUsage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    completion_tokens_details: WireCompletionDetails | None = None


class WireCompletion(msgspec.Struct):
    """What a Completion keeps of a chat completion; every other member of the answer is skipped unread."""

    choices: list[WireChoice] | None = None
    model: str = ""
    usage: WireUsage | None = None
    error: Any = None  # a 200 that carries the provider's error instead of a completion


WIRE = msgspec.json.Decoder(WireCompletion)


class StreamParts:
    """The chunks of a streamed completion, put back together in the plain answer's wire form (text, thinking, tool
    calls, log-probabilities, finish reason, usage by choice), to be read as it is."""

    __slots__ = ("calls", "choices", "logprobs", "model", "reasoning", "texts", "usage")

    def __init__(self) -> None:
        self.choices: dict[int, WireChoice] = {}
        self.texts: dict[int, list[str]] = {}
        self.reasoning: dict[int, list[str]] = {}
        self.calls: dict[int, dict[int, WireToolCall]] = {}
        self.logprobs: dict[int, list[Any]] = {}
        self.usage: Any = None
        self.model = ""

    def add(self, chunk: Any) -> None:
        extra = getattr(chunk, "model_extra", None)  # the SDK's chunks keep a server's own members there
        if extra and extra.get("error"):  # an error event the SDK passed on as a chunk
            raise provider_error(extra["error"], where=f"the stream from {chunk.model or 'the server'}")
        self.model = chunk.model or self.model
        if chunk.usage is not None:
            self.usage = chunk.usage
        for c in chunk.choices:
            texts, choice = self.texts.setdefault(c.index, []), self.choices.setdefault(c.index, WireChoice())
            delta = c.delta
            if delta is not None:
                if delta.content:
                    texts.append(delta.content)
                    logprobs = getattr(c, "logprobs", None)
                    if logprobs is not None and logprobs.content:  # a thinking delta's tokens are not the answer's
                        self.logprobs.setdefault(c.index, []).extend(logprobs.content)
                fields = getattr(delta, "model_extra", None)
                if fields:  # vLLM, SGLang and DeepSeek stream the thinking as `reasoning_content`, newer vLLM as `reasoning`
                    thought = fields.get("reasoning_content") or fields.get("reasoning")
                    if isinstance(thought, str) and thought:
                        self.reasoning.setdefault(c.index, []).append(thought)
                for t in delta.tool_calls or ():
                    call = self.calls.setdefault(c.index, {}).setdefault(t.index, WireToolCall(function=WireFunction(arguments="")))
                    call.id = t.id or call.id
                    if t.function is not None:
                        call.function.name += t.function.name or ""
                        call.function.arguments = f"{call.function.arguments}{t.function.arguments or ''}"
            if c.finish_reason:
                choice.finish_reason, choice.stop_reason = c.finish_reason, (c.model_extra or {}).get("stop_reason")

    def spent_on(self, error: TransientProviderError, counter: TokenCounter, request: LLMRequest) -> TransientProviderError:
        """`error`, carrying the tokens the call spent before it failed (`spent`: prompt, completion, the thinking
        streamed so far included), by the model's count."""
        streamed = (*self.texts.values(), *self.reasoning.values())
        error.spent = (count_messages(counter, request.messages, request.tools), sum(counter.count("".join(p)) for p in streamed))
        return error

    def reply(self, model: str) -> WireCompletion:
        """The stream as the plain answer it stands for (`model`: the name asked for, where the chunks named none)."""
        for index, choice in self.choices.items():
            calls = sorted(self.calls.get(index, {}).items())
            for n, call in calls:
                call.id = call.id or f"call_{index}_{n}"
            reasoning = "".join(self.reasoning.get(index, ()))
            choice.message = WireMessage("".join(self.texts[index]), [call for _, call in calls], reasoning_content=reasoning)
            choice.logprobs = WireLogprobs(self.logprobs.get(index))
        u = self.usage
        if u is not None:
            hidden = getattr(u.completion_tokens_details, "reasoning_tokens", None)
            u = WireUsage(u.prompt_tokens, u.completion_tokens, WireCompletionDetails(hidden))
        return WireCompletion([self.choices[i] for i in sorted(self.choices)], self.model or model, u)
