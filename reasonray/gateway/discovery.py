"""What an OpenAI-compatible endpoint is, asked of the endpoint itself.

A few cheap requests at first use: `GET /v1/models` (vLLM's `max_model_len`, the model ids, who owns them),
llama.cpp's `GET /props` (`n_ctx`, `total_slots`, `model_path`) and a tokenize probe at each server's path
(llama-cpp-python `/extras/tokenize`, llama.cpp and vLLM `/tokenize`). Every probe may fail (a 404 from a
server without it) and is then simply not used. The ids the probe text tokenizes to join the fingerprint, so
a different model behind the same name and URL gets a different fingerprint even when the server names it
the same.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

import httpx
import msgspec
import structlog

log = structlog.get_logger(__name__)

Flavour = Literal["openai", "llama.cpp", "llama-cpp-python", "vllm", "simulator", "unknown"]

PROBE_TEXT = "ReasonRay tokenizer probe: 12345 + 678 = 13023, naïve café."
CALIBRATION_TEXT = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? In May she sold 48 / 2 = 24 clips, "
    "so altogether she sold 48 + 24 = 72 clips. The answer is 72.\n"
    "def add(a: int, b: int) -> int:\n    return a + b  # 3.14159, 2026-11-25\n"
)
"""Prose, arithmetic and code: what ReasonRay's prompts hold, counted both ways to calibrate an estimate."""


class EndpointInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """What discovery learned; None and empty fields were not found."""

    flavour: Flavour = "unknown"
    context_length: int | None = None
    max_concurrency: int | None = None
    tokenize_url: str | None = None
    detokenize_url: str | None = None
    tokenize_style: str | None = None
    bos_tokens: int = 0
    calibration_tokens: int | None = None
    """CALIBRATION_TEXT's length in the server's tokens."""
    model_path: str | None = None
    fingerprint: str = ""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _ask(http: httpx.Client, url: str, body: dict[str, Any] | None = None) -> Any:
    """The JSON a GET (a POST of `body`) answers; None for any failure."""
    try:
        response = http.get(url) if body is None else http.post(url, json=body)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


TOKENIZE_STYLES: dict[str, tuple[str, str, str]] = {
    # style, in the order probed (llama-cpp-python first: its path is its own, so a hit also says which server this is):
    # (path of its tokenize and detokenize under the server's root, field of the text, field of the text in a detokenize answer)
    "llama-cpp-python": ("/extras", "input", "text"),
    "llama.cpp": ("", "content", "content"),
    "vllm": ("", "prompt", "prompt"),
}


def _tokenize_probe(http: httpx.Client, root: str, model: str, flavour: Flavour) -> dict[str, Any]:
    for style in ("vllm",) if flavour == "vllm" else TOKENIZE_STYLES:
        path, field, _ = TOKENIZE_STYLES[style]
        url = f"{root}{path}/tokenize"
        extra = {"model": model} if style == "vllm" else {}
        probe = _ask(http, url, {**extra, field: PROBE_TEXT})
        tokens = probe.get("tokens") if isinstance(probe, dict) else None
        if not isinstance(tokens, list) or not tokens:
            continue
        empty = _ask(http, url, {**extra, field: ""})
        bos = len(empty.get("tokens") or []) if isinstance(empty, dict) else 0
        sample = _ask(http, url, {**extra, field: CALIBRATION_TEXT})
        sample_tokens = sample.get("tokens") if isinstance(sample, dict) else None
        return {  # EndpointInfo's fields, the probe text's ids (for the fingerprint) and vLLM's context length
            "tokenize_style": style,
            "tokenize_url": url,
            "detokenize_url": f"{root}{path}/detokenize",
            "bos_tokens": bos,
            "calibration_tokens": len(sample_tokens) - bos if isinstance(sample_tokens, list) else None,
            "tokens": [int(t) for t in tokens[bos:]],
            "max_model_len": _int(probe.get("max_model_len")),
        }
    return {}


def discover_sync(base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 5.0) -> EndpointInfo:
    """Ask the endpoint at `base_url` what it is; never raises for a probe the server does not answer. Synchronous,
    so a token count needed before the first call (a strategy sizing its first prompt) can have it; off the event
    loop in a thread otherwise."""
    root = base_url.rstrip("/").removesuffix("/v1")  # the server's root: the OpenAI base URL without its trailing /v1
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=timeout_s, headers=headers) as http:
        models = _ask(http, f"{base_url.rstrip('/')}/models")
        cards = [c for c in (models.get("data") if isinstance(models, dict) else None) or [] if isinstance(c, dict)]
        card = next((c for c in cards if c.get("id") == model), cards[0] if cards else {})
        owner = str(card.get("owned_by", ""))
        flavour: Flavour = {"vllm": "vllm", "llamacpp": "llama.cpp", "reasonray-simulator": "simulator"}.get(owner, "unknown")  # type: ignore[assignment]
        ids, context = [str(c.get("id")) for c in cards], _int(card.get("max_model_len"))
        props = _ask(http, f"{root}/props") if flavour in ("unknown", "llama.cpp") else None
        slots = model_path = None
        if isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict):
            flavour = "llama.cpp"
            context = _int(props["default_generation_settings"].get("n_ctx")) or _int(props.get("n_ctx")) or context
            slots = _int(props.get("total_slots"))
            model_path = props.get("model_path") if isinstance(props.get("model_path"), str) else None
        probe = _tokenize_probe(http, root, model, flavour) if flavour != "simulator" else {}
    probed, max_model_len, style = probe.pop("tokens", []), probe.pop("max_model_len", None), probe.get("tokenize_style")
    if style == "llama-cpp-python":
        flavour, slots = "llama-cpp-python", 1  # one lock around the model: it runs one request at a time
    elif style == "vllm":
        flavour = "vllm"
        context = context or max_model_len
    fields = {"base_url": base_url, "flavour": flavour, "ids": sorted(ids), "context": context, "model_path": model_path, "probe": probed}
    fingerprint = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    info = EndpointInfo(
        flavour=flavour, context_length=context, max_concurrency=slots, model_path=model_path, fingerprint=fingerprint, **probe
    )
    log.info("llm.endpoint.discovered", base_url=base_url, flavour=flavour, context_length=context, max_concurrency=slots, tokenize=style)
    return info


_CONTEXT_PATTERNS = (
    re.compile(r"context window of (\d+)"),  # llama-cpp-python
    re.compile(r"maximum context length is (\d+)"),  # vLLM, OpenAI
    re.compile(r"context size \((\d+)"),  # llama.cpp
    re.compile(r"n_ctx[^\d]{0,8}(\d+)"),
)


def context_length_in(message: str) -> int | None:
    """The context length a server's "prompt too long" error names, if it names one."""
    return next((int(match.group(1)) for pattern in _CONTEXT_PATTERNS if (match := pattern.search(message))), None)
