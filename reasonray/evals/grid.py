"""The evaluation grid: strategies x named configs x seeds, each combination a `Cell`.

`--config NAME=JSON` adds a config for every strategy; `--config STRATEGY:NAME=JSON` for one. A
strategy with no config of its own runs its `default` ({}: the server's defaults). The seed goes
into the config of strategies that take one (`seed` in their config schema), so seeds make
different, repeatable runs. `--budgets` adds an axis of per-call token budgets (`BUDGET_FIELDS` says which
config fields each strategy's budget sets); a memory study adds arms (memory on and off) and stream orders.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from reasonray.evals.datasets import json_object
from reasonray.kernel.errors import InvalidParamsError, ReasonRayError
from reasonray.strategies.registry import Catalogue


class GridError(InvalidParamsError, ValueError):
    """The grid cannot run: the message names the option and how to fix it (still a ValueError, as
    callers written before the one error tree catch it)."""


def cell_key(strategy: str, config_name: str, seed: int, arm: str = "", order: int = 0) -> str:
    """Names a cell in results.jsonl, run.json and the report: `strategy/config/seed=N`, and for an arm of a
    memory study `strategy/config/seed=N/memory=ARM/order=K`."""
    key = f"{strategy}/{config_name}/seed={seed}"
    return f"{key}/memory={arm}/order={order}" if arm else key


@dataclass(frozen=True)
class Cell:
    strategy: str
    config_name: str
    seed: int
    config: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    arm: str = ""  # memory study: "on" (learns), "off" (no memory) or "placebo" (placebo memories); "" outside one
    order: int = 0  # memory study: the seed of the stream's order of the examples
    budget: int | None = None  # per-call token cap: every call's max_tokens at most this (None: the config's own limits)

    @property
    def key(self) -> str:
        return cell_key(self.strategy, self.config_name, self.seed, self.arm, self.order)

    @property
    def group(self) -> str:
        """Seeds (and stream orders) pooled: the row of the report."""
        base = f"{self.strategy}/{self.config_name}"
        return f"{base}/memory={self.arm}" if self.arm else base

    @property
    def workspace(self) -> str:
        """The memory workspace of a memory-aware cell: its own, so cells never learn from each other."""
        return "eval-" + hashlib.sha256(self.key.encode()).hexdigest()[:12]


def parse_configs(options: tuple[str, ...] | list[str]) -> dict[str | None, dict[str, dict[str, Any]]]:
    """`[STRATEGY:]NAME=JSON` options as {strategy or None: {name: config}}."""
    parsed: dict[str | None, dict[str, dict[str, Any]]] = {}
    for option in options:
        head, sep, body = option.partition("=")
        if not sep or not head:
            raise GridError(f"--config {option!r}: write NAME=JSON or STRATEGY:NAME=JSON, e.g. greedy='{{\"temperature\": 0}}'")
        strategy, _, name = head.rpartition(":")
        parsed.setdefault(strategy or None, {})[name] = json_object(body, GridError, f"--config {option!r}: the config")
    return parsed


# The budget axis: a budget B is each call's token limit, set in each strategy's own config fields (each field to
# max(floor, B)) and sent as the request's `budget.max_output_tokens`, which caps every call of the run (judges,
# iterations, tool steps). Floors are the strategies' own minimums (their schemas refuse less). MaTTS passes B on
# to its base strategy's config. Bounded context has no per-call field: an iteration generates what its chunk
# leaves, so the request's cap is what holds it to B (its chunk must leave room for the prompt and carryover: set
# chunk_size in its config).
BUDGET_FIELDS: dict[str, dict[str, int]] = {
    "chain_of_thought": {"max_tokens": 1},
    "self_consistency": {"max_tokens": 1},
    "refine": {"max_tokens": 1, "evaluate_max_tokens": 16},
    "tree_of_thought": {"max_tokens": 16},
    "react": {"max_tokens": 16},
    "matts": {"judge_max_tokens": 16},
    "bounded_context": {},
}


def with_budget(strategy: str, config: dict[str, Any], budget: int) -> dict[str, Any]:
    """`config` with `strategy`'s token limits set from `budget` (overriding the config's own)."""
    if budget < 1:
        raise GridError(f"--budgets: a budget is a positive number of tokens, got {budget}")
    fields = BUDGET_FIELDS.get(strategy)
    if fields is None:
        raise GridError(f"--budgets: no budget mapping for strategy {strategy!r}; known: {', '.join(sorted(BUDGET_FIELDS))}")
    limited = {**config, **{name: max(floor, budget) for name, floor in fields.items()}}
    if strategy == "matts":
        limited["base_config"] = {**config.get("base_config", {}), "max_tokens": budget}
    return limited


MEMORY_ARMS = ("on", "off", "placebo")


def build_grid(
    catalogue: Catalogue,
    strategies: list[str],
    configs: dict[str | None, dict[str, dict[str, Any]]],
    seeds: list[int],
    *,
    budgets: list[int] | None = None,
    arms: tuple[str, ...] = (),
    orders: int = 1,
    call_caps: dict[str, int] | None = None,
) -> list[Cell]:
    """Every cell, validated against the catalogue before anything runs. With `budgets`, every config runs
    at every budget (named `NAME@B`); `call_caps` caps a strategy's every call without changing its config (also
    named `NAME@B`; e.g. bounded context's iterations); with memory `arms`, every cell runs once per arm and
    stream order."""
    call_caps = call_caps or {}
    if budgets and call_caps:
        raise GridError("--budgets and per-strategy call caps both set the per-call cap; give one of them")
    if set(call_caps) - set(strategies):
        raise GridError(f"call caps name strategies not in --strategies: {', '.join(sorted(set(call_caps) - set(strategies)))}")
    if orders < 1:
        raise GridError(f"--orders must be at least 1, got {orders}")
    if set(arms) - set(MEMORY_ARMS):
        raise GridError(f"memory arms are {', '.join(MEMORY_ARMS)}; got {', '.join(arms)}")
    if not strategies:
        raise GridError("--strategies names no strategy; e.g. --strategies chain_of_thought,self_consistency")
    if not seeds:
        raise GridError("--seeds names no seed; e.g. --seeds 0 or --seeds 0,1,2")
    if unknown := set(configs) - {None} - set(strategies):
        raise GridError(f"--config names strategies not in --strategies: {', '.join(sorted(unknown))}")
    cells = []
    for strategy in dict.fromkeys(strategies):
        named = {**configs.get(None, {}), **configs.get(strategy, {})} or {"default": {}}
        try:
            entry = catalogue.entries[catalogue.choose(strategy)[0]]
        except ReasonRayError as exc:
            raise GridError(f"--strategies: {exc}") from None
        takes_seed = "seed" in entry.strategy.get_config_schema().get("properties", {})
        if len(seeds) > 1 and not takes_seed:
            raise GridError(
                f"strategy {strategy!r} takes no seed: its runs at seeds {seeds} would be the same; give it one seed or leave it out"
            )
        variants = [  # a budget sets the config's limits; a call cap (never both) leaves the config as it is
            (f"{name}@{cap}" if cap is not None else name, with_budget(strategy, config, cap) if budgets else config, cap)
            for name, config in named.items()
            for cap in budgets or [call_caps.get(strategy)]
        ]
        for name, config, budget in variants:
            for seed in seeds:
                full = {**config, "seed": seed} if takes_seed else dict(config)
                try:
                    catalogue.resolve(strategy, full)
                except ReasonRayError as exc:
                    raise GridError(f"--config {name} for {strategy}: {exc}") from None
                for arm in arms or ("",):  # outside a memory study: one cell, in the dataset's order
                    cells += [
                        Cell(strategy, name, seed, full, arm=arm, order=order, budget=budget) for order in range(orders if arm else 1)
                    ]
    return cells
