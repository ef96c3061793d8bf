"""Tree of thought with a strict model that knows the tree: every proposal and score is scripted by path."""

import re

import pytest

from reasonray.gateway.simulator.inprocess import SimulatedLLM
from reasonray.gateway.testing import FunctionLLM, UnexpectedCall
from reasonray.kernel.errors import InvalidParamsError
from reasonray.strategies.tree_of_thought import (
    ANSWER_PROMPT,
    PROPOSE_PROMPT,
    VALUE_PROMPT,
    VOTE_PROMPT,
    TreeOfThought,
)
from tests.unit.strategy_harness import context_for


def path_of(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"^Step \d+: (.*)$", text, re.MULTILINE)) + tuple(re.findall(r"^Answer: (.*)$", text, re.MULTILINE))


class TreeModel(FunctionLLM):
    """Proposals by (path, seed) and scores by path; any other call fails the test."""

    def __init__(self, proposals, scores, votes=None, final=None):
        super().__init__(self.reply, model="tree")
        self.proposals, self.scores, self.votes, self.final = proposals, scores, votes or {}, final

    def reply(self, request):
        system, prompt = request.messages[0].content, request.messages[1].content
        if system == PROPOSE_PROMPT:
            key = (path_of(prompt), request.seed)
            if key not in self.proposals:
                raise UnexpectedCall(f"proposal not scripted: {key}")
            return self.proposals[key]
        if system == VALUE_PROMPT:
            assert request.temperature == 0.0
            return f"<score>{self.scores[path_of(prompt)]}</score>"
        if system == VOTE_PROMPT:
            return f"<vote>{self.votes[request.seed]}</vote>"
        if system == ANSWER_PROMPT and self.final is not None:
            assert "give your final answer now" in prompt
            return f"<answer>{self.final}</answer>"
        raise UnexpectedCall(f"unexpected call: {system[:40]}")


def step(text):
    return f"<thinking>hmm</thinking><step>{text}</step>"


def answer(text):
    return f"<thinking>so</thinking><answer>{text}</answer>"


async def run(model, **config):
    ctx, recorder = context_for(model, strategy="tree_of_thought")
    result = await TreeOfThought().reason("Make 24 from 4 4 6 8", context=ctx, config=config)
    return result, recorder.events


async def test_bfs_keeps_the_beam_prunes_low_scores_and_stops_at_the_best_answer():
    model = TreeModel(
        proposals={
            ((), 0): step("4 + 8 = 12"),
            ((), 1): step("Step 1: 4 * 6 = 24"),
            ((), 2): step("8 - 6 = 2"),
            (("4 + 8 = 12",), 0): answer("13"),
            (("4 + 8 = 12",), 1): answer("12 * 2 = 24"),
            (("4 + 8 = 12",), 2): answer("13"),
            (("4 * 6 = 24",), 0): answer("24"),
            (("4 * 6 = 24",), 1): answer("24"),
            (("4 * 6 = 24",), 2): answer("24"),
        },
        scores={
            ("4 + 8 = 12",): 0.7,
            ("4 * 6 = 24",): 0.8,
            ("8 - 6 = 2",): 0.3,
            ("4 + 8 = 12", "13"): 0.1,
            ("4 + 8 = 12", "12 * 2 = 24"): 0.85,
            ("4 * 6 = 24", "24"): 0.95,
        },
    )
    result, events = await run(model, breadth=3, beam_width=2, depth=3)
    # duplicate proposals under one parent ("13" twice, "24" three times) become one node each
    assert result.answer == "24"
    specific = result.metrics.strategy_specific
    assert specific["solution_path"] == ["0.1", "0.1.0"]
    assert specific["solution_steps"] == ["4 * 6 = 24"]  # "Step 1:" prefixes are not doubled
    assert specific["nodes_evaluated"] == 6 and specific["pruned"] == 2 and specific["fallback"] is None
    tree = {n["id"]: n for n in specific["tree"]}
    assert tree["0.2"]["status"] == "pruned" and tree["0.2"]["score"] == 0.3
    thoughts = [e for e in events if type(e).__name__ == "ThoughtNode"]
    assert thoughts[-1].status == "answer" and thoughts[-1].node_id == "0.1.0"
    assert {t.parent_id for t in thoughts} <= {"0"} | {t.node_id for t in thoughts}  # the events form one tree


async def test_dfs_backtracks_out_of_a_dead_subtree():
    model = TreeModel(
        proposals={
            ((), 0): step("a"),
            ((), 1): step("b"),
            (("a",), 0): step("a1"),
            (("a",), 1): step("a2"),
            (("a", "a1"), 0): answer("wrong"),
            (("a", "a1"), 1): answer("also wrong"),
            (("b",), 0): answer("right"),
            (("b",), 1): answer("right"),
        },
        scores={
            ("a",): 0.9,
            ("b",): 0.6,
            ("a", "a1"): 0.7,
            ("a", "a2"): 0.2,
            ("a", "a1", "wrong"): 0.3,
            ("a", "a1", "also wrong"): 0.1,
            ("b", "right"): 0.9,
        },
    )
    result, _ = await run(model, search="dfs", breadth=2, depth=3)
    assert result.answer == "right"
    specific = result.metrics.strategy_specific
    assert specific["solution_path"] == ["0.1", "0.1.0"]
    order = [n["id"] for n in specific["tree"]]
    assert order.index("0.0.0.0") < order.index("0.1.0")  # "a" (best) was explored to the bottom first


async def test_vote_scores_are_vote_shares_and_unvoted_siblings_are_pruned():
    model = TreeModel(
        proposals={((), 0): answer("7"), ((), 1): answer("8"), ((), 2): answer("9")},
        scores={},
        votes={0: 2, 1: 2, 2: 1},
    )
    result, _ = await run(model, evaluation="vote", votes=3, breadth=3, depth=1)
    assert result.answer == "8"
    scores = {n["id"]: (n["score"], n["status"]) for n in result.metrics.strategy_specific["tree"]}
    assert scores == {"0.0": (0.3333, "kept"), "0.1": (0.6667, "answer"), "0.2": (0.0, "pruned")}


async def test_a_search_without_any_answer_asks_for_one_along_the_best_path():
    model = TreeModel(
        proposals={((), 0): step("x"), (("x",), 0): step("y")},
        scores={("x",): 0.9, ("x", "y"): 0.8},
        final="42",
    )
    result, _ = await run(model, breadth=1, depth=2)
    assert result.answer == "42"
    assert result.metrics.strategy_specific["fallback"] == "final_answer_call"
    assert result.metrics.strategy_specific["solution_steps"] == ["x", "y"]


@pytest.mark.parametrize("final", ["The search ended here: give your final answer now.", "now inside the specified format"])
async def test_a_final_reply_without_a_number_takes_the_best_paths_own_number(final):
    # SmolLM2-135M's final replies on single-digit sums: the instruction echoed, or words in the answer field
    class Echo(TreeModel):
        def reply(self, request):
            if request.messages[0].content == ANSWER_PROMPT:
                return final
            return super().reply(request)

    model = Echo(proposals={((), 0): step("2 + 6 = 8")}, scores={("2 + 6 = 8",): 0.7})
    ctx, _ = context_for(model, strategy="tree_of_thought")
    result = await TreeOfThought().reason("What is 2 + 6?", context=ctx, config={"breadth": 1, "depth": 1})
    specific = result.metrics.strategy_specific
    assert result.answer == "8" and specific["fallback"] == "final_answer_call" and specific["found_by"] == "best_path_number"


async def test_a_final_reply_that_names_a_number_is_kept_over_the_path():
    model = TreeModel(proposals={((), 0): step("2 + 6 = 8")}, scores={("2 + 6 = 8",): 0.7}, final="9")
    ctx, _ = context_for(model, strategy="tree_of_thought")
    result = await TreeOfThought().reason("What is 2 + 6?", context=ctx, config={"breadth": 1, "depth": 1})
    assert result.answer == "9" and result.metrics.strategy_specific["found_by"] == "tag"


async def test_unparsable_replies_are_counted_not_fatal_and_budget_is_respected():
    model = TreeModel(
        proposals={((), 0): "<thinking>no idea</thinking>", ((), 1): step("x"), ((), 2): step("z"), (("z",), 0): answer("5")},
        scores={("x",): "not a number", ("z",): 0.9, ("z", "5"): 0.9},
    )
    result, _ = await run(model, breadth=3, depth=2, max_nodes=3)
    specific = result.metrics.strategy_specific
    assert specific["nodes_evaluated"] == 3  # the budget left room for one proposal on the second level
    assert specific["unparsed_replies"] == 2  # one proposal with nothing visible, one score without a number
    assert result.answer == "5" and specific["unscored"] == 1
    # the unscored node is kept (it cannot be judged below the threshold) but ranks behind the scored one
    assert {n["id"]: (n["status"], n["score"]) for n in specific["tree"]}["0.0"] == ("kept", None)


class DisobedientTree(FunctionLLM):
    """A model that ignores every format, as SmolLM2-135M does: prose proposals, scores as 'Score: 7/10' or none."""

    def __init__(self, scores):
        super().__init__(self.reply, model="disobedient")
        self.scores = scores

    def reply(self, request):
        system, prompt = request.messages[0].content, request.messages[1].content
        if system == PROPOSE_PROMPT:
            if "Step 1:" in prompt:
                return "17 * 23 = 391, so the answer is: 391."
            return f"First, multiply 17 by 20 to get 340 (try {request.seed}).\nThen add 17 * 3 = 51.\n\nThat gives 391."
        if system == VALUE_PROMPT:
            return self.scores(prompt)
        raise UnexpectedCall(f"unexpected call: {system[:40]}")


async def test_a_model_that_ignores_the_tags_still_drives_the_search():
    model = DisobedientTree(lambda prompt: "Score: 7/10" if "try 1" in prompt or "Answer:" in prompt else "The step is fine.")
    ctx, recorder = context_for(model, strategy="tree_of_thought")
    result = await TreeOfThought().reason("What is 17 * 23?", context=ctx, config={"breadth": 2, "depth": 3})
    s = result.metrics.strategy_specific
    assert result.answer == "391" and s["fallback"] is None and s["found_by"] == "phrase"
    assert s["nodes_evaluated"] > 0 and s["untagged_proposals"] == s["nodes_evaluated"]
    # the free-text step is the proposal's first paragraph; the scored node leads the beam
    assert s["solution_steps"] == ["First, multiply 17 by 20 to get 340 (try 1).\nThen add 17 * 3 = 51."]
    tree = {n["id"]: n for n in s["tree"]}
    assert tree["0.0"]["score"] is None and tree["0.1"]["score"] == 0.7 and s["unscored"] >= 1
    assert any(e.status == "answer" for e in recorder.events if type(e).__name__ == "ThoughtNode")


async def test_votes_in_prose_are_read():
    model = TreeModel(proposals={((), 0): step("a"), ((), 1): step("b")}, scores={}, final="9")

    def reply(request, inner=model.reply):
        if request.messages[0].content == VOTE_PROMPT:
            return "Candidate 2 looks most promising."
        return inner(request)

    model._fn = reply
    result, _ = await run(model, breadth=2, depth=1, evaluation="vote", votes=2)
    tree = {n["id"]: (n["score"], n["status"]) for n in result.metrics.strategy_specific["tree"]}
    assert tree == {"0.0": (0.0, "pruned"), "0.1": (1.0, "kept")} and result.metrics.strategy_specific["solution_steps"] == ["b"]


async def test_an_endpoint_that_enforces_a_schema_is_asked_for_json_steps_and_scores():
    from reasonray.gateway.capabilities import Capabilities

    def reply(request):
        name = request.response_format["json_schema"]["name"]
        if name == "step":
            done = "Step 1:" in request.messages[1].content
            return '{"step": "", "answer": "391"}' if done else '{"step": "17*23 = 340 + 51", "answer": ""}'
        assert name == "score"
        return '{"score": 0.9}'

    llm = FunctionLLM(reply)
    llm.capabilities = Capabilities(structured_output=True)
    ctx, _ = context_for(llm, strategy="tree_of_thought")
    result = await TreeOfThought().reason("What is 17 * 23?", context=ctx, config={"breadth": 1, "depth": 2})
    s = result.metrics.strategy_specific
    assert result.answer == "391" and s["found_by"] == "json" and s["solution_steps"] == ["17*23 = 340 + 51"]


async def test_config_limits_are_enforced_with_their_names():
    ctx, _ = context_for(TreeModel({}, {}))
    with pytest.raises(InvalidParamsError, match="breadth: Input should be less than or equal to 8"):
        await TreeOfThought().reason("q", context=ctx, config={"breadth": 9})
    with pytest.raises(InvalidParamsError, match="search: Input should be 'bfs' or 'dfs'"):
        await TreeOfThought().reason("q", context=ctx, config={"search": "astar"})


async def test_on_the_simulator_the_search_avoids_slipped_steps():
    """With half the sampled steps slipping, the evaluator prunes them and the answer is right."""
    for search in ("bfs", "dfs"):
        ctx, _ = context_for(SimulatedLLM(), strategy="tree_of_thought")
        result = await TreeOfThought().reason("What is 17 * 23? [[sim slip=0.5]]", context=ctx, config={"search": search})
        assert result.answer == "391", search
        assert result.metrics.strategy_specific["pruned"] >= 1 and result.metrics.simulated


# --- a failed branch is dropped; a level with nothing fails the run ---


def provider_down():
    from reasonray.gateway.errors import ProviderUnavailableError

    return ProviderUnavailableError("the model provider failed after 3 attempt(s) (HTTP 500); retry later", attempts=3)


class FailingTree(TreeModel):
    """A TreeModel whose scores and votes may be errors too."""

    def reply(self, request):
        system, prompt = request.messages[0].content, request.messages[1].content
        if system == VALUE_PROMPT and isinstance(self.scores.get(path_of(prompt)), Exception):
            return self.scores[path_of(prompt)]
        if system == VOTE_PROMPT and isinstance(self.votes.get(request.seed), Exception):
            return self.votes[request.seed]
        return super().reply(request)


async def test_a_failed_proposal_is_dropped_and_the_search_goes_on():
    model = FailingTree(
        proposals={
            ((), 0): provider_down(),
            ((), 1): step("4 * 6 = 24"),
            (("4 * 6 = 24",), 0): answer("24"),
            (("4 * 6 = 24",), 1): answer("24"),
        },
        scores={("4 * 6 = 24",): 0.8, ("4 * 6 = 24", "24"): 0.9},
    )
    result, _ = await run(model, breadth=2, depth=2)
    specific = result.metrics.strategy_specific
    assert result.answer == "24" and specific["branches_failed"] == 1 and specific["failures"] == {"provider_unavailable": 1}
    assert specific["unparsed_replies"] == 0  # a failed call is not an unusable reply


async def test_a_level_whose_every_proposal_failed_fails_the_run_with_the_first_error():
    from reasonray.gateway.errors import ProviderUnavailableError

    model = FailingTree(proposals={((), 0): provider_down(), ((), 1): provider_down()}, scores={})
    with pytest.raises(ProviderUnavailableError, match="HTTP 500"):
        await run(model, breadth=2, depth=2)


async def test_a_failed_value_call_leaves_its_node_unscored():
    model = FailingTree(
        proposals={((), 0): answer("24"), ((), 1): answer("25")},
        scores={("24",): provider_down(), ("25",): 0.3},
    )
    result, _ = await run(model, breadth=2, depth=1)
    specific = result.metrics.strategy_specific
    tree = {n["id"]: (n["score"], n["status"]) for n in specific["tree"]}
    assert tree == {"0.0": (None, "answer"), "0.1": (0.3, "pruned")}  # unscored: kept, where 0.3 is below the threshold
    assert result.answer == "24" and specific["branches_failed"] == 1 and specific["unscored"] == 1


async def test_a_failed_vote_is_not_cast_and_the_shares_are_of_the_votes_cast():
    model = FailingTree(proposals={((), 0): answer("7"), ((), 1): answer("8")}, scores={}, votes={0: 2, 1: provider_down(), 2: 2})
    result, _ = await run(model, evaluation="vote", votes=3, breadth=2, depth=1)
    scores = {n["id"]: n["score"] for n in result.metrics.strategy_specific["tree"]}
    assert result.answer == "8" and scores == {"0.0": 0.0, "0.1": 1.0}
    assert result.metrics.strategy_specific["branches_failed"] == 1
