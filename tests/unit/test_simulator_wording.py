"""The simulated model never recognises a strategy's wording.

Every prompt and template of the strategies (and of the memory learner) is replaced with different
wording: other instructions that name no reply tag, other labels, other numbering. Each strategy then
runs over the simulator once with the original prompts and once with the reworded ones; what the
simulator replied, and so every answer and metric, must be the same. Only the request's `purpose`,
its stop sequences, the directives and the structure of what a prompt shows drive the simulator.
"""

from __future__ import annotations

from typing import Any

import pytest

from reasonray.gateway.protocol import Completion, LLMRequest
from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.memory import learning
from reasonray.memory.items import Trajectory
from reasonray.strategies import (
    bounded_context,
    chain_of_thought,
    matts,
    react,
    refine,
    tree_of_thought,
)
from reasonray.strategies.bounded_context import BoundedContext
from reasonray.strategies.chain_of_thought import ChainOfThought
from reasonray.strategies.matts import Matts
from reasonray.strategies.react import ReAct
from reasonray.strategies.refine import Refine
from reasonray.strategies.self_consistency import SelfConsistency
from reasonray.strategies.tree_of_thought import TreeOfThought
from tests.unit.strategy_harness import context_for

COT_PROMPT = "Work the question out carefully, keep your scratch work in thinking tags, and end with the result in answer tags."
REACT_PROMPT = "Use the tools you are given whenever they help; finish with the result wrapped in answer tags and no tool call."

REWORDED: dict[tuple[Any, str], str] = {
    (bounded_context, "INSTRUCTIONS"): "Reason in plain prose. Scratch work goes in thinking tags; the result goes in answer tags. "
    "When room runs out, write the resume marker and you will carry on later.",
    (bounded_context, "SUMMARY_INSTRUCTIONS"): "Squeeze the reasoning below into a short note with the approach, what was found, "
    "how far it got, what comes next and what is still open.",
    (bounded_context, "FINAL_INSTRUCTION"): "Time is up: reply with nothing but the result, wrapped in answer tags.",
    (bounded_context, "TAIL_MEMORY"): "Opening of your notes:\n{head}\n(...)\nLatest notes:\n{carryover}",
    (bounded_context, "SUMMARY_MEMORY"): "Your notes so far:\n{carryover}",
    (bounded_context, "CONTINUE_PROMPT"): "{query}\n\n=== notes ===\n{memory}\n=== carry on ===",
    (bounded_context, "FINAL_PROMPT"): "{prompt}\n\n*** {instruction} ***",
    (bounded_context, "SUMMARY_FRAME"): "The task: {query}\n\nEarlier note:\n{carryover}\n\nNewest reasoning:\n",
    (bounded_context, "NO_CARRYOVER"): "nothing yet",
    (tree_of_thought, "PROPOSE_PROMPT"): "Continue the partial solution by exactly one move, in step tags, or, if it is already "
    "settled, write the result in answer tags.",
    (tree_of_thought, "VALUE_PROMPT"): "Rate how promising the partial solution is, zero to one, in score tags.",
    (tree_of_thought, "VOTE_PROMPT"): "Pick the option most likely to succeed and write its number in vote tags.",
    (tree_of_thought, "ANSWER_PROMPT"): "Reply with the result alone, in answer tags.",
    (tree_of_thought, "PATH_HEADER"): "Task -- {query}\n\nWork so far:",
    (tree_of_thought, "STEP_LINE"): "{number}. {step}",
    (tree_of_thought, "NO_STEPS"): "nothing yet",
    (tree_of_thought, "ANSWER_LINE"): "Therefore the result is {answer}.",
    (tree_of_thought, "CANDIDATE"): "Option #{number} --\n{path}",
    (tree_of_thought, "VOTE_LISTING"): "Task -- {query}\n\n{candidates}",
    (tree_of_thought, "FINAL_PROMPT"): "{path}\n\nNo more exploring: state the result.",
    (refine, "SYSTEM_PROMPT"): COT_PROMPT,
    (refine, "EVALUATE_PROMPT"): "Review the attempt strictly. Rate it zero to one in score tags and say what to change in feedback tags.",
    (refine, "REFINE_PROMPT"): "Look at your earlier attempt again with the review in mind; fix it, then give the result in answer tags.",
    (refine, "EVALUATE_TEMPLATE"): "{query}\n\nAn attempt at it:\n{solution}\nIts result: {answer}",
    (refine, "REFINE_TEMPLATE"): "{query}\n\nYour earlier attempt:\n{solution}\n(result {answer})\n\nReview, {score}: {feedback}",
    (refine, "NO_FEEDBACK"): "nothing to add",
    (matts, "REEXAMINE_PROMPT"): "Go over your earlier attempt once more; correct it if needed and give the result in answer tags.",
    (matts, "SELECT_PROMPT"): "Which of these attempts is right? Write its number in vote tags.",
    (matts, "REEXAMINE_TEMPLATE"): "{query}\n\nYour earlier attempt:\n{solution}\n(result {answer})",
    (matts, "CANDIDATE"): "({number}) attempt\n{solution}\nso the result is {answer}",
    (matts, "SELECT_TEMPLATE"): "{query}\n\n{candidates}",
    (react, "SYSTEM_PROMPT"): REACT_PROMPT,
}
REWORDED_LEARNING: dict[str, str] = {
    "JUDGE_PROMPT": "Did the agent get the task right? Explain, then give your verdict in status tags.",
    "SUCCESS_PROMPT": "Say in up to {n} memory blocks what made this attempt work.",
    "FAILURE_PROMPT": "Say in up to {n} memory blocks, each with the kind of error, why this attempt went wrong.",
    "CONTRAST_PROMPT": "Compare the attempts below and write up to {n} memory blocks on what separates them.",
    "PASSIVE_PROMPT": "Keep what is worth keeping from this exchange in up to {n} memory blocks.",
    "JUDGE_TEMPLATE": "The task was {query}\n\nWhat the agent did:\n{trajectory}\n\nIt concluded {answer}",
    "EXTRACT_TEMPLATE": "The task was {query}\n\nWhat the agent did, a {outcome}:\n{trajectory}\n\nIt concluded {answer}",
    "CONTRAST_ITEM": "Attempt {number} [{outcome}]\n{trajectory}\nIt concluded {answer}",
    "CONTRAST_TEMPLATE": "The task was {query}\n\n{trajectories}",
    "PASSIVE_TEMPLATE": "Someone asked: {question}\n\nThey were told:\n{answer}",
}
# Labels and instructions the original prompts use: none may reach the simulator in the reworded runs.
# (User messages also show back what the simulator wrote, e.g. a summary's "Current Strategy:" line or
# its "Step 1:" sentences: those are its own words, so they are checked in system messages only.)
ORIGINAL_LABELS = (
    "give your final answer now",
    "Candidate",
    "Answer:",
    "Problem:",
    "Steps so far",
    "(none)",
    "Trajectory",
    "Question:",
    "Task:",
    "Previous attempt",
    "Proposed solution",
    "reasoning so far",
    "Continue from here",
)
ORIGINAL_INSTRUCTIONS = ("Current Strategy", "Think step by step", "step by step inside", "<step>", "<score>", "<vote>", "<feedback>")
ORIGINAL_INSTRUCTIONS += ("<status>", "<memory>", "<continue>", "<error_type>", "<answer>")


class Recording(SimulatedLLM):
    """The in-process simulator, keeping every request and reply."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[LLMRequest, str]] = []

    async def complete(self, request: LLMRequest) -> Completion:
        completion = await super().complete(request)
        self.calls.append((request, completion.text))
        return completion


def cot_resolver(name: str, config: dict[str, Any]) -> tuple[ChainOfThought, dict[str, Any]]:
    assert name == "chain_of_thought"
    return ChainOfThought(), config


TIMING = {"attempts_ms", "selection_ms"}
REWORDED_BASE = {"base_config": {"system_prompt": COT_PROMPT}}
# (id, strategy, query, config, config only for the reworded run, keys compared when token budgets shift)
CASES = [
    (
        "bounded_context-tail-answers",
        BoundedContext,
        "[[sim think=2500 answer=7]] Think it through.",
        {"chunk_size": 2048, "carryover_size": 1024, "max_iterations": 4},
        {},
        ("stopped_by", "total_iterations", "carryover_compressions", "carryover_fallbacks"),
    ),
    (
        "bounded_context-summary-final-answer",
        BoundedContext,
        "[[sim think=9000 answer=7]] Think it through.",
        {"chunk_size": 2048, "carryover_size": 1024, "max_iterations": 3, "carryover_mode": "summary", "on_max_iterations": "final_answer"},
        {},
        ("stopped_by", "total_iterations", "carryover_compressions", "carryover_fallbacks"),
    ),
    ("self_consistency", SelfConsistency, "What is 17 * 23? [[sim slip=0.4]]", {"samples": 7}, {"system_prompt": COT_PROMPT}, None),
    ("tree_of_thought-value-bfs", TreeOfThought, "What is 6 * 7? [[sim slip=0.4 steps=2]]", {"breadth": 3}, {}, None),
    (
        "tree_of_thought-vote-dfs",
        TreeOfThought,
        "What is 6 * 7? [[sim slip=0.4 steps=2]]",
        {"evaluation": "vote", "search": "dfs", "votes": 3},
        {},
        None,
    ),
    ("tree_of_thought-vote-bfs", TreeOfThought, "What is 6 * 7? [[sim slip=0.5 steps=1]]", {"evaluation": "vote", "breadth": 4}, {}, None),
    ("tree_of_thought-final-answer", TreeOfThought, "What is 6 * 7? [[sim steps=3]]", {"depth": 2, "breadth": 2}, {}, None),
    ("refine", Refine, "What is 17 * 23? [[sim slip=1]]", {"temperature": 0.9, "seed": 1}, {}, None),
    ("matts-contrast", Matts, "What is 17 * 23? [[sim slip=0.5]]", {"k": 5, "selection": "contrast"}, REWORDED_BASE, None),
    ("matts-judge", Matts, "What is 17 * 23? [[sim slip=0.5]]", {"k": 5, "selection": "judge"}, REWORDED_BASE, None),
    ("matts-sequential", Matts, "What is 17 * 23? [[sim slip=1]]", {"k": 3, "mode": "sequential"}, REWORDED_BASE, None),
    (
        "react",
        ReAct,
        'Powers of two [[sim call=calculator {"expression": "2**10"}]] [[sim call=calculator {"expression": "3*7"}]]',
        {"tools": ["calculator"]},
        {"system_prompt": REACT_PROMPT},
        None,
    ),
]


# Over the simulator every case reaches the right answer, slips and all (the checks see through them).
RIGHT = {"bounded_context": "7", "self_consistency": "391", "tree_of_thought": "42", "refine": "391", "matts": "391", "react": "21"}


async def run(strategy_cls: type, query: str, config: dict[str, Any]) -> tuple[Any, Recording]:
    llm = Recording()
    context, _ = context_for(llm, strategy=strategy_cls.name)
    context.resolve = cot_resolver
    result = await strategy_cls().reason(query, context=context, config=config)
    return result, llm


def reword(monkeypatch: pytest.MonkeyPatch) -> None:
    for (module, name), text in REWORDED.items():
        assert hasattr(module, name), f"{module.__name__}.{name} is gone: update the rewording"
        monkeypatch.setattr(module, name, text)
    for name, text in REWORDED_LEARNING.items():
        assert hasattr(learning, name), f"learning.{name} is gone: update the rewording"
        monkeypatch.setattr(learning, name, text)


def authored(request: LLMRequest) -> str:
    return "\n".join(m.content or "" for m in request.messages if m.role in ("system", "user"))


def assert_reworded(llm: Recording) -> None:
    for request, _ in llm.calls:
        system_text = "\n".join(m.content or "" for m in request.messages if m.role == "system")
        assert not [w for w in (*ORIGINAL_LABELS, *ORIGINAL_INSTRUCTIONS) if w in system_text], system_text
        assert not [w for w in ORIGINAL_LABELS if w in authored(request)], authored(request)


@pytest.mark.parametrize(
    ("strategy_cls", "query", "config", "reworded_config", "compared"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_rewording_a_strategy_changes_nothing_the_simulator_does(
    monkeypatch: pytest.MonkeyPatch,
    strategy_cls: type,
    query: str,
    config: dict[str, Any],
    reworded_config: dict[str, Any],
    compared: tuple[str, ...] | None,
) -> None:
    original, original_llm = await run(strategy_cls, query, config)
    reword(monkeypatch)
    reworded, reworded_llm = await run(strategy_cls, query, {**config, **reworded_config})

    assert_reworded(reworded_llm)
    assert [authored(r) for r, _ in reworded_llm.calls] != [authored(r) for r, _ in original_llm.calls]
    assert [r.purpose for r, _ in reworded_llm.calls] == [r.purpose for r, _ in original_llm.calls]
    assert reworded.answer == original.answer == RIGHT[strategy_cls.name]
    assert reworded.metrics.llm_calls == original.metrics.llm_calls
    ours, theirs = original.metrics.strategy_specific, reworded.metrics.strategy_specific
    if compared is None:  # no budget depends on the prompt's length: every reply is the same, word for word
        assert [text for _, text in reworded_llm.calls] == [text for _, text in original_llm.calls]
        assert reworded.metrics.completion_tokens == original.metrics.completion_tokens
        assert {k: v for k, v in theirs.items() if k not in TIMING} == {k: v for k, v in ours.items() if k not in TIMING}
    else:  # bounded_context sizes each chunk from what its prompt leaves: the replies' lengths may shift a little
        assert {k: theirs[k] for k in compared} == {k: ours[k] for k in compared}
        assert [(i["has_answer"], i["stop"]) for i in theirs["iterations"]] == [(i["has_answer"], i["stop"]) for i in ours["iterations"]]


def test_the_cases_cover_every_strategy_that_once_depended_on_wording() -> None:
    covered = {c[1].name for c in CASES}
    assert {"bounded_context", "self_consistency", "tree_of_thought", "refine", "matts", "react"} <= covered
    # and they exercise every purpose the strategies declare, plus the final-answer fallbacks
    assert {c[0] for c in CASES} >= {"bounded_context-summary-final-answer", "tree_of_thought-final-answer", "matts-contrast"}


async def test_the_default_chain_of_thought_prompt_is_the_one_the_cases_reword() -> None:
    # self_consistency and refine take chain_of_thought's prompt; the cases reword it through config and refine's import
    assert refine.SYSTEM_PROMPT == chain_of_thought.SYSTEM_PROMPT


async def learn_everything(llm: Recording) -> list[Any]:
    learner = learning.Learner(llm)
    right = Trajectory(text="<thinking>The question asks for 17 * 23. Computing it: 391.</thinking>\n<answer>391</answer>", answer="391")
    slipped = Trajectory(
        text="<thinking>Working quickly, rounding the intermediate result to keep the numbers simple: it comes to 389.</thinking>\n"
        "<answer>389</answer>",
        answer="389",
    )
    wrong = Trajectory(text="<thinking>Reading the problem.</thinking>\n<answer>400</answer>", answer="400")
    query = "What is 17 * 23?"
    outcomes: list[Any] = [await learner.judge(query, t) for t in (right, slipped, wrong)]
    outcomes += [await learner.extract(query, right, "success", task_id="t", workspace="w")]
    outcomes += [await learner.extract(query, t, "failure", task_id="t", workspace="w") for t in (slipped, wrong)]
    for judged in ([(right, "success"), (slipped, "failure")], [(right, "success"), (wrong, "failure")], [(right, "success")] * 2):
        outcomes.append(await learner.contrast(query, judged, task_id="t", workspace="w"))
    answer = "Multiply 17 by 20 to get 340, then 17 by 3 to get 51, and add them: 391. Checking: 23 * 17 is 391 as well."
    outcomes.append(await learner.passive("How do I work out 17 * 23 in my head?", answer, task_id="t", workspace="w"))
    return outcomes


def comparable(outcome: Any) -> Any:
    if isinstance(outcome, learning.Judgement):
        return outcome.outcome
    return [(i.title, i.description, i.content, i.error_context) for i in outcome]


async def test_rewording_the_memory_prompts_changes_nothing_the_simulator_does(monkeypatch: pytest.MonkeyPatch) -> None:
    original_llm, reworded_llm = Recording(), Recording()
    original = await learn_everything(original_llm)
    reword(monkeypatch)
    reworded = await learn_everything(reworded_llm)

    assert_reworded(reworded_llm)
    assert [r.purpose for r, _ in reworded_llm.calls] == [r.purpose for r, _ in original_llm.calls]
    assert [text for _, text in reworded_llm.calls] == [text for _, text in original_llm.calls]
    assert [comparable(o) for o in reworded] == [comparable(o) for o in original]
    # and the simulator judged as a careful checker would, from the structure alone
    assert [o.outcome for o in original[:3]] == ["success", "failure", "failure"]
    contrasts = [[i.title for i in o] for o in original[6:9]]
    assert contrasts == [
        ["Work through the problem step by step", "Keep intermediate results exact"],
        ["Work through the problem step by step", "Verify the final answer"],
        ["Work through the problem step by step"],
    ]
    assert "add them: 391" in original[-1][0].content
