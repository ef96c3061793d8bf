"""The published study configs (`real.toml`) as evaluation options: what `make eval-real`, the command below
and notebooks/real_model_eval.ipynb all run, so the three cannot drift apart.

    python -m reasonray.evals.study --url http://127.0.0.1:18765 --out runs/eval-real            # every part
    python -m reasonray.evals.study --url http://127.0.0.1:18765 --out runs/eval-real --part memory

Each part writes to OUT/PART (results.jsonl, report.md, report.json, plots, run.json); a rerun resumes what is
not done and regenerates every table and plot from results.jsonl. OUT/SUMMARY.md gathers the parts' reports.
"""

from __future__ import annotations

import asyncio
import copy
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
        if unknown := set(part) - PART_KEYS:
            raise ValueError(f"{path}: part {name!r} has unknown keys {sorted(unknown)}; known: {sorted(PART_KEYS)}")
    return study


def part_options(
    name: str, out: Path, *, url: str | None = None, client: Any = None, study: dict[str, Any] | None = None, **extra: Any
) -> EvalOptions:
    """The evaluation options of one part, writing to `out / name`, over HTTP to `url` or through `client`."""
    parts = (study or load_study())["parts"]
    if name not in parts:
        raise KeyError(f"no part {name!r}; the study has {', '.join(parts)}")
    part = copy.deepcopy(parts[name])  # the other keys are EvalOptions' fields of the same names, with its defaults
    return EvalOptions(
        dataset=Path(part.pop("dataset")),
        out=out / name,
        placebo=bool(part.pop("placebo", False)) and (url is not None or client is not None),
        **part,
        url=url,
        client=client,
        use_ray=False,
        concurrency=1,  # the model server answers one request at a time: more in flight only queues there
        **extra,
    )


PILOT = "pilot_"  # parts named pilot_FAMILY: chain of thought on each candidate family, on the pilot's own seed


def pilot_accuracies(reports: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each piloted family's chain-of-thought accuracy, from the pilot parts' reports."""
    return {name.removeprefix(PILOT): r["rows"][0]["accuracy"] for name, r in reports.items() if name.startswith(PILOT)}


def choose_family(study: dict[str, Any], accuracies: dict[str, float]) -> str:
    """The rule fixed in advance: of the piloted families, the one whose accuracy lies inside [study] band and nearest
    its middle (the model partly right); when none lies inside, the nearest to the middle all the same. Ties go to the
    family listed first."""
    low, high = study.get("study", {}).get("band", [0.0, 1.0])
    middle = (low + high) / 2
    ranked = sorted(accuracies, key=lambda f: (not low <= accuracies[f] <= high, abs(accuracies[f] - middle)))
    return ranked[0]


def after_pilot(study: dict[str, Any], accuracies: dict[str, float]) -> dict[str, Any]:
    """The study with the pilot's rule applied: every part on the primary family runs on the chosen family instead
    (same n and seed); pilots and parts on other families stay as they are."""
    primary = study.get("study", {}).get("primary_family")
    chosen = choose_family(study, accuracies) if accuracies else primary
    if not primary or chosen == primary:
        return study
    parts = {
        name: part if name.startswith(PILOT) else {**part, "dataset": part["dataset"].replace(f"gen:{primary}?", f"gen:{chosen}?")}
        for name, part in study["parts"].items()
    }
    return {**study, "parts": parts}


def summary(out: Path, names: list[str], seconds: dict[str, float], accuracies: dict[str, float] | None = None) -> Path:
    """OUT/SUMMARY.md: the family the pilots chose, then every part's report with its wall time."""
    lines = ["# Real-model study: results", ""]
    if accuracies:
        shown = ", ".join(f"{family} {accuracy:.1%}" for family, accuracy in accuracies.items())
        chosen = choose_family(load_study(), accuracies)
        lines += [f"Pilots (chain of thought): {shown}; every part on the primary family ran on **{chosen}**.", ""]
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
    reports: dict[str, dict[str, Any]] = {}
    for name in study["parts"]:  # a part run without its pilots still follows the pilots' rule
        pilot = out / name / "report.json"
        if name.startswith(PILOT) and name not in names and pilot.exists():
            reports[name] = json.loads(pilot.read_text())
    seconds: dict[str, float] = {}
    for name in names:
        if not name.startswith(PILOT):
            study = after_pilot(study, pilot_accuracies(reports))
        started = time.perf_counter()
        click.echo(f"part {name}: starting ({study['parts'].get(name, {}).get('dataset')})")
        reports[name] = asyncio.run(
            run_async(part_options(name, out, url=url, study=study, timeout_s=timeout_s, progress=True), echo=click.echo)
        )
        seconds[name] = time.perf_counter() - started
        click.echo(f"part {name}: {seconds[name] / 60:.1f} min, report {reports[name]['paths']['markdown']}")
    click.echo(f"summary: {summary(out, names, seconds, pilot_accuracies(reports))}; total {sum(seconds.values()) / 60:.1f} min")
    if failed := sum(len(reports[name]["failed"]) for name in names):
        click.echo(f"error: {failed} example(s) failed (a rerun retries them)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
