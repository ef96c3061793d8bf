"""Tree of thought (Yao et al., 2023): propose steps, evaluate them, search the tree they form.

A node is a partial solution: the steps from the root. Expanding a node samples `breadth` next
steps (one call each, seeds `seed + i`, so a run repeats); a proposal may instead be the final
answer. Each new node is evaluated, either by **value** (one call scoring the path 0-1, at
temperature 0) or by **vote** (`votes` sampled calls each naming the most promising sibling; the
score is the node's share of the votes). Search is breadth-first with a beam (`beam_width` best
nodes per level, nodes below `prune_threshold` dropped) or depth-first (best child first, pruned
below the threshold, backtracking when a subtree yields nothing). Expansion and evaluation of a
level fan out through the context (Ray tasks behind Serve). Every node is a THOUGHT event, so the
run's trace shows the whole tree; a last THOUGHT event with status "answer" marks the solution.

A model that ignores the tags still drives the search: a proposal without `<step>` or `<answer>`
is an answer when it states one ("The answer is: 76"), else its first paragraph (or first listed
step) is the next step; a value reply without `<score>` is read as "Score: 8/10", "0.8" or "80%",
and one with no readable score leaves the node unscored: kept, but behind every node that scored
above the threshold. Where the endpoint enforces a JSON schema, proposals, values and votes are
asked for as JSON.

A branch that fails (a proposal, a value or a vote call whose provider failed) is dropped: a failed
proposal proposes nothing, a failed value leaves its node unscored, a failed vote is not cast (shares are
of the votes cast). The run fails only when every branch of one fan-out failed (a level has nothing to go
on), with the first failure's error; `branches_failed` and `failures` (by error type) say what was lost.
Cancellation, the deadline and the caller's budget (`RUN_ENDING`) fail the whole run at once.

After each level the run's `progress` holds the best path so far and its score (and the best final
answer seen, if any): what `error.data.partial` carries when the run fails part-way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TypeVar

from pydantic import Field

from reasonray.kernel.errors import ModelBehaviorError
from reasonray.kernel.events import ThoughtNode
from reasonray.kernel.extraction import final_number, find_answer, find_choice, find_score, numeric_question, parse_json_object
from reasonray.kernel.tags import extract_answer, extract_tag, strip_thinking
from reasonray.strategies.base import (
    Branch,
    Failed,
    ReasoningResult,
    Strategy,
    StrategyConfig,
    StrategyContext,
    failure_kinds,
)
from reasonray.strategies.output import ANSWER, SCORE, STEP, VOTE, ask

PROPOSE_PROMPT = (
    "You solve problems one step at a time. Given the problem and the steps so far, write only the "
    "next step inside <step>...</step>. If the steps so far already determine the answer, write only "
    "the final answer inside <answer>...</answer>."
)
VALUE_PROMPT = (
    "You check partial solutions. Judge whether the steps so far are correct and likely to lead to the "
    "right answer. Reply with a number between 0 and 1 inside <score>...</score>; 1 means certainly right."
)
VOTE_PROMPT = (
    "Several candidate partial solutions to one problem follow. Analyse each briefly, then name the most "
    "promising one by its number inside <vote>...</vote>."
)
ANSWER_PROMPT = "Solve the problem. Give only the final answer inside <answer>...</answer>."
# How a path is shown: the problem, its steps (or NO_STEPS), and its answer last when it has one.
PATH_HEADER = "Problem: {query}\n\nSteps so far:"
STEP_LINE = "Step {number}: {step}"
NO_STEPS = "(none)"
ANSWER_LINE = "Answer: {answer}"
CANDIDATE = "Candidate {number}:\n{path}"  # numbered 1, 2, ... in the vote prompt
VOTE_LISTING = "Problem: {query}\n\n{candidates}"
FINAL_PROMPT = "{path}\n\nThe search ended here: give your final answer now."
# "Step 2:", and in untagged proposals the markers of a list ("2. ", "- "), but never a number's own sign or point
_STEP_PREFIX = re.compile(r"^\s*(?:Step \d+\s*[:.)-]\s*|\d+[.)]\s+|[-*]\s+)", re.IGNORECASE)
T = TypeVar("T")
MAX_STEP_CHARS = 2000  # a free-text step is one paragraph, not a whole essay carried into every later prompt


class TreeOfThoughtConfig(StrategyConfig):
    search: Literal["bfs", "dfs"] = Field("bfs", description="bfs: a beam per level; dfs: best child first, with backtracking.")
    breadth: int = Field(3, ge=1, le=8, description="Next steps proposed for each expanded node.")
    depth: int = Field(3, ge=1, le=10, description="Most steps in a solution path.")
    beam_width: int = Field(2, ge=1, le=8, description="bfs: nodes kept per level.")
    evaluation: Literal["value", "vote"] = Field("value", description="value: score each node 0-1; vote: siblings compete for votes.")
    votes: int = Field(3, ge=1, le=8, description="vote: sampled votes per evaluation.")
    prune_threshold: float = Field(0.5, ge=0.0, le=1.0, description="value: nodes scoring below are pruned (vote: nodes with no vote are).")
    max_nodes: int = Field(60, ge=1, le=500, description="Most nodes evaluated in one run, a budget on calls.")
    temperature: float = Field(0.7, ge=0.0, le=2.0, description="Sampling temperature of proposals and votes.")
    seed: int = Field(0, ge=0, description="Seed of the first proposal of each node; proposal i uses seed + i.")
    max_tokens: int = Field(1024, ge=16, le=32_768, description="Most tokens per call.")


@dataclass
class Node:
    id: str
    parent_id: str
    steps: tuple[str, ...]  # the path from the root, thinking stripped
    answer: str | None = None  # set when this node is a final answer rather than a step
    score: float = 0.0
    status: str = "unexplored"
    scored: bool = True  # False: the evaluation gave no readable score (the node is kept, behind scored ones)
    found_by: str = "tag"  # how the proposal was read: tag, json, phrase (an answer in prose) or free_text (a step)

    @property
    def depth(self) -> int:
        return len(self.steps) + (self.answer is not None)

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parent": self.parent_id,
            "depth": self.depth,
            "score": round(self.score, 4) if self.scored else None,
            "status": self.status,
            "is_answer": self.answer is not None,
        }


def render(query: str, steps: tuple[str, ...], answer: str | None = None) -> str:
    lines = [PATH_HEADER.format(query=query)]
    lines += [STEP_LINE.format(number=i, step=step) for i, step in enumerate(steps, 1)] or [NO_STEPS]
    if answer is not None:
        lines.append(ANSWER_LINE.format(answer=answer))
    return "\n".join(lines)


Proposal = tuple[str, bool, str]
"""A proposed next step or final answer: (text, is_answer, how it was read)."""


async def propose(query: str, steps: tuple[str, ...], cfg: TreeOfThoughtConfig, seed: int, context: StrategyContext) -> Proposal | None:
    """One proposed next step, or the final answer, however the reply gives it; None when it holds neither (nothing visible)."""
    shown = render(query, steps)
    completion, enforced = await ask(
        context, STEP, PROPOSE_PROMPT, shown, max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed, purpose="propose"
    )
    text = completion.text
    if answer := extract_answer(text):
        return answer, True, "tag"
    if step := extract_tag(text, "step"):
        return _STEP_PREFIX.sub("", step, count=1), False, "tag"
    if enforced and (obj := parse_json_object(text)) is not None:
        answer, step = str(obj.get("answer") or "").strip(), str(obj.get("step") or "").strip()
        if answer or step:
            return (answer, True, "json") if answer else (_STEP_PREFIX.sub("", step, count=1), False, "json")
    stated = find_answer(text, numeric=numeric_question(query), fallback=False)
    if stated is not None and stated.found_by == "phrase":
        return stated.answer, True, "phrase"
    # the next step in an untagged proposal: its first listed step, else its first paragraph
    first = re.split(r"\n\s*\n", strip_thinking(text).strip(), maxsplit=1)[0].strip()
    lines = [line for line in first.splitlines() if line.strip()]
    if len(lines) > 1 and _STEP_PREFIX.match(lines[0]):
        first = lines[0]
    step = _STEP_PREFIX.sub("", first, count=1).strip()[:MAX_STEP_CHARS]
    return (step, False, "free_text") if step else None


async def value(query: str, node: Node, cfg: TreeOfThoughtConfig, context: StrategyContext) -> float | None:
    """The node's 0-1 score from a temperature-0 judge; None when the reply holds no readable score."""
    shown = render(query, node.steps, node.answer)
    completion, enforced = await ask(context, SCORE, VALUE_PROMPT, shown, max_tokens=cfg.max_tokens, temperature=0.0, purpose="score")
    return find_score(completion.text, structured=enforced)


async def vote(query: str, nodes: list[Node], cfg: TreeOfThoughtConfig, seed: int, context: StrategyContext) -> int | None:
    """The index of the candidate one sampled vote prefers; None for a vote that names none in the list."""
    listing = "\n\n".join(CANDIDATE.format(number=i, path=render(query, n.steps, n.answer)) for i, n in enumerate(nodes, 1))
    shown = VOTE_LISTING.format(query=query, candidates=listing)
    completion, enforced = await ask(
        context, VOTE, VOTE_PROMPT, shown, max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed, purpose="choose"
    )
    return find_choice(completion.text, len(nodes), structured=enforced)


class Search:
    """One run's tree: expansion, evaluation and the bookkeeping both search orders share."""

    def __init__(self, query: str, cfg: TreeOfThoughtConfig, context: StrategyContext, strategy: str) -> None:
        self.query, self.cfg, self.context, self.strategy = query, cfg, context, strategy
        self.nodes: list[Node] = []
        self.unparsed = 0
        self.free_text = 0  # proposals read from untagged prose
        self.failures: list[Exception] = []  # the errors of branches that failed (each dropped, not fatal)

    async def settled(self, branches: Sequence[Branch[T]], label: str) -> list[T | Failed]:
        """The branches' values in order, a `Failed` for one that failed; when every branch failed, the first error.
        A None value is a reply that held no step, answer, score or vote: it counts as unparsed."""
        outcomes = await self.context.fan_out_settled(branches, label=label)
        failed = [o.error for o in outcomes if isinstance(o, Failed)]
        if failed and len(failed) == len(outcomes):
            raise failed[0]  # nothing came back: the search cannot go on
        self.failures += failed
        self.unparsed += sum(o is None for o in outcomes)
        return outcomes

    @property
    def budget_left(self) -> int:
        return self.cfg.max_nodes - len(self.nodes)

    async def expand(self, parents: list[Node], keep: int | None = None) -> list[Node]:
        """Propose `breadth` children per parent (one fan-out), drop duplicates, evaluate them (another); the `keep` best
        that pass the threshold (scored first, best first; stable otherwise) are kept, the others pruned."""
        slots = [(p, i) for p in parents for i in range(self.cfg.breadth)][: max(self.budget_left, 0)]
        branches = [partial(propose, self.query, p.steps, self.cfg, self.cfg.seed + i) for p, i in slots]
        proposals = await self.settled(branches, f"{self.strategy}.expand") if branches else []
        children: list[Node] = []
        seen: set[tuple[str, str, bool]] = set()
        for (parent, _), proposal in zip(slots, proposals, strict=False):
            if proposal is None or isinstance(proposal, Failed):  # a failed proposal, or a reply with neither, proposes nothing
                continue
            text, is_answer, how = proposal
            if (parent.id, text, is_answer) in seen:
                continue
            seen.add((parent.id, text, is_answer))
            self.free_text += how in ("phrase", "free_text")
            index = sum(1 for c in children if c.parent_id == parent.id)
            steps = parent.steps if is_answer else (*parent.steps, text)
            children.append(Node(f"{parent.id}.{index}", parent.id, steps, text if is_answer else None, found_by=how))
        await self.evaluate(children)
        self.nodes += children
        if self.nodes:  # the best path and answer so far, for `error.data.partial` (none parsed yet: the empty shape stands)
            best = max(self.nodes, key=lambda n: (n.depth, n.score))
            answers = [n for n in self.nodes if n.answer is not None and self.passes(n)]
            self.context.progress.update(
                nodes_evaluated=len(self.nodes),
                best_path=_path_ids(best.id),
                best_steps=list(best.steps),
                best_score=round(best.score, 4),
                answer=max(answers, key=lambda n: n.score).answer if answers else None,
            )
        ranked = sorted(children, key=lambda n: (not n.scored, -n.score))
        kept = [n for n in ranked if self.passes(n)][:keep]
        for node in ranked:
            self.record(node, "kept" if node in kept else "pruned")
        return kept

    async def evaluate(self, nodes: list[Node]) -> None:
        if not nodes:
            return
        label = f"{self.strategy}.evaluate"
        if self.cfg.evaluation == "value":
            scores = await self.settled([partial(value, self.query, n, self.cfg) for n in nodes], label)
            for node, outcome in zip(nodes, scores, strict=False):
                score = None if isinstance(outcome, Failed) else outcome  # a failed value call scores as missing
                node.score, node.scored = score or 0.0, score is not None
            return
        outcomes = await self.settled([partial(vote, self.query, nodes, self.cfg, self.cfg.seed + v) for v in range(self.cfg.votes)], label)
        ballots = [b for b in outcomes if not isinstance(b, Failed)]  # a failed vote is not cast
        for index, node in enumerate(nodes):
            node.score = sum(b == index for b in ballots) / len(ballots)

    def passes(self, node: Node) -> bool:
        if self.cfg.evaluation == "vote":
            return node.score > 0
        return not node.scored or node.score >= self.cfg.prune_threshold  # an unscored node cannot be judged below it

    def record(self, node: Node, status: str) -> None:
        node.status = status
        self.context.emit(
            ThoughtNode(
                trace_id=self.context.trace_id,
                strategy=self.strategy,
                node_id=node.id,
                parent_id=node.parent_id,
                depth=node.depth,
                text=node.answer if node.answer is not None else node.steps[-1],
                score=round(node.score, 4),
                is_answer=node.answer is not None,
                status=status,
            )
        )

    async def bfs(self, root: Node) -> Node | None:
        frontier = [root]
        for _ in range(self.cfg.depth):
            if not frontier or self.budget_left <= 0:
                break
            kept = await self.expand(frontier, self.cfg.beam_width)
            if kept and kept[0].answer is not None:
                return kept[0]
            frontier = [n for n in kept if n.answer is None]
        return None

    async def dfs(self, node: Node) -> Node | None:
        if node.depth >= self.cfg.depth or self.budget_left <= 0:
            return None
        for child in await self.expand([node]):
            if child.answer is not None:
                return child
            if found := await self.dfs(child):
                return found
        return None

    async def answer_along(self, best: Node) -> tuple[str, str]:
        """The answer along the best path (ending at `best`), and how it was found."""
        shown = FINAL_PROMPT.format(path=render(self.query, best.steps))
        completion, enforced = await ask(
            self.context, ANSWER, ANSWER_PROMPT, shown, max_tokens=self.cfg.max_tokens, temperature=0.0, purpose="final_answer"
        )
        numeric = numeric_question(self.query)
        found = find_answer(completion.text, numeric=numeric, structured=enforced)
        # a number was asked for and the reply names none (a small model echoes the instruction, or fills the answer
        # field with words): the best path's own working ("2 + 6 = 8") is the better evidence
        no_number = numeric and (found is None or final_number(found.answer) is None)
        if no_number and (number := final_number("\n".join(best.steps))) is not None:
            return number, "best_path_number"
        if found is None:
            raise ModelBehaviorError(
                f"the search found no answer and the model gave none for its best path ({self.unparsed} of its replies "
                "had no step, answer or score); raise max_tokens or check the model",
                {"unparsed_replies": self.unparsed, "nodes_evaluated": len(self.nodes)},
            )
        return found.answer, found.found_by


class TreeOfThought(Strategy):
    name = "tree_of_thought"
    description = "Proposes several next steps, evaluates them, and searches the tree (beam BFS or DFS with pruning)."
    Config = TreeOfThoughtConfig
    extra_capabilities = ("reasoning.search", "reasoning.parallel")

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        cfg = self.parse_config(config)
        search = Search(query, cfg, context, self.name)
        root = Node("0", "", ())
        # the documented partial shape from the start, so a failure before the first level still has every key
        context.progress.update(nodes_evaluated=0, best_path=[], best_steps=[], best_score=None, answer=None)
        found = await (search.bfs(root) if cfg.search == "bfs" else search.dfs(root))
        answers = [n for n in search.nodes if n.answer is not None]
        solution = found or max(answers, key=lambda n: (n.status != "pruned", n.scored, n.score), default=None)
        best = solution or max(search.nodes, key=lambda n: (n.depth, n.score), default=root)
        if solution is not None:
            answer, fallback, found_by = solution.answer or "", None if found else "best_answer_seen", solution.found_by
            search.record(solution, "answer")
        else:  # the search ended on steps only: ask for the answer along the best path
            (answer, found_by), fallback = await search.answer_along(best), "final_answer_call"
        return context.result(
            self.name,
            answer,
            search=cfg.search,
            evaluation=cfg.evaluation,
            nodes_evaluated=len(search.nodes),
            pruned=sum(n.status == "pruned" for n in search.nodes),
            max_depth_reached=max((n.depth for n in search.nodes), default=0),
            solution_path=_path_ids(best.id),
            solution_steps=list(best.steps),
            solution_score=round(best.score, 4),
            fallback=fallback,
            unparsed_replies=search.unparsed,
            untagged_proposals=search.free_text,
            unscored=sum(not n.scored for n in search.nodes),
            branches_failed=len(search.failures),
            failures=failure_kinds(search.failures),
            found_by=found_by,
            tree=[n.summary() for n in search.nodes],
        )


def _path_ids(node_id: str) -> list[str]:
    parts = node_id.split(".")
    return [".".join(parts[: i + 1]) for i in range(1, len(parts))]
