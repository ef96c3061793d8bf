"""Batch evaluation: datasets, scorers, the grid, the runner (resume, failures, memory streams), the report.

Runs in-process against the simulated model; the Ray job path is tests/cluster/test_cluster_commands.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from reasonray.api.jsonrpc import error_for
from reasonray.api.service import ReasoningService
from reasonray.cli import main as reasonray_main
from reasonray.evals.datasets import DatasetError, load_dataset
from reasonray.evals.grid import GridError, build_grid, parse_configs
from reasonray.evals.report import (
    Prices,
    build_report,
    percentile,
    wilson,
    write_report,
)
from reasonray.evals.run import EvalError, EvalOptions, run_async
from reasonray.evals.run import main as eval_main
from reasonray.evals.runner import InProcessEngine, ResultLog, run_grid
from reasonray.evals.scoring import (
    extract_code,
    extract_number,
    score_gsm8k,
    score_humaneval,
)
from reasonray.gateway.errors import ProviderUnavailableError
from reasonray.gateway.simulator.engine import SimulatedModel
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.tokens import counter_for_model
from reasonray.kernel.config import MemorySettings, ReasoningSettings
from reasonray.kernel.sandbox import SandboxLimits
from reasonray.strategies.registry import StrategyRegistry, build_catalogue
from tests.unit.memory_harness import local_memory, make_bank

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"
ALL = ["chain_of_thought", "self_consistency", "tree_of_thought", "react", "bounded_context", "refine", "matts"]


def gsm8k_file(path: Path, count: int = 6) -> Path:
    """A GSM8K-style sample of our own making: arithmetic word problems with their answers after ####."""
    lines = []
    for i in range(count):
        a, b = 3 + i, 7 + 2 * i
        lines.append(
            json.dumps(
                {
                    "question": f"Sam packs {a} boxes with {b} apples in each box for the market stall number {i}. How many apples does Sam pack?",
                    "answer": f"Sam packs {a} * {b} = <<{a}*{b}={a * b}>>{a * b} apples.\n#### {a * b:,}",
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def catalogue():
    return build_catalogue(StrategyRegistry().discover(), ReasoningSettings(enabled_strategies=ALL))


def service_with_key(examples, skill=1.0, memory=None, llm=None) -> ReasoningService:
    model = SimulatedModel(counter_for_model("simulated"))
    model.add_answers({e.key: e.reference for e in examples}, skill)
    llm = llm or SimulatedLLM(model)
    return ReasoningService(
        catalogue(), llm, counter_for_model("simulated"), memory=memory, memory_settings=MemorySettings(min_similarity=0.0)
    )


# -- datasets --------------------------------------------------------------------------------------


def test_gsm8k_sample_is_read_with_the_final_answer_after_the_hashes(tmp_path):
    dataset = load_dataset(gsm8k_file(tmp_path / "g.jsonl"), limit=4, offset=1)
    assert dataset.kind == "gsm8k"
    assert [e.id for e in dataset.examples] == ["gsm8k-2", "gsm8k-3", "gsm8k-4", "gsm8k-5"]
    assert dataset.examples[0].reference == "36"  # 4 * 9
    assert dataset.examples[-1].reference == str(7 * 15)


@pytest.mark.skipif(not (SHARED / "gsm8k_test.jsonl").exists(), reason="the shared GSM8K file is not beside this checkout")
def test_the_shared_gsm8k_and_humaneval_sets_load():
    gsm = load_dataset(SHARED / "gsm8k_test.jsonl")
    assert gsm.kind == "gsm8k" and len(gsm.examples) == 1319
    assert all(e.reference.replace("-", "").replace(".", "").isdigit() for e in gsm.examples)
    human = load_dataset(SHARED / "humaneval.jsonl.gz")
    assert human.kind == "humaneval" and len(human.examples) == 164
    assert human.examples[0].id == "HumanEval/0" and human.examples[0].entry_point == "has_close_elements"


def test_bad_datasets_are_named_with_their_line(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\nnot json\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: the record is not valid JSON"):
        load_dataset(bad)
    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "hello"}\n')
    with pytest.raises(DatasetError, match=r"neither GSM8K .* nor HumanEval"):
        load_dataset(other)
    nohash = tmp_path / "nohash.jsonl"
    nohash.write_text('{"question": "q", "answer": "42"}\n')
    with pytest.raises(DatasetError, match="no '####'"):
        load_dataset(nohash)


def test_dataset_and_grid_errors_reach_callers_as_the_callers_own_fault_not_as_internal_errors():
    # both sit in the one error tree: the API answers their message, not "internal error"
    for error in (DatasetError("dataset x.jsonl does not exist"), GridError("--configs: NAME=JSON")):
        assert error_for(error).message == error.message and error_for(error).data["error_type"] != "internal"
        assert isinstance(error, ValueError)  # callers that catch ValueError still do


# -- scorers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, number",
    [
        ("18", "18"),
        ("The answer is $1,200.50.", "1200.50"),
        ("-3 degrees", "-3"),
        ("first 4 then 7 apples", "7"),
        ("none", None),
    ],
)
def test_the_last_number_of_an_answer_is_scored(answer, number):
    assert extract_number(answer) == number


def test_gsm8k_scoring_is_an_exact_numeric_match(tmp_path):
    example = load_dataset(gsm8k_file(tmp_path / "g.jsonl"), limit=1).examples[0]  # 3 * 7
    assert score_gsm8k("21", example).correct
    assert score_gsm8k("So Sam packs 21.0 apples", example).correct
    assert not score_gsm8k("22", example).correct
    assert score_gsm8k("no idea", example).detail == "the answer holds no number"


def humaneval_sample(tmp_path: Path) -> Path:
    record = {
        "task_id": "Sample/0",
        "prompt": 'def add_all(values):\n    """Return the sum of the values in the list given."""\n',
        "canonical_solution": "    return sum(values)\n",
        "test": "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n",
        "entry_point": "add_all",
    }
    path = tmp_path / "he.jsonl.gz"
    with gzip.open(path, "wt") as out:
        out.write(json.dumps(record) + "\n")
    return path


async def test_humaneval_runs_the_tests_in_the_sandbox(tmp_path):
    example = load_dataset(humaneval_sample(tmp_path)).examples[0]
    whole = "```python\ndef add_all(values):\n    return sum(values)\n```"
    assert extract_code(whole).startswith("def add_all")
    assert (await score_humaneval(whole, example)).correct
    assert (await score_humaneval("    return sum(values)\n", example)).correct  # a body is completed from the prompt
    wrong = await score_humaneval("def add_all(values):\n    return 0\n", example)
    assert not wrong.correct and "AssertionError" in wrong.detail
    spin = await score_humaneval("def add_all(values):\n    while True: pass\n", example, SandboxLimits(timeout_s=1.0))
    assert not spin.correct and "timed out" in spin.detail
    dial = "import socket\ndef add_all(values):\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n    return sum(values)\n"
    net = await score_humaneval(dial, example)
    assert not net.correct and "Network is unreachable" in net.detail  # the sandbox has no network


@pytest.mark.skipif(not (SHARED / "humaneval.jsonl.gz").exists(), reason="the shared HumanEval file is not beside this checkout")
async def test_canonical_humaneval_solutions_pass_and_stubs_fail():
    examples = load_dataset(SHARED / "humaneval.jsonl.gz", limit=8).examples
    for example in examples:
        assert (await score_humaneval(f"```python\n{example.reference}```", example)).correct, example.id
    assert not (await score_humaneval(examples[0].prompt + "    pass\n", examples[0])).correct


# -- the grid ---------------------------------------------------------------------------------------


def test_the_grid_is_strategies_by_configs_by_seeds_with_the_seed_in_the_config():
    configs = parse_configs(["greedy={}", 'self_consistency:k3={"samples": 3}'])
    cells = build_grid(catalogue(), ["chain_of_thought", "self_consistency"], configs, [0, 1])
    assert [c.key for c in cells] == [
        "chain_of_thought/greedy/seed=0",
        "chain_of_thought/greedy/seed=1",
        "self_consistency/greedy/seed=0",
        "self_consistency/greedy/seed=1",
        "self_consistency/k3/seed=0",
        "self_consistency/k3/seed=1",
    ]
    assert cells[5].config == {"samples": 3, "seed": 1}
    assert cells[0].workspace != cells[1].workspace


def test_grid_errors_say_what_to_change():
    with pytest.raises(GridError, match="NAME=JSON"):
        parse_configs(["oops"])
    with pytest.raises(GridError, match="not valid JSON"):
        parse_configs(["a={bad"])
    with pytest.raises(GridError, match="is not a known strategy"):
        build_grid(catalogue(), ["nope"], {}, [0])
    with pytest.raises(GridError, match="takes no seed"):
        build_grid(catalogue(), ["react"], {}, [0, 1])
    with pytest.raises(GridError, match="invalid strategy_config for self_consistency"):
        build_grid(catalogue(), ["self_consistency"], parse_configs(['x={"samples": "many"}']), [0])
    with pytest.raises(GridError, match="not in --strategies"):
        build_grid(catalogue(), ["chain_of_thought"], parse_configs(["react:a={}"]), [0])


# -- the runner ------------------------------------------------------------------------------------


async def test_a_grid_runs_appends_results_and_a_rerun_skips_what_is_done(tmp_path):
    examples = load_dataset(gsm8k_file(tmp_path / "g.jsonl")).examples
    cells = build_grid(catalogue(), ["chain_of_thought", "self_consistency"], {}, [0])
    log = ResultLog(tmp_path / "results.jsonl")
    seen = []
    ran = await run_grid(InProcessEngine(service_with_key(examples)), examples, cells, log, concurrency=3, on_record=seen.append)
    assert ran == 12 and len(seen) == 12
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 12
    assert all(r.status == "ok" and r.correct and r.simulated for r in seen)  # skill 1: every answer right
    assert {r.llm_calls for r in seen if r.strategy == "self_consistency"} == {5}

    again = ResultLog(tmp_path / "results.jsonl")
    assert await run_grid(InProcessEngine(service_with_key(examples)), examples, cells, again) == 0


class FailsOn:
    """The simulated model, except that prompts quoting `needle` fail as an unreachable provider would."""

    def __init__(self, inner, needle: str) -> None:
        self.inner, self.needle, self.model = inner, needle, inner.model

    async def complete(self, request):
        if any(self.needle in (m.content or "") for m in request.messages):
            raise ProviderUnavailableError("the endpoint refused the connection", attempts=3)
        return await self.inner.complete(request)


async def test_a_failed_example_is_recorded_the_run_goes_on_and_a_rerun_retries_it(tmp_path):
    examples = load_dataset(gsm8k_file(tmp_path / "g.jsonl")).examples
    cells = build_grid(catalogue(), ["chain_of_thought"], {}, [0])
    model = SimulatedModel(counter_for_model("simulated"))
    model.add_answers({e.key: e.reference for e in examples})
    flaky = FailsOn(SimulatedLLM(model), "stall number 2")
    log = ResultLog(tmp_path / "results.jsonl")
    await run_grid(InProcessEngine(service_with_key(examples, llm=flaky)), examples, cells, log)
    records = log.select(examples, cells)
    failed = [r for r in records if r.status == "error"]
    assert len(records) == 6 and [r.example_id for r in failed] == ["gsm8k-3"]
    assert (failed[0].error_code, failed[0].error_type) == (-32013, "provider_unavailable") and "refused the connection" in failed[0].error

    rerun = ResultLog(tmp_path / "results.jsonl")
    assert await run_grid(InProcessEngine(service_with_key(examples)), examples, cells, rerun) == 1
    assert all(r.status == "ok" for r in ResultLog(tmp_path / "results.jsonl").select(examples, cells))


async def test_memory_aware_cells_stream_in_order_learn_as_they_go_and_never_see_their_own_memories(tmp_path):
    examples = load_dataset(gsm8k_file(tmp_path / "g.jsonl", 4)).examples
    cells = build_grid(catalogue(), ["chain_of_thought"], {}, [0])
    bank = make_bank(tmp_path / "chroma", min_similarity=0.0)
    service = service_with_key(examples, memory=local_memory(bank))
    log = ResultLog(tmp_path / "results.jsonl")
    await run_grid(InProcessEngine(service), examples, cells, log, concurrency=4, memory=True)
    order = [json.loads(line)["example_id"] for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert order == [e.id for e in examples]  # a stream, not a race
    records = log.select(examples, cells)
    assert [r.memory["retrieved"] for r in records] == [0, 1, 1, 1]  # the first has nothing to learn from
    assert all(r.memory["stored"] >= 1 and r.memory["outcome"] == "success" for r in records)
    for example in examples:
        assert len(bank.store.traces(cells[0].workspace, example.id)) == 1
    assert {w["workspace"]: w["traces"] for w in bank.list_workspaces()} == {cells[0].workspace: 4}


# -- the report ------------------------------------------------------------------------------------


def test_wilson_intervals_and_percentiles():
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson(35, 50)
    assert (low, high) == (pytest.approx(0.5625, abs=1e-4), pytest.approx(0.8090, abs=1e-4))
    assert percentile([5.0], 95) == 5.0
    assert percentile([float(v) for v in range(1, 101)], 50) == pytest.approx(50.5)


async def test_the_report_has_accuracy_tokens_cost_latency_and_plots_labelled_simulated(tmp_path):
    examples = load_dataset(gsm8k_file(tmp_path / "g.jsonl")).examples
    cells = build_grid(catalogue(), ["chain_of_thought"], {}, [0, 1])
    log = ResultLog(tmp_path / "results.jsonl")
    await run_grid(InProcessEngine(service_with_key(examples, skill=0.5)), examples, cells, log)
    report = build_report(
        log.select(examples, cells),
        cells,
        {
            "dataset": {"path": "g.jsonl", "name": "g.jsonl", "kind": "gsm8k", "examples": 6, "digest": "x"},
            "model": "simulated",
            "simulator_skill": 0.5,
            "seeds": [0, 1],
            "memory": False,
        },
        Prices(1.0, 2.0),
    )
    paths = write_report(report, tmp_path / "out")
    row = report["rows"][0]
    records = log.select(examples, cells)
    assert row["examples"] == 12 and row["correct"] == sum(r.correct for r in records)
    assert row["ci_low"] <= row["accuracy"] <= row["ci_high"]
    assert row["cost_usd"] == pytest.approx(sum(r.prompt_tokens + 2 * r.completion_tokens for r in records) / 1e6)
    assert row["latency_p50_ms"] <= row["latency_p95_ms"]
    assert [r["group"] for r in report["per_seed"]] == ["chain_of_thought/default/seed=0", "chain_of_thought/default/seed=1"]
    text = paths["markdown"].read_text()
    assert "Simulated model" in text and "accuracy (SIMULATED)" in text and "## Per seed" in text
    assert json.loads(paths["json"].read_text())["simulated"] is True
    for png in (paths["accuracy_plot"], paths["latency_plot"]):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


# -- the whole run, in-process ---------------------------------------------------------------------


async def test_run_async_in_process_writes_everything_against_the_simulator_over_http(tmp_path):
    options = EvalOptions(
        dataset=gsm8k_file(tmp_path / "g.jsonl"),
        strategies=["chain_of_thought", "self_consistency"],
        out=tmp_path / "run",
        use_ray=False,
        progress=False,
        sim_skill=0.6,
    )
    report = await run_async(options)
    assert report["simulated"] and report["model"] == "simulated" and report["simulator_skill"] == 0.6
    assert {r["group"] for r in report["rows"]} == {"chain_of_thought/default", "self_consistency/default"}
    for name in ("results.jsonl", "report.md", "report.json", "accuracy_vs_tokens.png", "latency.png", "run.json"):
        assert (tmp_path / "run" / name).is_file(), name
    # the same --out with a changed config under the same name is refused, not mixed in
    options.configs = ['default={"temperature": 0.5}']
    options.strategies = ["chain_of_thought"]
    with pytest.raises(EvalError, match="another config"):
        await run_async(options)


def test_reasonray_eval_is_the_same_command_as_python_m_evals_run(tmp_path):
    runner = CliRunner()
    ours = runner.invoke(reasonray_main, ["eval", "--help"])
    theirs = runner.invoke(eval_main, ["--help"])
    assert ours.exit_code == theirs.exit_code == 0
    assert ours.output.split("Options:")[1] == theirs.output.split("Options:")[1]
    bad = runner.invoke(
        reasonray_main,
        ["eval", "--dataset", str(tmp_path / "none.jsonl"), "--strategies", "chain_of_thought", "--out", str(tmp_path / "o"), "--no-ray"],
    )
    assert bad.exit_code == 2 and "does not exist" in bad.output


class FailsAfter:
    """Answers `n` calls, then fails the way an endpoint that timed out mid-generation does: after spending tokens."""

    def __init__(self, inner, n: int) -> None:
        self.inner, self.n, self.model = inner, n, inner.model

    async def complete(self, request):
        if self.n == 0:
            error = ProviderUnavailableError("timed out after request_timeout_s", attempts=2)
            error.spent = (120, 40)  # both attempts' prompts and what was generated before the deadline
            raise error
        self.n -= 1
        return await self.inner.complete(request)


async def test_a_failed_example_keeps_the_calls_and_tokens_it_spent(tmp_path):
    examples = load_dataset(gsm8k_file(tmp_path / "g.jsonl", count=1)).examples
    # one proposal, then its value call fails: a level with nothing scored (a refine iteration that failed would
    # cost only that iteration, and the example would answer)
    cells = build_grid(catalogue(), ["tree_of_thought"], {"tree_of_thought": {"one": {"breadth": 1}}}, [0])
    model = SimulatedModel(counter_for_model("simulated"))
    model.add_answers({e.key: e.reference for e in examples})
    first = SimulatedLLM(model)
    log = ResultLog(tmp_path / "results.jsonl")
    await run_grid(InProcessEngine(service_with_key(examples, llm=FailsAfter(first, 1))), examples, cells, log)
    [record] = log.select(examples, cells)
    assert record.status == "error" and record.error_type == "provider_unavailable"
    # the proposal that was answered, and the evaluation that failed: both were made and paid for
    assert record.llm_calls == 2
    assert record.prompt_tokens > 120 and record.completion_tokens > 40
