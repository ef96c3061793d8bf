"""The published real-model study (docs/evaluation.md, "Results"): every committed report is what the analysis code
computes from the committed raw results, so a reader who recomputes a figure gets the one the page shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reasonray.evals.report import Prices, build_report
from reasonray.evals.run import prepare
from reasonray.evals.runner import ResultLog
from reasonray.evals.study import PILOT, after_pilot, load_study, part_options, pilot_accuracies

RUNS = Path(__file__).parents[2] / "docs" / "evaluation-runs" / "2026-11-28-comparisons"
PARTS = ["pilot_comparisons", "budgets_a", "budgets_b", "memory", "matts", "running_sums", "adaptive"]
META = ("dataset", "model", "simulator_skill", "seeds", "memory", "memory_study", "budgets", "provenance", "cluster", "ran")


def _study() -> dict:
    pilots = {p.name: json.loads((p / "report.json").read_text()) for p in RUNS.glob(f"{PILOT}*")}
    return after_pilot(load_study(), pilot_accuracies(pilots))


@pytest.mark.parametrize("part", PARTS)
def test_a_published_report_is_recomputed_from_its_raw_results(part, tmp_path):
    published = json.loads((RUNS / part / "report.json").read_text())
    _, dataset, cells = prepare(part_options(part, tmp_path, url="http://127.0.0.1:1", study=_study()))
    records = ResultLog(RUNS / part / "results.jsonl").select(dataset.examples, cells)
    assert len(records) == len(dataset.examples) * len(cells)  # every example of every cell ran: nothing left out
    again = build_report(records, cells, {k: published.get(k) for k in META}, Prices(), dataset.examples)
    for key in ("rows", "comparisons", "baselines", "pareto_front", "non_inferiority", "learning_curves", "k_curves"):
        assert again[key] == published[key], key


def test_the_pilots_chose_the_family_every_primary_part_ran_on():
    study = _study()
    for part in ("budgets_a", "memory", "matts", "adaptive"):
        ran = json.loads((RUNS / part / "run.json").read_text())["dataset"]
        assert ran == study["parts"][part]["dataset"] and ran.startswith("gen:comparisons?")
