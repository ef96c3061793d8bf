"""What an endpoint's model refuses, learnt from its 400s and remembered, so a refused parameter costs one call.

A model that refuses a parameter (OpenAI's reasoning models refuse `max_tokens`, `temperature`, `stop`...) answers
400 naming it; the client sends the call again without it (or in its accepted form) and records the refusal here,
keyed by (endpoint, model). A `RefusalBook` is read synchronously on every call (a local dict) and written rarely:
`record` keeps the refusal and hands it to a pluggable sink, which is how a cluster-wide book shares it with every
replica, branch runner and session host; `load` takes in what the others learnt.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from reasonray.gateway.errors import ProviderRejectedError

log = structlog.get_logger(__name__)

REFUSABLE = (
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "top_logprobs",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "reasoning_effort",
    "system",
)
"""The parameters a refusal is learnt for; `system` is a system message (its text then goes into the first user message)."""

Key = tuple[str, str]
"""(base_url, model)"""
Sink = Callable[[str, str, str], None]
"""Told of every refusal learnt here first: (base_url, model, parameter)."""


class RefusalBook:
    """The parameters each (endpoint, model) is known to refuse, in this process's memory; `sink` (if set) hears each
    new refusal, `load` merges others'."""

    def __init__(self, sink: Sink | None = None) -> None:
        self._known: dict[Key, frozenset[str]] = {}
        self._lock = threading.Lock()
        self.sink = sink

    def refused(self, base_url: str, model: str) -> frozenset[str]:
        """What the model at `base_url` refuses, as far as this process knows (never blocks)."""
        return self._known.get((base_url, model), frozenset())

    def record(self, base_url: str, model: str, param: str) -> bool:
        """Remember a refusal; True when it is new here (then it is logged and passed to the sink)."""
        if not self._add(base_url, model, param):
            return False
        log.info("llm.parameter_refused", base_url=base_url, model=model, param=param)
        if self.sink is not None:
            try:
                self.sink(base_url, model, param)
            except Exception as exc:  # sharing is a saving, not a requirement: this process has learnt it
                log.warning("llm.parameter_refused.share_failed", param=param, reason=str(exc)[:200])
        return True

    def load(self, entries: Iterable[tuple[str, str, str]]) -> None:
        """Take in refusals learnt elsewhere (base_url, model, parameter), silently and without telling the sink."""
        for base_url, model, param in entries:
            self._add(base_url, model, param)

    def _add(self, base_url: str, model: str, param: str) -> bool:
        with self._lock:
            known = self._known.get((base_url, model), frozenset())
            if param in known:
                return False
            self._known[(base_url, model)] = known | {param}
            return True


_book = RefusalBook()


def refusal_book() -> RefusalBook:
    """The book this process's clients share (a cluster-wide one once `use_refusal_book` installed it)."""
    return _book


def use_refusal_book(book: RefusalBook) -> RefusalBook:
    """Install `book` as the one every client of this process reads and records to; returns the previous one."""
    global _book
    previous, _book = _book, book
    return previous


class ParameterRefused(ProviderRejectedError):
    """The model refused one parameter of the request (a 400 naming it): the same call without it can be answered."""

    def __init__(self, message: str, *, param: str = "", status_code: int | None = 400) -> None:
        super().__init__(message, status_code=status_code)
        self.param = param


# how servers say a parameter is refused outright, not merely out of range ("temperature must be at most 2" is the caller's)
_REFUSING = re.compile(
    r"unsupported|not supported|does not support|unrecognized|unknown (parameter|field|argument)|not allowed|not permitted"
    r"|only the default|is not available|extra (inputs|fields)|deprecated for this model",
    re.IGNORECASE,
)
_QUOTED = re.compile(r"['\"`]([a-z_\[\]0-9.]+)['\"`]")


def refused_param(message: str, param: Any, params: dict[str, Any]) -> str | None:
    """The parameter a 400 refuses, from its `param` member or the names it quotes, among those `params` sent; None
    when the message does not say it is refused (a value out of range is the caller's to fix, not a refusal)."""
    if not _REFUSING.search(message):
        return None
    named = [param] if isinstance(param, str) else []
    named += _QUOTED.findall(message)
    lowered = message.lower()
    sent_system = any(m.get("role") == "system" for m in params.get("messages", ()))
    if sent_system and "system" in lowered and ("role" in lowered or any(n.startswith("messages") or n == "system" for n in named)):
        return "system"
    sent = [name for name in REFUSABLE if name != "system" and params.get(name) is not None]
    # one it names, else one it mentions unquoted, as some servers word it ("Unrecognized request argument supplied: stop")
    found = next((n for n in named if n in sent), None) or next((n for n in sent if re.search(rf"\b{n}\b", lowered)), None)
    return "logprobs" if found == "top_logprobs" else found
