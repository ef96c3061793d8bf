"""The evaluation scorers and runner over the full shared datasets (about 10 s in all).

tests/unit/test_evals.py checks them on samples; this checks them on every example: all 164 HumanEval
canonical solutions pass their tests in the sandbox (and a wrong body fails them), every GSM8K
reference answer is read back as correct (and a wrong number is not), and a whole-set simulated
evaluation of GSM8K finishes with every example recorded and the accuracy the simulated skill predicts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from reasonray.evals.datasets import load_dataset
from reasonray.evals.run import EvalOptions, run_async
from reasonray.evals.scoring import score_gsm8k, score_humaneval

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"
GSM8K, HUMANEVAL = SHARED / "gsm8k_test.jsonl", SHARED / "humaneval.jsonl.gz"


@pytest.mark.slow  # 328 sandboxed runs, about two minutes here
async def test_every_humaneval_canonical_solution_passes_in_the_sandbox_and_a_stub_fails():
    examples = load_dataset(HUMANEVAL).examples
    assert len(examples) == 164
    gate = asyncio.Semaphore(2)  # one sandboxed interpreter per core

    async def check(example):
        async with gate:
            right = await score_humaneval(f"```python\n{example.reference}\n```", example)
            wrong = await score_humaneval("    return None\n", example)  # a body completed from the prompt
            return example.id, right, wrong

    results = await asyncio.gather(*(check(e) for e in examples))
    failed = [(i, r.detail) for i, r, _ in results if not r.correct]
    assert not failed, f"canonical solutions failing in the sandbox: {failed[:5]}"
    assert [i for i, _, w in results if w.correct] == []  # the tests reject a body that returns nothing


def test_every_gsm8k_reference_answer_scores_as_correct_and_a_wrong_number_does_not():
    examples = load_dataset(GSM8K).examples
    assert len(examples) == 1319
    for example in examples:
        assert score_gsm8k(f"<thinking>...</thinking> The answer is {example.reference}.", example).correct, example.id
        assert not score_gsm8k(f"The answer is {example.reference}1.", example).correct, example.id


async def test_a_whole_set_simulated_gsm8k_evaluation_records_every_example(tmp_path):
    skill = 0.7
    report = await run_async(
        EvalOptions(
            dataset=GSM8K, strategies=["chain_of_thought"], out=tmp_path, use_ray=False, progress=False, sim_skill=skill, concurrency=16
        )
    )
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 1319 and len({r["example_id"] for r in lines}) == 1319
    assert all(r["status"] == "ok" and r["simulated"] for r in lines)
    [row] = report["rows"]
    assert row["examples"] == 1319 and row["errors"] == 0
    assert row["ci_low"] <= skill <= row["ci_high"]  # the simulated model is right with probability `skill`
    assert "SIMULATED" in (tmp_path / "report.md").read_text()
