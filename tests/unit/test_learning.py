"""The learning loop: judge, success and failure extraction, self-contrast, passive learning, and
memory-aware runs through the API in-process (the ReasoningBank paper's method, arXiv 2509.25140)."""

from __future__ import annotations

import pytest

from reasonray.api.app import local_dispatcher
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import ScriptedLLM
from reasonray.kernel.config import MemorySettings, load_settings
from reasonray.kernel.errors import ModelBehaviorError
from reasonray.memory.items import Trajectory
from reasonray.memory.learning import (
    FAILURE_PROMPT,
    SUCCESS_PROMPT,
    Learner,
    exact_verifier,
    passive_rejects,
)
from tests.unit.memory_harness import local_memory, make_bank

ITEM = "<memory><title>{t}</title><description>One sentence.</description><content>Do the thing carefully.</content></memory>"
ERROR_ITEM = (
    "<memory><title>{t}</title><description>One sentence.</description><content>Avoid it.</content>"
    "<error_type>slip</error_type><failure_pattern>rounded early</failure_pattern><corrective_guidance>stay exact</corrective_guidance></memory>"
)
RUN = Trajectory(text="<thinking>12*3 = 36</thinking><answer>36</answer>", answer="36", selected=True)


async def test_the_llm_judge_runs_at_temperature_zero_and_its_verdict_labels_the_trajectory():
    llm = ScriptedLLM(["Thoughts: fine.\n<status>success</status>", "Thoughts: wrong.\n<status>failure</status>"])
    learner = Learner(llm)
    assert (await learner.judge("What is 12*3?", RUN)).outcome == "success"
    verdict = await learner.judge("What is 12*3?", RUN)
    assert (verdict.outcome, verdict.judged_by) == ("failure", "llm_judge")
    assert all(r.temperature == 0 for r in llm.requests)
    assert "<status>success</status>" in llm.requests[0].messages[0].content
    assert "Final answer: 36" in llm.requests[0].messages[1].content


async def test_a_verifier_labels_without_asking_the_model():
    learner = Learner(ScriptedLLM([]))  # any call would raise UnexpectedCall
    assert (await learner.judge("q", RUN, exact_verifier("36.0"))).outcome == "success"
    verdict = await learner.judge("q", RUN, exact_verifier("37"))
    assert (verdict.outcome, verdict.judged_by) == ("failure", "verifier")


async def test_the_exact_verifier_reads_a_numeric_answer_as_scorers_do():
    larger = exact_verifier("52")
    assert await larger("The larger is 52.") and await larger("47 vs 52: the answer is 52") and await larger("$52.00")
    assert not await larger("52 is not it, the larger is 47") and not await larger("no number here")
    words = exact_verifier("Paris")  # a non-numeric answer must equal it: no number is read out of the reply
    assert await words("paris.") and not await words("It is Paris, 2 km away")


async def test_an_unreadable_verdict_is_an_error_not_a_guess():
    with pytest.raises(ModelBehaviorError, match="no <status>"):
        await Learner(ScriptedLLM(["I think it is probably fine"])).judge("q", RUN)


async def test_success_and_failure_use_separate_prompts_at_most_three_items_and_failures_carry_error_context():
    llm = ScriptedLLM(
        [
            "".join(ITEM.format(t=f"S{i}") for i in range(5)),
            ERROR_ITEM.format(t="F1") + ITEM.format(t="no error context: dropped"),
        ]
    )
    learner = Learner(llm, max_items=3)
    wins = await learner.extract("q", RUN, "success", task_id="t", workspace="w", domain_category="math")
    losses = await learner.extract("q", RUN, "failure", task_id="t", workspace="w")
    assert [i.title for i in wins] == ["S0", "S1", "S2"]
    assert all(i.source_type == "success" and i.error_context is None and i.domain_category == "math" for i in wins)
    assert [i.title for i in losses] == ["F1"] and losses[0].error_context.error_type == "slip"
    assert losses[0].source_type == "failure" and losses[0].is_warning
    assert llm.requests[0].messages[0].content == SUCCESS_PROMPT.format(n=3)
    assert llm.requests[1].messages[0].content == FAILURE_PROMPT.format(n=3)
    assert "why it failed" not in SUCCESS_PROMPT and "failed" in FAILURE_PROMPT


async def test_a_verified_success_without_usable_items_is_kept_as_a_worked_example():
    # the extractor ignores the format, as small models do: the attempt the verifier accepted is stored as it was
    learner = Learner(ScriptedLLM(["It worked because the sum is right."]))
    entry, _ = await learner.learn("What is 12 * 3?", [RUN], task_id="t", workspace="w", verifier=exact_verifier("36"))
    [item] = entry.items
    assert (item.title, item.source_type, item.pattern_tags) == ("Worked example", "success", ["worked-example"])
    assert "What is 12 * 3?" in item.description and "12*3 = 36" in item.content and item.content.endswith("Final answer: 36")
    assert item.task_id == "t" and item.workspace == "w"


async def test_no_worked_example_from_a_failure_an_llm_judgement_or_when_switched_off():
    wrong = Learner(ScriptedLLM(["no tags at all"]))
    entry, _ = await wrong.learn("What is 12 * 3?", [RUN], task_id="t", workspace="w", verifier=exact_verifier("37"))
    assert entry.outcome == "failure" and entry.items == []
    judged = Learner(ScriptedLLM(["<status>success</status>", "no tags at all"]))
    entry, _ = await judged.learn("What is 12 * 3?", [RUN], task_id="t", workspace="w")
    assert entry.judged_by == "llm_judge" and entry.items == []  # an unverified verdict is not enough to keep an attempt
    off = Learner(ScriptedLLM(["no tags at all"]), worked_examples=False)
    entry, _ = await off.learn("What is 12 * 3?", [RUN], task_id="t", workspace="w", verifier=exact_verifier("36"))
    assert entry.items == []


async def test_model_written_items_take_precedence_over_the_worked_example():
    learner = Learner(ScriptedLLM([ITEM.format(t="Multiply carefully")]))
    entry, _ = await learner.learn("What is 12 * 3?", [RUN], task_id="t", workspace="w", verifier=exact_verifier("36"))
    assert [i.title for i in entry.items] == ["Multiply carefully"]


async def test_a_worked_example_of_a_long_attempt_is_clipped_to_fit_an_item():
    long = Trajectory(text="step " * 5000, answer="1")
    learner = Learner(ScriptedLLM(["no tags at all"]))
    entry, _ = await learner.learn("q" * 1000, [long], task_id="t", workspace="w", verifier=exact_verifier("1"))
    [item] = entry.items
    assert len(item.description) <= 500 and len(item.content) <= 4000


async def test_extraction_skips_incomplete_blocks():
    learner = Learner(ScriptedLLM([ITEM.format(t="ok") + "<memory><title>no content</title></memory>"]))
    items = await learner.extract("What is 12 * 3?", RUN, "success", task_id="t", workspace="w")
    assert [i.title for i in items] == ["ok"]


async def test_self_contrast_over_several_trajectories_extracts_at_most_five_items():
    replies = [
        "<status>success</status>",
        "<status>failure</status>",
        "<status>success</status>",
        "".join(ITEM.format(t=f"C{i}") for i in range(4)) + "".join(ERROR_ITEM.format(t=f"E{i}") for i in range(3)),
    ]
    llm = ScriptedLLM(replies)
    runs = [RUN, Trajectory(text="rounded: 35", answer="35"), RUN.model_copy(update={"selected": False})]
    entry, judgements = await Learner(llm).learn("What is 12*3?", runs, task_id="t", workspace="w")
    assert [j.outcome for j in judgements] == ["success", "failure", "success"]
    assert len(entry.items) == 5 and {i.source_type for i in entry.items} == {"contrast"}
    assert entry.outcome == "success"  # the outcome of the selected attempt
    assert "Trajectory 2 (failure)" in llm.requests[-1].messages[1].content
    assert "[trajectory 2 - failure]" in entry.trajectory


def test_passive_thresholds_need_a_substantial_answer():
    assert passive_rejects("What is a monad in Haskell?", "A wrapper.", 100) == "answer shorter than 100 characters"
    assert passive_rejects("What is a monad in Haskell?", "x" * 100, 100) is None
    assert passive_rejects("Hi", "x" * 200, 100) == "question shorter than 10 characters"


# -- memory-aware runs through the API ------------------------------------------------------------
def dispatcher(tmp_path, llm=None, **memory_settings):
    settings = load_settings()
    memory = MemorySettings(**{**settings.memory.model_dump(), **memory_settings})
    bank = make_bank(tmp_path / "bank", **memory_settings)
    rpc = local_dispatcher(settings.reasoning, llm or SimulatedLLM(), data_dir=tmp_path, memory=local_memory(bank), memory_settings=memory)

    async def call(method, params):
        payload, _ = await rpc.handle_payload({"jsonrpc": "2.0", "method": method, "params": params, "id": 1}, None)
        return payload

    return call, bank


async def test_learning_from_task_a_helps_a_similar_task_b_and_never_another_workspace(tmp_path):
    call, _bank = dispatcher(tmp_path)
    a = await call(
        "reasoning.execute",
        {
            "query": "A shop sells 17 * 23 pens; how many pens? [[sim slip=1]]",
            "strategy_config": {"temperature": 0.8},
            "memory": {"learn": True, "task_id": "A", "workspace": "team-1"},
        },
    )
    report = a["result"]["memory"]
    assert report["outcome"] == "failure" and report["judged_by"] == "llm_judge" and report["stored"]
    assert a["result"]["metrics"]["llm_calls"] == 3  # the answer, the judge and the extraction all count
    lesson = await call("memory.get", {"memory_id": report["stored"][0], "workspace": "team-1"})
    assert lesson["result"]["error_context"]["error_type"] == "premature rounding"

    b = await call(
        "reasoning.execute",
        {"query": "A shop sells 17 * 24 pens; how many pens?", "include_trace": True, "memory": {"workspace": "team-1", "task_id": "B"}},
    )
    used = b["result"]["memory"]["retrieved"]
    assert [m["id"] for m in used] == report["stored"] and used[0]["warning"]
    system_prompt = next(e for e in b["result"]["trace"] if e["type"] == "LLM_INVOCATION")["messages"][0]["content"]
    assert "[WARNING: past failure] Keep intermediate results exact" in system_prompt
    assert b["result"]["answer"] == "408"

    c = await call(
        "reasoning.execute", {"query": "A shop sells 17 * 24 pens; how many pens?", "memory": {"workspace": "team-2", "task_id": "C"}}
    )
    assert c["result"]["memory"]["retrieved"] == []
    again = await call(
        "reasoning.execute", {"query": "A shop sells 17 * 23 pens; how many pens?", "memory": {"workspace": "team-1", "task_id": "A"}}
    )
    assert again["result"]["memory"]["retrieved"] == []  # a task never sees its own memories


async def test_an_expected_answer_makes_the_verifier_judge(tmp_path):
    call, _ = dispatcher(tmp_path)
    r = await call("reasoning.execute", {"query": "What is 6 * 7?", "memory": {"learn": True, "expected_answer": "42"}})
    assert (r["result"]["memory"]["outcome"], r["result"]["memory"]["judged_by"]) == ("success", "verifier")
    wrong = await call("reasoning.execute", {"query": "What is 6 * 8?", "memory": {"learn": True, "expected_answer": "47"}})
    assert wrong["result"]["memory"]["outcome"] == "failure"


async def test_a_model_that_writes_no_items_still_learns_worked_examples_the_next_similar_task_retrieves(tmp_path):
    llm = ScriptedLLM(
        [
            "<thinking>6*7 = 42</thinking><answer>42</answer>",
            "Good job.",  # the extraction: no <memory> block
            "<thinking>6*8</thinking><answer>48</answer>",
        ]
    )
    call, _ = dispatcher(tmp_path, llm)
    first = await call("reasoning.execute", {"query": "What is 6 * 7?", "memory": {"learn": True, "expected_answer": "42", "task_id": "a"}})
    report = first["result"]["memory"]
    assert report["outcome"] == "success" and len(report["stored"]) == 1
    second = await call("reasoning.execute", {"query": "What is 6 * 8?", "include_trace": True, "memory": {"task_id": "b"}})
    assert [m["id"] for m in second["result"]["memory"]["retrieved"]] == report["stored"]
    system_prompt = next(e for e in second["result"]["trace"] if e["type"] == "LLM_INVOCATION")["messages"][0]["content"]
    assert "### Worked example" in system_prompt and "6*7 = 42" in system_prompt


async def test_a_failed_learning_step_keeps_the_answer_and_stores_nothing(tmp_path):
    llm = ScriptedLLM(["<thinking>6*7</thinking><answer>42</answer>", "no verdict here"])
    call, bank = dispatcher(tmp_path, llm)
    r = await call("reasoning.execute", {"query": "What is 6 * 7?", "memory": {"learn": True, "task_id": "x"}})
    assert r["result"]["answer"] == "42"
    assert "ModelBehaviorError" in r["result"]["memory"]["learn_error"] and r["result"]["memory"]["stored"] == []
    assert bank.list_workspaces() == []


async def test_passive_learning_captures_long_answers_only_and_tags_the_source(tmp_path):
    long = "A monad is a type with bind and return obeying three laws; it sequences computations " * 2
    llm = ScriptedLLM([f"<answer>{long}</answer>", ITEM.format(t="Explain monads by their laws"), "<answer>Short.</answer>"])
    call, bank = dispatcher(tmp_path, llm, passive_learning=True)
    r = await call("reasoning.execute", {"query": "What is a monad in Haskell?"})
    assert r["result"]["memory"]["passive"] == "captured"
    [stored] = r["result"]["memory"]["stored"]
    assert bank.get(stored, workspace="default").source_type == "passive"
    short = await call("reasoning.execute", {"query": "What is a functor in Haskell?"})
    assert short["result"]["memory"]["passive"] == "skipped: answer shorter than 100 characters"
    stats = (await call("stats.get", {}))["result"]
    assert stats["passive_learning"] == {"captured": 1, "skipped": 1}
    llm.assert_complete()


async def test_matts_learns_by_self_contrast_across_all_attempts(tmp_path):
    call, bank = dispatcher(tmp_path)
    r = await call(
        "reasoning.execute",
        {
            "query": "What is 19 * 21? [[sim slip=0.5]]",
            "strategy": "matts",
            "strategy_config": {"k": 4},
            "memory": {"learn": True, "task_id": "m"},
        },
    )
    assert r["result"]["metrics"]["strategy_specific"]["k"] == 4
    items = [bank.get(i, workspace="default") for i in r["result"]["memory"]["stored"]]
    assert items and len(items) <= 5 and {i.source_type for i in items} == {"contrast"}
    [trace] = bank.store.traces("default", "m")
    assert trace["trajectory"].count("[trajectory ") == 4


async def test_memory_parameters_are_validated(tmp_path):
    call, _ = dispatcher(tmp_path)
    bad = await call("reasoning.execute", {"query": "q", "memory": {"workspace": "Bad Name!"}})
    assert bad["error"]["code"] == -32602 and "workspace" in bad["error"]["message"]
    unknown = await call("reasoning.execute", {"query": "q", "memory": {"lern": True}})
    assert unknown["error"]["code"] == -32602


async def test_without_a_memory_bank_memory_requests_are_refused_clearly(tmp_path):
    settings = load_settings()
    rpc = local_dispatcher(settings.reasoning, SimulatedLLM(), data_dir=tmp_path)
    payload, _ = await rpc.handle_payload(
        {"jsonrpc": "2.0", "method": "reasoning.execute", "params": {"query": "What is 1+1?", "memory": {}}, "id": 1}, None
    )
    assert payload["error"]["code"] == -32002 and "no memory bank" in payload["error"]["message"]
