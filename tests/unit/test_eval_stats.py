"""The evaluation's statistics against values worked by hand: Wilson intervals, exact McNemar, the paired
bootstrap, the Pareto front, and the report's paired comparisons and Pareto plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from reasonray.evals.compare import compare, mcnemar_exact, paired_bootstrap, pareto_front
from reasonray.evals.datasets import load_dataset
from reasonray.evals.grid import Cell
from reasonray.evals.report import Prices, build_report, markdown, wilson, write_report
from reasonray.evals.runner import Record

SAMPLES = Path(__file__).resolve().parents[2] / "reasonray" / "evals" / "samples"


def test_wilson_interval_by_hand():
    # 0 of 10: centre = (z^2/2n) / (1 + z^2/n) = 0.19207 / 1.38415 = 0.13877, half-width the same: [0, 0.27753]
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.27753, abs=1e-5)
    # 5 of 10: centre 0.5; half = 1.959964 * sqrt(0.025 + 0.0096037) / 1.38415 = 0.36459 / 1.38415 = 0.26341
    low, high = wilson(5, 10)
    assert low == pytest.approx(0.5 - 0.26341, abs=1e-5) and high == pytest.approx(0.5 + 0.26341, abs=1e-5)


@pytest.mark.parametrize(
    ("only_a", "only_b", "p"),
    [
        (1, 6, 0.125),  # n = 7: 2 * (C(7,0) + C(7,1)) / 2^7 = 2 * 8 / 128
        (0, 5, 0.0625),  # 2 * 1 / 32
        (6, 1, 0.125),  # symmetric
        (3, 3, 1.0),  # 2 * 42 / 64 = 1.3125, capped at 1
        (2, 10, 2 * (1 + 12 + 66) / 4096),  # = 0.03857...
        (0, 0, 1.0),  # nothing discordant: no evidence either way
    ],
)
def test_exact_mcnemar_by_hand(only_a, only_b, p):
    assert mcnemar_exact(only_a, only_b) == pytest.approx(p, rel=1e-12)


def test_mcnemar_refuses_negative_counts():
    with pytest.raises(ValueError, match="non-negative"):
        mcnemar_exact(-1, 3)


def test_paired_bootstrap_of_identical_strategies_shows_no_difference():
    a = [True, False, True, True, False] * 10
    boot = paired_bootstrap(a, list(a))
    assert (boot.difference, boot.ci_low, boot.ci_high, boot.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_paired_bootstrap_of_a_strategy_right_wherever_the_other_is_wrong():
    boot = paired_bootstrap([True] * 50, [False] * 50, resamples=999)
    # every resample's difference is 1: no resample lies on the other side of 0, so p is below the resolution 1/999
    assert (boot.difference, boot.ci_low, boot.ci_high) == (1.0, 1.0, 1.0) and boot.at_floor and boot.resamples == 999


def test_paired_bootstrap_against_its_exact_distribution():
    # differences per example [1, 0]: a resample of 2 has mean 0 with probability 1/4, 1/2 with 1/2, 1 with 1/4;
    # P(mean <= 0) = 1/4, so the two-sided p-value tends to 2 * 1/4 = 0.5, the interval to [0, 1]
    boot = paired_bootstrap([True, False], [False, False], resamples=20_000, seed=3)
    assert boot.difference == 0.5
    assert boot.p_value == pytest.approx(0.5, abs=0.02)
    assert (boot.ci_low, boot.ci_high) == (0.0, 1.0)


def test_paired_bootstrap_is_seeded_and_checks_its_input():
    a, b = [True, False, True, False, True], [False, False, True, True, False]
    assert paired_bootstrap(a, b, seed=7) == paired_bootstrap(a, b, seed=7)
    with pytest.raises(ValueError, match="differ in length"):
        paired_bootstrap(a, b[:3])
    with pytest.raises(ValueError, match="no paired examples"):
        paired_bootstrap([], [])


def test_compare_pairs_by_example_and_seed_only():
    a = {("q1", 0): True, ("q2", 0): True, ("q3", 0): False, ("q4", 0): True, ("only-a", 0): True}
    b = {("q1", 0): True, ("q2", 0): False, ("q3", 0): False, ("q4", 0): False, ("only-b", 0): False}
    c = compare("A", a, "B", b)
    assert (c.paired, c.both, c.only_a, c.only_b, c.neither) == (4, 1, 2, 0, 1)
    assert c.mcnemar_p == pytest.approx(0.5)  # n = 2: 2 * 1 / 4
    assert c.difference == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no example in common"):
        compare("A", {("x", 0): True}, "B", {("y", 0): True})


def test_pareto_front_keeps_the_non_dominated_points_by_cost():
    points = [(100, 0.5), (300, 0.5), (50, 0.2), (400, 0.7), (400, 0.6), (100, 0.5)]
    # (300, .5) is beaten by (100, .5); (400, .6) by (400, .7); the two equal (100, .5) points both stay
    assert pareto_front(points) == [2, 0, 5, 3]
    assert pareto_front([]) == []


def _record(example: str, strategy: str, correct: bool, tokens: int, status: str = "ok") -> Record:
    return Record(
        example_id=example,
        strategy=strategy,
        config_name="default",
        seed=0,
        status=status,
        correct=correct,
        prompt_tokens=tokens,
        completion_tokens=0,
        llm_calls=1,
        latency_ms=10.0,
    )


def test_report_has_paired_comparisons_pareto_front_and_plot(tmp_path):
    cells = [Cell("chain_of_thought", "default", 0), Cell("self_consistency", "default", 0), Cell("refine", "default", 0)]
    right = {"chain_of_thought": [1, 1, 0, 0, 1, 0], "self_consistency": [1, 1, 1, 1, 1, 0], "refine": [1, 0, 0, 0, 0, 0]}
    tokens = {"chain_of_thought": 100, "self_consistency": 500, "refine": 900}
    records = [
        _record(f"q{i}", strategy, bool(flag), tokens[strategy], status="error" if strategy == "refine" and i == 5 else "ok")
        for strategy, flags in right.items()
        for i, flag in enumerate(flags)
    ]
    meta = {"dataset": {"name": "t", "examples": 6, "path": "t.jsonl", "kind": "gsm8k", "digest": "x"}, "model": "m", "seeds": [0]}
    meta["memory"] = False
    report = build_report(records, cells, meta, Prices())
    pairs = {(c["a"], c["b"]): c for c in report["comparisons"]}
    cot_sc = pairs[("chain_of_thought/default", "self_consistency/default")]
    assert (cot_sc["both"], cot_sc["only_a"], cot_sc["only_b"], cot_sc["neither"]) == (3, 0, 2, 1)
    assert cot_sc["mcnemar_p"] == 0.5 and cot_sc["difference"] == pytest.approx(-2 / 6, abs=1e-6)
    assert len(pairs) == 3
    # refine costs most and is least accurate: off the front
    assert report["pareto_front"] == ["chain_of_thought/default", "self_consistency/default"]
    text = markdown(report)
    assert "## Paired comparisons" in text and "| chain_of_thought/default | self_consistency/default | 6 | 3 | 0 | 2 | 0.5 |" in text
    paths = write_report(report, tmp_path)
    assert paths["pareto_plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(paths["json"].read_text())["pareto_front"] == report["pareto_front"]


def test_the_shipped_arithmetic_set():
    dataset = load_dataset(SAMPLES / "arithmetic.jsonl")
    assert dataset.kind == "gsm8k" and len(dataset.examples) == 60
    for example in dataset.examples:
        a, op, b = example.query.removeprefix("What is ").removesuffix("?").split()
        assert int(example.reference) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
        assert 1 <= int(a) <= 9 and 1 <= int(b) <= 9
    assert len({e.query for e in dataset.examples}) == 60
    assert math.isclose(sum(e.query.count("+") for e in dataset.examples), 30)


async def test_an_evaluation_through_a_client_records_what_the_service_answered(tmp_path):
    """`reasonray eval --url` and the notebook drive the run through reasonray's client: here an in-process one
    over an application on the simulated model, which does the arithmetic itself (so every record is
    correct); a strategy the service does not serve is a classified error record."""
    from reasonray.api.app import build_application
    from reasonray.api.surfaces.local_http import in_process_client
    from reasonray.evals.run import EvalOptions, run_async
    from reasonray.gateway.simulator.engine import SimulatedModel
    from reasonray.gateway.simulator.inprocess import SimulatedLLM
    from reasonray.gateway.tokens import counter_for_model
    from reasonray.kernel.config import Settings

    model = SimulatedModel(counter_for_model("simulated"))  # it works out "What is A + B?" itself
    settings = Settings.model_validate(
        {"reasoning": {"enabled_strategies": ["chain_of_thought", "self_consistency"], "default_strategy": "chain_of_thought"}}
    )
    app = build_application(settings, llm=SimulatedLLM(model), data_dir=None)
    async with in_process_client(app.dispatcher) as rr:
        options = EvalOptions(
            dataset=SAMPLES / "arithmetic.jsonl",
            strategies=["chain_of_thought", "self_consistency", "refine"],
            configs=['self_consistency:three={"samples": 3}'],
            limit=4,
            out=tmp_path / "run",
            client=rr,
            concurrency=2,
            progress=False,
        )
        report = await run_async(options)
    rows = {row["group"]: row for row in report["rows"]}
    assert rows["chain_of_thought/default"]["correct"] == 4 and rows["self_consistency/three"]["correct"] == 4
    assert rows["self_consistency/three"]["llm_calls_per_example"] == 3
    assert rows["refine/default"]["errors"] == 4  # not enabled on that service: strategy_unavailable
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    refused = [r for r in records if r["strategy"] == "refine"]
    assert {(r["status"], r["error_code"], r["error_type"]) for r in refused} == {("error", -32002, "strategy_unavailable")}
    assert all(r["trace_id"] for r in records)
    assert report["simulated"] is True and report["model"] == "simulated"
    pairs = {(c["a"], c["b"]) for c in report["comparisons"]}
    assert ("chain_of_thought/default", "self_consistency/three") in pairs
    assert (tmp_path / "run" / "pareto.png").exists()


def test_an_evaluation_url_must_be_http_and_a_memory_study_needs_memory(tmp_path):
    from reasonray.evals.run import EvalError, EvalOptions, prepare

    base = {"dataset": SAMPLES / "arithmetic.jsonl", "strategies": ["chain_of_thought"], "out": tmp_path}
    with pytest.raises(EvalError, match="not an http"):
        prepare(EvalOptions(**base, url="127.0.0.1:8000"))
    with pytest.raises(EvalError, match="--memory"):
        prepare(EvalOptions(**base, url="http://127.0.0.1:8000", memory_study=True))
    with pytest.raises(EvalError, match="--url"):  # placebo memories are stored through a service
        prepare(EvalOptions(**base, memory=True, memory_study=True, placebo=True))
    _, _, cells = prepare(EvalOptions(**base, url="http://127.0.0.1:8000", memory=True, memory_study=True, orders=3))
    # both arms on each of three stream orders, each cell its own workspace
    assert sorted((c.arm, c.order) for c in cells) == [(arm, o) for arm in ("off", "on") for o in range(3)]
    assert len({c.workspace for c in cells}) == 6
