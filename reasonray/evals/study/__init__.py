"""The published study configs (`real.toml`) as evaluation options: what `make eval-real`, the command below
and notebooks/real_model_eval.ipynb all run, so the three cannot drift apart.

    python -m reasonray.evals.study --url http://127.0.0.1:18765 --out runs/eval-real            # every part
    python -m reasonray.evals.study --url http://127.0.0.1:18765 --out runs/eval-real --part memory

Each part writes to OUT/PART (results.jsonl, report.md, report.json, plots, run.json); a rerun resumes what is
not done and regenerates every table and plot from results.jsonl. OUT/SUMMARY.md gathers the parts' reports.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import click

from reasonray.evals.run import EvalOptions, run_async

STUDY = Path(__file__).with_name("real.toml")
PART_KEYS = {"dataset", "strategies", "configs", "budgets", "call_caps", "memory", "memory_study", "placebo", "orders", "seeds"}


def load_study(path: Path = STUDY) -> dict[str, Any]:
    """The study file: its [study] header and its [parts.NAME] tables, in file order."""
    study = tomllib.loads(path.read_text(encoding="utf-8"))
    for name, part in study.get("parts", {}).items():
        unknown = set(part) - PART_KEYS
        if unknown:
            raise ValueError(f"{path}: part {name!r} has unknown keys {sorted(unknown)}; known: {sorted(PART_KEYS)}")
    return study


def part_options(
    name: str, out: Path, *, url: str | None = None, client: Any = None, study: dict[str, Any] | None = None, **extra: Any
) -> EvalOptions:
    """The evaluation options of one part, writing to `out / name`, over HTTP to `url` or through `client`."""
    parts = (study or load_study())["parts"]
    if name not in parts:
        raise KeyError(f"no part {name!r}; the study has {', '.join(parts)}")
    part = parts[name]
    return EvalOptions(
        dataset=Path(part["dataset"]),
        strategies=list(part["strategies"]),
        out=out / name,
        configs=list(part.get("configs", [])),
        seeds=list(part.get("seeds", [0])),
        budgets=list(part.get("budgets", [])),
        call_caps=dict(part.get("call_caps", {})),
        memory=bool(part.get("memory", False)),
        memory_study=bool(part.get("memory_study", False)),
        placebo=bool(part.get("placebo", False)) and (url is not None or client is not None),
        orders=int(part.get("orders", 1)),
        url=url,
        client=client,
        use_ray=False,
        concurrency=1,  # the model server answers one request at a time: more in flight only queues there
        **extra,
    )


def after_pilot(study: dict[str, Any], accuracy: float) -> dict[str, Any]:
    """The study with the pilot's rule applied: when the pilot's accuracy lies outside [study] band, every part
    on the primary family runs on the fallback family instead (same n and seed)."""
    header = study.get("study", {})
    low, high = header.get("band", [0.0, 1.0])
    primary, fallback = header.get("primary_family"), header.get("fallback_family")
    if low <= accuracy <= high or not primary or not fallback:
        return study
    parts = {
        name: {**part, "dataset": part["dataset"].replace(f"gen:{primary}?", f"gen:{fallback}?")} if name != "pilot" else part
        for name, part in study["parts"].items()
    }
    return {**study, "parts": parts}


def summary(out: Path, names: list[str], seconds: dict[str, float]) -> Path:
    """OUT/SUMMARY.md: every part's report, with its wall time."""
    lines = ["# Real-model study: results", ""]
    for name in names:
        report = out / name / "report.md"
        lines += [f"## Part {name} ({seconds.get(name, 0.0) / 60:.1f} min this run)", ""]
        lines += [report.read_text(encoding="utf-8") if report.exists() else "(not run)", ""]
    path = out / "SUMMARY.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@click.command()
@click.option("--url", required=True, help="The running service, e.g. http://127.0.0.1:18765 (reasonray serve --llm local).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Output directory; a part per folder.")
@click.option("--part", "parts", multiple=True, help="Run only these parts (repeatable); default: every part in file order.")
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True, help="Seconds to wait for one example.")
def main(url: str, out: Path, parts: tuple[str, ...], timeout_s: float) -> None:
    """Run the published real-model study (reasonray/evals/study/real.toml) against a running service."""
    study = load_study()
    names = list(parts) or list(study["parts"])
    pilot = out / "pilot" / "report.json"
    if "pilot" not in names and pilot.exists():  # a part run alone still follows the pilot's rule
        study = after_pilot(study, json.loads(pilot.read_text())["rows"][0]["accuracy"])
    seconds: dict[str, float] = {}
    failed = 0
    for name in names:
        started = time.perf_counter()
        click.echo(f"part {name}: starting")
        report = asyncio.run(run_async(part_options(name, out, url=url, study=study, timeout_s=timeout_s, progress=True), echo=click.echo))
        seconds[name] = time.perf_counter() - started
        failed += len(report["failed"])
        if name == "pilot":  # the rule fixed in advance: the family must leave the model partly right
            study = after_pilot(study, report["rows"][0]["accuracy"])
        click.echo(f"part {name}: {seconds[name] / 60:.1f} min, report {report['paths']['markdown']}")
    click.echo(f"summary: {summary(out, names, seconds)}; total {sum(seconds.values()) / 60:.1f} min")
    if failed:
        click.echo(f"error: {failed} example(s) failed (a rerun retries them)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
