"""Caps on what one request may ask of the service (`[limits]`, docs/security.md).

Strategies bound their own parameters by schema (what is possible); these caps are the operator's
(what this deployment allows), checked on the resolved config, after agent and server defaults are
merged, so no level can exceed them. A violation is an InvalidParamsError (-32602) naming the
parameter, the cap and the config key that sets it.
"""

from __future__ import annotations

from typing import Any

from reasonray.kernel.config import CapSettings
from reasonray.kernel.errors import InvalidParamsError

# strategy config key -> the [limits] key capping it
KEY_CAPS = {
    "samples": "max_samples",
    "k": "max_samples",
    "max_nodes": "max_tree_nodes",
    "votes": "max_tree_votes",
    "max_iterations": "max_iterations",
    "max_tool_calls": "max_iterations",
    "chunk_size": "max_tokens",
}
INNER_WORK = ("samples", "max_iterations", "max_tool_calls", "max_nodes")  # the first a config sets is its calls per run


def cap_error(what: str, value: int, key: str, cap: int) -> InvalidParamsError:
    return InvalidParamsError(
        f"invalid params: {what} is {value}; the cap is {cap} ([limits] {key} in config.toml)",
        {"cap": f"limits.{key}", "limit": cap, "value": value},
    )


def check_text(what: str, text: str, limits: CapSettings) -> None:
    if len(text) > limits.max_query_chars:
        raise cap_error(f"{what} length", len(text), "max_query_chars", limits.max_query_chars)


def check_strategy_config(strategy: str, config: dict[str, Any], limits: CapSettings) -> None:
    """Raise for the first parameter above its cap; MaTTS is checked on k x its base strategy's work too."""
    for name, value in config.items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        key = KEY_CAPS.get(name) or ("max_tokens" if name.endswith("max_tokens") else None)
        if key is not None and value > getattr(limits, key):
            raise cap_error(f"{strategy}.{name}", value, key, getattr(limits, key))
    base = config.get("base_config")
    if isinstance(base, dict):
        check_strategy_config(str(config.get("base_strategy", "base")), base, limits)
        k = config.get("k", 1) if isinstance(config.get("k", 1), int) else 1
        # calls one run of the base strategy may make, roughly: its samples, iterations or tool calls
        inner = next((max(1, v) for name in INNER_WORK if isinstance(v := base.get(name), int) and not isinstance(v, bool)), 1)
        work = k * inner
        if work > limits.max_matts_work:
            raise cap_error(f"{strategy} k x inner runs", work, "max_matts_work", limits.max_matts_work)
