"""A model's chat template, rendered in process: the prompt of a raw `/v1/completions` call that continues a reply.

Rendered as transformers renders it (jinja2's sandbox, `trim_blocks` and `lstrip_blocks`, loop controls,
`raise_exception`), from a HuggingFace tokenizer_config.json (its `chat_template`, `bos_token` and `eos_token`) or
from a Jinja file holding the template alone.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from reasonray.gateway.errors import LLMConfigError

_OPENED = re.compile(r"<think>\s*\Z")  # the thinking a generation prompt opens itself (R1's): the prefix opens it again


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


class ChatTemplate:
    """The template at `path` (a tokenizer_config.json, or any other file as Jinja), read and compiled once."""

    def __init__(self, path: str) -> None:
        try:
            text = Path(path).read_text(encoding="utf-8")
            config = json.loads(text) if path.endswith(".json") else {"chat_template": text}
            source = config["chat_template"]
            if isinstance(source, list):  # named templates: the default one
                source = next(t["template"] for t in source if t.get("name") == "default")
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(source)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration, jinja2.TemplateError) as exc:
            raise LLMConfigError(f"[llm] chat_template = {path!r} holds no chat template jinja2 can compile: {exc!r}") from None
        tokens = {name: config.get(name) for name in ("bos_token", "eos_token")}  # text, or an AddedToken's JSON form
        self._tokens = {name: str(t.get("content", "")) if isinstance(t, dict) else str(t or "") for name, t in tokens.items()}
        self._path = path

    def continuing(self, messages: list[dict[str, Any]], prefix: str) -> str:
        """The messages, the assistant's turn opened, and `prefix` (which opens the thinking itself) as one prompt."""
        render = functools.partial(self._template.render, **self._tokens)
        try:
            head = render(messages=messages, add_generation_prompt=True)
            if head == render(messages=messages, add_generation_prompt=False):
                # a template that ignores the flag (llama-cpp-python's convention): a blank final assistant message opens the turn
                head = render(messages=[*messages, {"role": "assistant", "content": ""}], add_generation_prompt=True)
        except jinja2.TemplateError as exc:  # the template's own raise_exception, or a member it needs and lacks
            raise LLMConfigError(f"[llm] chat_template = {self._path!r} cannot render these messages: {exc}") from None
        return _OPENED.sub("", head) + prefix
