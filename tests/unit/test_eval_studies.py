"""The evaluation's study statistics against values worked by hand: examples (not seeds) as the unit, Holm's
adjustment, the bootstrap's resolution floor, non-inferiority, trivial baselines, strict and lenient scoring,
signs of numbers, generated task families, provenance, the budget axis, memory arms and MaTTS k curves."""

from __future__ import annotations

import re

import pytest

from reasonray.evals.compare import clustered_interval, compare, holm, non_inferiority, paired_bootstrap
from reasonray.evals.datasets import DatasetError, Example, load_dataset
from reasonray.evals.generate import generate
from reasonray.evals.scoring import extract_number, lenient_correct
from reasonray.evals.studies import k_curves, k_outcomes, learning_curves, majority
from reasonray.kernel.extraction import final_number


def _split(only_a: int, only_b: int, seeds: list[int]) -> tuple[dict, dict]:
    """only_a examples A gets right and B wrong, only_b the reverse, 20 both right; every seed the same."""
    a, b = {}, {}
    for i in range(only_a + only_b + 20):
        for seed in seeds:
            a[(f"q{i}", seed)] = i < only_a or i >= only_a + only_b
            b[(f"q{i}", seed)] = i >= only_a
    return a, b


def test_repeating_seeds_does_not_inflate_significance():
    one = compare("A", _split(2, 10, [0])[0], "B", _split(2, 10, [0])[1])
    a, b = _split(2, 10, [0, 1, 2])
    three = compare("A", a, "B", b)
    # a 2:10 split is p = 0.039 whether it ran under one seed or three; 6:30 (p = 7e-5) would count seeds as examples
    assert (one.paired, one.only_a, one.only_b) == (32, 2, 10)
    assert (three.paired, three.only_a, three.only_b, three.seeds) == (32, 2, 10, 3)
    assert three.mcnemar_p == one.mcnemar_p == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert (three.difference, three.ci_low, three.ci_high) == (one.difference, one.ci_low, one.ci_high)


def test_seeds_of_one_example_are_averaged_before_the_sign_test():
    a = {("q1", 0): True, ("q1", 1): True, ("q2", 0): True, ("q2", 1): False, ("q3", 0): False, ("q3", 1): False}
    b = {("q1", 0): True, ("q1", 1): False, ("q2", 0): True, ("q2", 1): False, ("q3", 0): False, ("q3", 1): True}
    c = compare("A", a, "B", b)
    # q1: 1 vs 0.5 (A better), q2: 0.5 vs 0.5 (tie), q3: 0 vs 0.5 (B better)
    assert (c.paired, c.only_a, c.only_b, c.both, c.neither) == (3, 1, 1, 0, 1)
    assert c.difference == pytest.approx(0.0)


def test_holm_on_known_p_values():
    # sorted 0.01, 0.02, 0.03, 0.04 -> x4, x3, x2, x1 = 0.04, 0.06, 0.06, 0.06 (made monotone), in input order
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_a_bootstrap_p_at_its_floor_is_a_bound_not_a_number():
    boot = paired_bootstrap([True] * 50, [False] * 50, resamples=5000)
    assert boot.at_floor and boot.p_value == 0.0
    c = compare("A", {(f"q{i}", 0): True for i in range(30)}, "B", {(f"q{i}", 0): False for i in range(30)}, resamples=5000)
    assert c.bootstrap_p == "< 0.0002"


def test_the_clustered_interval_resamples_examples_not_records():
    # 10 examples, each right under all 5 seeds or wrong under all 5: as 50 independent records the interval would be
    # far narrower than with 10 examples
    outcomes = {(f"q{i}", s): i < 5 for i in range(10) for s in range(5)}
    low, high = clustered_interval(outcomes, seed=1)
    single_low, single_high = clustered_interval({(f"q{i}", 0): i < 5 for i in range(10)}, seed=1)
    assert (low, high) == (single_low, single_high)
    assert clustered_interval(outcomes, seed=1) == clustered_interval(outcomes, seed=1)


def test_non_inferiority_against_its_margin():
    same = {(f"q{i}", 0): i % 2 == 0 for i in range(200)}
    result = non_inferiority("bounded", same, "cot", dict(same), margin=0.10)
    assert result.non_inferior and result.lower_bound == 0.0 and result.paired == 200
    worse = {k: v and int(k[0][1:]) % 4 != 0 for k, v in same.items()}  # loses half its right answers: -25 points
    result = non_inferiority("bounded", worse, "cot", same, margin=0.10)
    assert not result.non_inferior and result.difference == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="margin"):
        non_inferiority("a", same, "b", same, margin=10)


@pytest.mark.parametrize(
    ("text", "number"),
    [("9-4", "4"), ("-4", "-4"), ("x = -4", "-4"), ("(-4)", "-4"), ("12-5=7", "7"), ("it is 3 - 5", "5"), ("$1,200.", "1200")],
)
def test_a_minus_is_a_sign_only_where_it_cannot_be_an_operator(text, number):
    assert extract_number(text) == number
    assert extract_number("9-4 and 9-4") == "4"


def test_the_answer_reader_of_the_strategies_agrees_on_signs():
    assert final_number("9-4") == "4" and final_number("x = -4") == "-4"


def test_lenient_scoring_finds_any_number_strict_does_not():
    example = Example(id="q", kind="gsm8k", query="What is 2 + 3?", reference="5", key="")
    assert lenient_correct(["5 is what 2 + 3 gives, so 6"], example)
    assert not lenient_correct(["9-4"], Example(id="q", kind="gsm8k", query="", reference="-4", key=""))
    assert extract_number("5 is what 2 + 3 gives, so 6") == "6"  # strict reads the last: wrong


def test_generated_families_are_deterministic_by_seed_and_their_answers_right():
    spec = "gen:running_sums?steps=4-16&n=50&seed=3"
    assert generate(spec) == generate(spec)
    assert generate(spec) != generate("gen:running_sums?steps=4-16&n=50&seed=4")
    for _, question, answer in generate(spec):
        total, steps = 0, 0
        for word, value in re.findall(r"(Start with|Add|Subtract) (\d+)\.", question):
            total = int(value) if word == "Start with" else total + int(value) if word == "Add" else total - int(value)
            steps += word != "Start with"
        assert str(total) == answer and 4 <= steps <= 16 and total >= 0
    sums = load_dataset("gen:sums?n=20&seed=0")
    assert all(str(sum(int(t.rstrip("?")) for t in e.query.split()[2::2])) == e.reference for e in sums.examples)
    assert sums.sha256 == load_dataset("gen:sums?n=20&seed=0").sha256 != load_dataset("gen:sums?n=20&seed=1").sha256
    with pytest.raises(DatasetError, match="no generated family"):
        load_dataset("gen:calculus?n=3")
    with pytest.raises(DatasetError, match="steps"):
        load_dataset("gen:running_sums?steps=9-2")


def _attempt(index, answer, score=None, chosen=False, failed=None):
    return {
        "index": index,
        "answer": answer,
        "found_by": "tag",
        "degenerate": False,
        "judge": None,
        "score": score,
        "chosen": chosen,
        "failed": failed,
    }


class _R:
    """The fields of a record the curves read."""

    def __init__(self, example_id, correct=False, attempts=None, arm="", order=0, position=None, seed=0, reference="5", memory=None):
        self.example_id, self.correct, self.attempts, self.arm, self.order = example_id, correct, attempts, arm, order
        self.position, self.seed, self.reference, self.memory = position, seed, reference, memory
        self.strategy, self.config_name = "matts", "k5"


def test_k_curves_from_one_attempt_log():
    log = [
        _attempt(0, "4", 0.2),
        _attempt(1, "5", 0.9),
        _attempt(2, "4", 0.1),
        _attempt(3, "5", 0.8),
        _attempt(4, "failed", failed="timeout"),
    ]
    log[4]["answer"] = None
    assert majority(log[:3]) == "4" and majority(log[:4]) == "4"  # 2:2 ties to the answer given first
    prose = [_attempt(0, "so it is 7"), _attempt(1, "the larger one is 52"), _attempt(2, "52 is larger than 47, so 52")]
    assert majority(prose) == "52"  # replies are votes for what the scorer reads in them, not for their wording
    assert k_outcomes(log, "5", 1) == {"majority": False, "judge": False, "oracle": False}
    assert k_outcomes(log, "5", 2) == {"majority": False, "judge": True, "oracle": True}  # judge: 0.9 beats 0.2
    assert k_outcomes(log, "5", 3) == {"majority": False, "judge": True, "oracle": True}
    other = [_attempt(i, "5") for i in range(5)]
    curves = k_curves([_R("q1", attempts=log), _R("q2", attempts=other)])
    (curve,) = curves
    assert curve["k_max"] == 5
    by_k = {p["k"]: p for p in curve["points"]}
    assert by_k[1]["oracle"]["accuracy"] == 0.5 and by_k[2]["oracle"]["accuracy"] == 1.0 and by_k[2]["judge"]["accuracy"] == 1.0
    assert by_k[3]["majority"]["accuracy"] == 0.5
    gains = {(c["a"], c["b"]): c for c in curve["comparisons"]}
    assert gains[("judge@5", "judge@1")]["only_a"] == 1 and gains[("judge@5", "judge@1")]["paired"] == 2
    assert set(gains) == {("majority@5", "majority@1"), ("judge@5", "judge@1"), ("judge@5", "majority@5")}


def test_the_learning_curve_has_both_arms_by_block_and_the_later_difference():
    records = []
    for order in (0, 1):
        for position in range(10):
            example = f"q{(position + order * 3) % 10}"
            # memory off is right on even examples; memory on as well, and on every example of the later half
            right_off = int(example[1:]) % 2 == 0
            records.append(_R(example, right_off, arm="off", order=order, position=position))
            records.append(_R(example, right_off or position >= 5, arm="on", order=order, position=position))
    (curve,) = learning_curves(records, blocks=2)
    assert set(curve["arms"]) == {"on", "off"} and curve["block_size"] == 5
    assert [b["accuracy"] for b in curve["arms"]["on"]][1] == 1.0
    later = curve["later"]
    assert later["from_position"] == 5 and later["paired"] <= 10 and later["difference"] > 0 and later["only_b"] == 0


def test_the_learning_curve_says_when_memory_on_learned_nothing():
    """The manipulation check: an "on" arm whose extraction never produced an item cannot show learning, and a
    placebo arm that retrieves in every run is not comparable to it as a test of what was learned."""
    from reasonray.evals.report import _studies_markdown

    records = []
    for position in range(4):
        learned_nothing = {"retrieved": 0, "stored": 0, "outcome": "failure", "learn_error": None}
        records.append(_R(f"q{position}", arm="on", position=position, memory=learned_nothing))
        records.append(_R(f"q{position}", arm="off", position=position))
        placebo = {"retrieved": int(position > 0), "stored": 0, "outcome": None, "learn_error": None}
        records.append(_R(f"q{position}", True, arm="placebo", position=position, memory=placebo))
    (curve,) = learning_curves(records, blocks=2)
    assert curve["memory"] == {
        "off": {"stored": 0, "retrieved_share": 0.0},
        "on": {"stored": 0, "retrieved_share": 0.0},
        "placebo": {"stored": 0, "retrieved_share": 0.75},
    }
    text = "\n".join(_studies_markdown({"learning_curves": [curve]}))
    assert "placebo 0 stored, retrieved in 75% of runs" in text and "this run does not test learning" in text
    records[0].memory = {**records[0].memory, "stored": 2}
    (curve,) = learning_curves(records, blocks=2)
    assert curve["memory"]["on"]["stored"] == 2
    assert "does not test learning" not in "\n".join(_studies_markdown({"learning_curves": [curve]}))


def test_the_placebo_memory_shows_the_model_no_number_and_no_method():
    """What the placebo arm adds to a prompt is the memory section with text that cannot carry an answer: no digit,
    and nothing of the task it is stored under (its key finds it; the key is never shown)."""
    from reasonray.evals.runner import PLACEBO_ITEM
    from reasonray.memory.items import MemoryItem, format_memory_block

    shown = format_memory_block([MemoryItem.model_validate({**PLACEBO_ITEM, "task_id": "sums-s2-7"})])
    assert "<memory_data>" in shown and not re.search(r"\d|sum|add|plus|answer is", shown)


# -- the tool end to end ---------------------------------------------------------------------------

ALL = ["chain_of_thought", "self_consistency", "tree_of_thought", "react", "bounded_context", "refine", "matts"]


def _catalogue():
    from reasonray.kernel.config import ReasoningSettings
    from reasonray.strategies.registry import StrategyRegistry, build_catalogue

    return build_catalogue(StrategyRegistry().discover(), ReasoningSettings(enabled_strategies=ALL))


def test_the_budget_axis_sets_each_strategys_token_limits():
    from reasonray.evals.grid import GridError, build_grid

    cells = build_grid(
        _catalogue(), ["chain_of_thought", "matts", "bounded_context"], {None: {"t": {"temperature": 0.7}}}, [0], budgets=[16, 64]
    )
    by = {(c.strategy, c.budget): c for c in cells}
    assert {c.config_name for c in cells} == {"t@16", "t@64"}
    assert by[("chain_of_thought", 16)].config["max_tokens"] == 16 and by[("chain_of_thought", 16)].config["temperature"] == 0.7
    assert by[("matts", 64)].config["base_config"]["max_tokens"] == 64 and by[("matts", 16)].config["judge_max_tokens"] == 16
    assert by[("bounded_context", 16)].config == {"temperature": 0.7, "seed": 0}  # held to B by the request's per-call cap alone
    assert len({c.key for c in cells}) == 6 and all(c.budget in (16, 64) for c in cells)
    with pytest.raises(GridError, match="positive"):
        build_grid(_catalogue(), ["chain_of_thought"], {}, [0], budgets=[0])
    capped = build_grid(_catalogue(), ["chain_of_thought", "bounded_context"], {None: {"c": {}}}, [0], call_caps={"bounded_context": 64})
    assert sorted((c.group, c.budget) for c in capped) == [("bounded_context/c@64", 64), ("chain_of_thought/c", None)]
    with pytest.raises(GridError, match="one of them"):
        build_grid(_catalogue(), ["chain_of_thought"], {}, [0], budgets=[16], call_caps={"chain_of_thought": 8})


async def test_a_per_call_cap_reaches_every_call_of_the_run(tmp_path):
    from reasonray.api.service import ReasoningService
    from reasonray.evals.grid import Cell
    from reasonray.evals.runner import InProcessEngine, ResultLog, run_grid
    from reasonray.gateway.simulator.engine import SimulatedModel
    from reasonray.gateway.simulator.inprocess import SimulatedLLM
    from reasonray.gateway.tokens import counter_for_model

    examples = [Example(id="q", kind="gsm8k", query="What is 2 + 3?", reference="5", key="What is 2 + 3?")]
    service = ReasoningService(_catalogue(), SimulatedLLM(SimulatedModel(counter_for_model("simulated"))), counter_for_model("simulated"))
    cells = [Cell("self_consistency", "s3@8", 0, {"samples": 3, "max_tokens": 400, "seed": 0}, budget=8)]
    log = ResultLog(tmp_path / "results.jsonl")
    await run_grid(InProcessEngine(service), examples, cells, log)
    (record,) = log.select(examples, cells)
    assert record.budget == 8 and 0 < record.completion_tokens <= 8 * record.llm_calls


def test_the_report_has_baselines_lenient_scores_holm_and_budget_curves(tmp_path):
    from reasonray.evals.grid import Cell
    from reasonray.evals.report import Prices, build_report, markdown, write_report
    from reasonray.evals.runner import Record

    examples = [
        Example(id=f"q{i}", kind="gsm8k", query=f"What is 1 + {i}?", reference="1" if i < 3 else str(i + 1), key="") for i in range(40)
    ]
    cells = [Cell("chain_of_thought", f"d@{b}", 0, budget=b) for b in (16, 64)] + [Cell("refine", "d", 0)]

    def record(cell, example, correct, lenient=False):
        return Record(
            example.id,
            cell.strategy,
            cell.config_name,
            0,
            "ok",
            correct=correct,
            correct_lenient=lenient,
            found_by="tag",
            reference=example.reference,
            prompt_tokens=10 * (cell.budget or 100),
            budget=cell.budget,
        )

    records = [record(cells[0], e, False, lenient=True) for e in examples]
    records += [record(cells[1], e, True) for e in examples]
    records += [record(cells[2], e, i % 2 == 0) for i, e in enumerate(examples)]
    meta = {
        "dataset": {"name": "t", "examples": 40, "path": "t", "kind": "gsm8k", "digest": "x"},
        "model": "m",
        "seeds": [0],
        "memory": False,
    }
    report = build_report(records, cells, meta, Prices(), examples)
    baselines = {b["name"]: b for b in report["baselines"]}
    assert baselines["constant"]["answer"] == "1" and baselines["constant"]["correct"] == 3
    assert baselines["echo"]["correct"] == 1  # only "What is 1 + 1?" echoes its answer, 1
    rows = {r["group"]: r for r in report["rows"]}
    assert rows["chain_of_thought/d@16"]["accuracy"] == 0.0 and rows["chain_of_thought/d@16"]["accuracy_lenient"] == 1.0
    assert rows["chain_of_thought/d@16"]["found_by"] == {"tag": 40}
    p_holm = {(c["a"], c["b"]): c["p_holm"] for c in report["comparisons"]}
    raw = sorted(c["mcnemar_p"] for c in report["comparisons"])
    assert len(p_holm) == 3 and min(p_holm.values()) == pytest.approx(min(1.0, 3 * raw[0]), rel=1e-4)
    text = markdown(report)
    assert "## Baselines" in text and "Holm p" in text and "< 0.0002" in text and "lenient" in text
    paths = write_report(report, tmp_path)
    assert paths["accuracy_plot"].exists()


async def test_a_memory_study_over_a_client_runs_both_arms_on_seeded_streams(tmp_path):
    """Against a service (here in process), memory on learns through the service with the reference as its
    expected answer, memory off does not; each arm and order has its own workspace; run.json says what ran."""
    import json

    from reasonray.api.app import Backends, build_application
    from reasonray.api.surfaces.local_http import in_process_client
    from reasonray.evals.run import EvalOptions, run_async
    from reasonray.gateway.simulator.engine import SimulatedModel
    from reasonray.gateway.simulator.inprocess import SimulatedLLM
    from reasonray.gateway.tokens import counter_for_model
    from reasonray.kernel.config import Settings
    from tests.unit.memory_harness import local_memory, make_bank

    bank = make_bank(tmp_path / "chroma", min_similarity=0.0)
    settings = Settings.model_validate({"reasoning": {"enabled_strategies": ["chain_of_thought"], "default_strategy": "chain_of_thought"}})
    app = build_application(
        settings,
        llm=SimulatedLLM(SimulatedModel(counter_for_model("simulated"))),
        data_dir=None,
        backends=Backends(memory=local_memory(bank)),
    )
    async with in_process_client(app.dispatcher) as rr:
        options = EvalOptions(
            dataset="gen:sums?n=4&seed=0",
            strategies=["chain_of_thought"],
            out=tmp_path / "run",
            client=rr,
            memory=True,
            memory_study=True,
            placebo=True,
            orders=2,
            progress=False,
        )
        report = await run_async(options)
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    placebo = [r for r in records if r["arm"] == "placebo"]
    assert len(placebo) == 8 and all(r["memory"]["stored"] == 0 for r in placebo)  # retrieves, never learns
    assert [r["memory"]["retrieved"] for r in sorted(placebo, key=lambda r: (r["order"], r["position"]))][:2] == [0, 1]
    records = [r for r in records if r["arm"] != "placebo"]
    assert len(records) == 16 and {(r["arm"], r["order"]) for r in records} == {(a, o) for a in ("on", "off") for o in (0, 1)}
    for arm, order in [("on", 0), ("on", 1), ("off", 0), ("off", 1)]:
        ours = sorted((r for r in records if (r["arm"], r["order"]) == (arm, order)), key=lambda r: r["position"])
        assert [r["position"] for r in ours] == [0, 1, 2, 3]
        if order == 0:
            assert [r["example_id"] for r in ours] == [f"sums-s0-{i}" for i in range(4)]
    shuffled = [r["example_id"] for r in sorted((r for r in records if (r["arm"], r["order"]) == ("on", 1)), key=lambda r: r["position"])]
    assert sorted(shuffled) == [f"sums-s0-{i}" for i in range(4)]
    assert all(r["memory"] is None for r in records if r["arm"] == "off")
    assert all(r["memory"]["outcome"] == "success" for r in records if r["arm"] == "on")  # labelled by the expected answer
    learned = sorted(w["traces"] for w in bank.list_workspaces() if w["traces"])
    assert learned == [4, 4]  # the two "on" streams learned; placebo workspaces hold placebo items, no traces
    (curve,) = report["learning_curves"]
    later = {r["example_id"] for r in records if r["position"] >= 2}  # the later half of either order: examples, not records
    assert set(curve["arms"]) == {"on", "off", "placebo"} and curve["later"]["paired"] == len(later)
    assert curve["later_vs_placebo"]["b"] == "memory placebo"
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    prov = run["provenance"]
    assert len(prov["git_commit"]) == 40 and isinstance(prov["git_dirty"], bool)
    assert prov["dataset_sha256"] == report["dataset"]["sha256"] and len(prov["dataset_sha256"]) == 64
    assert prov["model"]["served_name"] == "simulated" and prov["command"] and prov["machine"]["cpus"] >= 1
    local = prov["local_model"]  # the file `--llm local` would serve, hashed when it is on this machine
    assert local["sha256"] is None or len(local["sha256"]) == 64
    assert run["memory_study"] == {"arms": ["on", "off", "placebo"], "orders": 2}


def test_an_endpoint_is_described_by_what_it_says_of_itself_and_its_model_files_hash(tmp_path, monkeypatch):
    import hashlib

    from reasonray.evals import provenance

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"weights")
    replies = {
        "http://llm:8080/v1/models": ({"data": [{"id": "other"}, {"id": "smollm2", "owned_by": "llamacpp"}]}, {"server": "llama.cpp"}),
        "http://llm:8080/props": ({"model_path": str(gguf), "build_info": "b4000"}, {}),
    }
    monkeypatch.setattr(provenance, "_get", lambda url: replies.get(url, (None, {})))
    info = provenance.endpoint_model("http://llm:8080/v1", "smollm2")
    assert info["models_entry"] == {"id": "smollm2", "owned_by": "llamacpp"} and info["server"] == "llama.cpp"
    assert info["model_path"] == str(gguf) and info["model_sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert info["server_build"] == "b4000"
    assert provenance.endpoint_model(None, "x")["models_entry"] is None


def test_every_part_of_the_published_study_is_a_valid_grid_and_the_pilot_rule_swaps_the_family(tmp_path):
    from reasonray.evals.run import prepare
    from reasonray.evals.study import after_pilot, choose_family, load_study, part_options

    study = load_study()
    pilots = ["pilot_sums", "pilot_differences", "pilot_comparisons"]
    assert list(study["parts"]) == [*pilots, "budgets_a", "budgets_b", "memory", "matts", "running_sums", "adaptive"]
    groups = {}
    for name in study["parts"]:
        _, _, cells = prepare(part_options(name, tmp_path, url="http://127.0.0.1:1", study=study))
        groups[name] = {c.group for c in cells}
    assert "chain_of_thought/greedy@32" in groups["budgets_a"] and len(groups["budgets_a"]) == 12
    assert groups["memory"] == {f"chain_of_thought/m32/memory={arm}" for arm in ("on", "off", "placebo")}
    assert groups["running_sums"] == {"chain_of_thought/cap256", "bounded_context/cap256@64"}
    assert groups["adaptive"] == {f"self_consistency/{name}" for name in ("fixed5", "adaptive5", "beta95")}
    # inside the band and nearest its middle wins; the primary family chosen changes nothing
    assert after_pilot(study, {"sums": 0.45, "differences": 0.2, "comparisons": 0.7}) is study
    swapped = after_pilot(study, {"sums": 0.225, "differences": 0.15, "comparisons": 0.525})
    assert swapped["parts"]["budgets_a"]["dataset"] == "gen:comparisons?n=50&seed=1"
    assert swapped["parts"]["memory"]["dataset"] == "gen:comparisons?n=40&seed=2"
    assert all(swapped["parts"][p] == study["parts"][p] for p in pilots)
    assert swapped["parts"]["running_sums"] == study["parts"]["running_sums"]
    # none inside the band: the nearest to its middle, all the same; a tie goes to the family listed first
    assert choose_family(study, {"sums": 0.1, "differences": 0.3, "comparisons": 0.9}) == "differences"
    assert choose_family(study, {"sums": 0.45, "differences": 0.55, "comparisons": 0.5}) == "comparisons"
    assert choose_family(study, {"sums": 0.45, "differences": 0.55}) == "sums"
