"""The evaluation grid: strategies x named configs x seeds, each combination a `Cell`.

`--config NAME=JSON` adds a config for every strategy; `--config STRATEGY:NAME=JSON` for one. A
strategy with no config of its own runs its `default` ({}: the server's defaults). The seed goes
into the config of strategies that take one (`seed` in their config schema), so seeds make
different, repeatable runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from reasonray.kernel.errors import InvalidParamsError, ReasonRayError
from reasonray.strategies.registry import Catalogue


class GridError(InvalidParamsError, ValueError):
    """The grid cannot run: the message names the option and how to fix it (still a ValueError, as
    callers written before the one error tree catch it)."""


def cell_key(strategy: str, config_name: str, seed: int) -> str:
    """Names a cell in results.jsonl, run.json and the report: `strategy/config/seed=N`."""
    return f"{strategy}/{config_name}/seed={seed}"


@dataclass(frozen=True)
class Cell:
    strategy: str
    config_name: str
    seed: int
    config: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def key(self) -> str:
        return cell_key(self.strategy, self.config_name, self.seed)

    @property
    def group(self) -> str:
        """Seeds pooled: the row of the report."""
        return f"{self.strategy}/{self.config_name}"

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
        try:
            config = json.loads(body)
        except json.JSONDecodeError as exc:
            raise GridError(f"--config {option!r}: the config is not valid JSON ({exc.msg})") from None
        if not isinstance(config, dict):
            raise GridError(f"--config {option!r}: the config must be a JSON object")
        parsed.setdefault(strategy or None, {})[name] = config
    return parsed


def build_grid(
    catalogue: Catalogue, strategies: list[str], configs: dict[str | None, dict[str, dict[str, Any]]], seeds: list[int]
) -> list[Cell]:
    """Every cell, validated against the catalogue before anything runs."""
    if not strategies:
        raise GridError("--strategies names no strategy; e.g. --strategies chain_of_thought,self_consistency")
    if not seeds:
        raise GridError("--seeds names no seed; e.g. --seeds 0 or --seeds 0,1,2")
    unknown = set(configs) - {None} - set(strategies)
    if unknown:
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
        for name, config in named.items():
            for seed in seeds:
                full = {**config, "seed": seed} if takes_seed else dict(config)
                try:
                    catalogue.resolve(strategy, full)
                except ReasonRayError as exc:
                    raise GridError(f"--config {name} for {strategy}: {exc}") from None
                cells.append(Cell(strategy, name, seed, full))
    return cells
