"""The simulated model's behaviour, free of HTTP: what it answers to a chat request, and when it fails.

Replies are deterministic for a given request and seed. By default the model answers simple
arithmetic after a short `<thinking>`; `[[sim ...]]` directives in the latest user message script
longer reasoning, scripted replies and faults (docs/simulator.md lists them).

It never recognises a prompt's wording. What kind of reply a call wants comes from the request's
`purpose` (sent as a header that real models ignore); what it reads in a prompt is structure: the
problem (the first arithmetic, `answer=` directive or answer-key question), its own earlier output
(its step phrases, its slip, its progress markers), the last line of a solution shown (its answer),
and numbered lists (candidates, attempts). So rewording a strategy's prompts changes nothing here.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import random
import re
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, TypeVar

import msgspec

from reasonray.gateway.arithmetic import evaluate, format_number
from reasonray.gateway.protocol import LLMRequest, Message, ToolCall
from reasonray.gateway.simulator import structured
from reasonray.gateway.simulator.disobedience import Disobedience, in_prose, malformed_arguments, ramble
from reasonray.gateway.simulator.reasoning import CLOSE, EFFORT_SCALE, THOUGHT, ReasoningPlan, resume_point, think, written
from reasonray.gateway.tokens import TokenCounter, count_messages
from reasonray.kernel.errors import ReasonRayError

_T = TypeVar("_T")
MODEL_NAME = "simulated"
DIRECTIVE = re.compile(r"\[\[sim\s+([^\]]*)\]\]")
CALL_DIRECTIVE = re.compile(r"\[\[sim\s+call=([A-Za-z0-9_.-]+)\s*")
PROGRESS = re.compile(r"\[progress (\d+)/(\d+)\]")
ARITHMETIC = re.compile(r"[-+(]*\s*\d[\d\s.+\-*/×÷x^()%]*\d\)*")
FAULT_KINDS = ("429", "500", "timeout")
DEFAULT_CONTEXT_LENGTH = 131_072
EXCHANGES_KEPT = 1000
# Small models mostly answer in their own words; fewer ramble on, or fumble the tools they are offered.
DISOBEY_WEIGHTS = {"prose": 3, "ramble": 1, "tools": 2}
# Purposes whose prompts quote a task (to judge it, to learn from it), directives included: those are not for them.
READS_TASK = ("judge", "extract_success", "extract_failure", "extract_contrast", "extract_passive")
# A numbered item at the start of a line, whatever its label: "Candidate 2:", "Option #2", "2.", "(2)".
ENUMERATED = re.compile(
    r"^[ \t]*(?:[-*>]+[ \t]*)?(?P<label>[^\W\d_][^\W\d]{0,20}(?:[ \t][^\W\d]{1,20}){0,2})?[ \t]*[#(\[]?(?P<number>\d{1,3})(?![\d,.]\d)",
    re.MULTILINE,
)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# A sampled step or chain "slips" with the `slip` probability: it rounds an intermediate result, so
# the answer it leads to is wrong. Evaluation prompts recognise the slip, as a careful checker would.
SLIP_STEP = "rounding the intermediate result to keep the numbers simple"
# The memory items extraction writes, by lesson: what worked, what failed (a slip, an unchecked answer), and a
# worked explanation (its content is then the answer shown).
LESSONS = {
    "passive": "<title>Reuse a worked explanation</title><description>A past answer that explained this kind of question well.</description>",
    "success": "<title>Work through the problem step by step</title><description>Break the problem into explicit steps and "
    "compute each one exactly.</description><content>Write out every intermediate quantity and compute it exactly before "
    "combining them; check the final answer against what the question asks.</content>",
    "slip": "<title>Keep intermediate results exact</title><description>Rounding or guessing an intermediate value leads to a "
    "wrong final answer.</description><content>Carry exact values through every step and round only the final answer, if at "
    "all.</content><error_type>premature rounding</error_type><failure_pattern>An intermediate result was rounded to keep the "
    "numbers simple, so the final answer was off.</failure_pattern><corrective_guidance>Keep every intermediate value exact; "
    "re-check the arithmetic before answering.</corrective_guidance>",
    "unverified": "<title>Verify the final answer</title><description>An unchecked final answer can be wrong even when the steps "
    "look plausible.</description><content>Recompute the answer independently before giving it.</content><error_type>unverified "
    "answer</error_type><failure_pattern>The final answer was given without checking it against the problem.</failure_pattern>"
    "<corrective_guidance>Check the answer against the problem statement before giving it.</corrective_guidance>",
}

_PHRASES = (
    "re-checking the constraints of the problem",
    "working through the next sub-case",
    "comparing this partial result with the earlier one",
    "verifying the intermediate quantity",
    "exploring an alternative decomposition",
    "consolidating what has been established so far",
)
# The model's own earlier output, as a prompt may show it back: its step phrases and its slip.
OWN_STEP = re.compile("|".join(re.escape(p) for p in (*_PHRASES, SLIP_STEP)))


class SimulatorError(ReasonRayError):
    """A request the simulator cannot answer (bad directive, exhausted script); answered with HTTP 400."""


class ContextLengthExceeded(SimulatorError):
    """The prompt fills the model's context window; answered with HTTP 400 and code `context_length_exceeded`."""


@dataclass
class SimChoice:
    text: str = ""
    finish_reason: str = "stop"
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str | None = None  # the stop sequence that ended the text (vLLM's field name)
    reasoning: str = ""  # the thinking before the text, in a reasoning mode (docs/simulator.md)
    thinking_unfinished: bool = False  # max_tokens ran out inside the thinking: no text


@dataclass
class SimResponse:
    choices: list[SimChoice]
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking


@dataclass
class FaultPlan:
    rate: float = 0.0
    kinds: tuple[str, ...] = FAULT_KINDS

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate must be between 0 and 1, got {self.rate}")
        if unknown := set(self.kinds) - set(FAULT_KINDS):
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; use any of {', '.join(FAULT_KINDS)}")


@dataclass
class SimStats:
    requests: int = 0
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    scripted: int = 0
    disobeyed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rejected: int = 0  # requests answered with HTTP 400
    last_rejection: str | None = None  # why the latest of them was
    prompt_tokens: int = 0  # usage reported, over every reply
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking
    abandoned: int = 0  # replies generated in full for a client that had left
    generating: int = 0  # replies being generated now (the HTTP server's latency model)
    most_generating: int = 0  # the most generated at once


@dataclass(frozen=True)
class Exchange:
    """One reply as the model meant it, for tests that check what a strategy made of it."""

    purpose: str | None
    disobeyed: tuple[str | None, ...]  # per choice: how it disobeyed, None where it obeyed
    finish_reasons: tuple[str, ...]
    stated: tuple[str | None, ...]  # per choice: the answer it states (tagged, in prose or JSON), None for none
    tool_calls: tuple[ToolCall, ...]
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0


def parse_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """`[[sim call=calculator {"expression": "2+3"}]]` directives, in order: (tool name, arguments)."""
    calls = []
    for match in CALL_DIRECTIVE.finditer(text):
        try:  # arguments that start with '{', so what decodes is an object
            arguments = json.JSONDecoder().raw_decode(text[match.end() :])[0] if text.startswith("{", match.end()) else {}
        except json.JSONDecodeError as exc:
            raise SimulatorError(f"[[sim call={match.group(1)} ...]]: the arguments are not a JSON object ({exc})") from None
        calls.append((match.group(1), arguments))
    return calls


def parse_directives(text: str) -> dict[str, str]:
    """`[[sim think=300 answer=7]]` -> {"think": "300", "answer": "7"}; later keys win."""
    return {key: value.strip('"') for body in DIRECTIVE.findall(text) for key, value in re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", body)}


def evaluate_arithmetic(text: str) -> tuple[str, float] | None:
    """The first arithmetic expression in `text` with at least one operator, and its value."""
    for match in ARITHMETIC.finditer(text):
        expr = match.group(0).strip().replace("×", "*").replace("÷", "/").replace("^", "**")
        expr = re.sub(r"(?<=\d)\s*x\s*(?=\d)", "*", expr)
        if re.search(r"\d\s*[-+*/%]", expr):
            with contextlib.suppress(ValueError, ZeroDivisionError, OverflowError):
                return expr, evaluate(expr)
    return None


@dataclass(eq=False, repr=False)
class SimulatedModel:
    """Answers chat requests the way docs/simulator.md describes."""

    counter: TokenCounter
    _: KW_ONLY
    seed: int = 0
    faults: FaultPlan = field(default_factory=FaultPlan)
    disobedience: Disobedience = field(default_factory=Disobedience)
    context_length: int = DEFAULT_CONTEXT_LENGTH
    reasoning: ReasoningPlan = field(default_factory=ReasoningPlan)
    skill: float = field(default=1.0, init=False)
    stats: SimStats = field(default_factory=SimStats, init=False)
    exchanges: deque[Exchange] = field(default_factory=lambda: deque(maxlen=EXCHANGES_KEPT), init=False)
    _scripts: dict[str, deque[dict[str, Any]]] = field(default_factory=dict, init=False)
    _directed_faults: dict[str, int] = field(default_factory=lambda: defaultdict(int), init=False)
    _answers: dict[str, str] = field(default_factory=dict, init=False)  # whitespace-normalised question -> reference answer

    def __post_init__(self) -> None:
        self._fault_rng = random.Random(self.seed)

    # -- administration -------------------------------------------------------------------------
    def add_script(self, name: str, replies: list[dict[str, Any]]) -> None:
        self._scripts.setdefault(name, deque()).extend(replies)

    def add_answers(self, answers: dict[str, str], skill: float = 1.0) -> int:
        """An answer key: a prompt that quotes one of these questions gets its answer, right with
        probability `skill` (the same questions are missed on every greedy call with one seed; each
        sampled call draws anew). This is what lets an evaluation on a real dataset exercise the
        strategies against the simulator; the accuracy it yields measures nothing about a real model."""
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"skill must be between 0 and 1, got {skill}")
        for question, answer in answers.items():
            key = " ".join(question.split())
            if len(key) < 20:
                raise ValueError(f"question {question!r} is too short to be recognised in prompts (20 characters at least)")
            self._answers[key] = str(answer)
        self.skill = skill
        return len(self._answers)

    def reset(self) -> None:
        for taught in (self._scripts, self._answers, self._directed_faults, self.exchanges):
            taught.clear()
        self.skill, self.stats = 1.0, SimStats()
        self._fault_rng = random.Random(self.seed)

    # -- faults ---------------------------------------------------------------------------------
    def fault_for(self, request: LLMRequest) -> str | None:
        """The kind of fault (one of FAULT_KINDS) to inject instead of answering: a `fault=` directive first, then the random rate."""
        self.stats.requests += 1
        directives = parse_directives(_last_user_text(request.messages))
        if (kind := directives.get("fault")) is not None:
            if kind not in FAULT_KINDS:
                raise SimulatorError(f"[[sim fault={kind}]]: use one of {', '.join(FAULT_KINDS)}")
            key = _request_digest(request)
            if self._directed_faults[key] < int(directives.get("times", "1")):
                self._directed_faults[key] += 1
            else:
                kind = None
        if kind is None and self.faults.rate and self._fault_rng.random() < self.faults.rate:
            kind = self._fault_rng.choice(self.faults.kinds)
        if kind is not None:
            self.stats.faults[kind] += 1
        return kind

    # -- answers --------------------------------------------------------------------------------
    def respond(self, request: LLMRequest) -> SimResponse:
        try:
            return self._respond(request)
        except RecursionError:
            raise SimulatorError(
                "the response_format or tool schema refers to itself; the simulated model fills only finite schemas"
            ) from None
        except ValueError as exc:  # a directive, tool_choice, response_format or schema it cannot follow
            raise SimulatorError(str(exc)) from None

    def _respond(self, request: LLMRequest) -> SimResponse:
        directives = parse_directives(_last_user_text(request.messages))
        forced = structured.forced_tool(request.tools, request.tool_choice)
        schema = structured.schema_of(request.response_format)
        plan = Disobedience.from_directive(directives["disobey"]) if "disobey" in directives else self.disobedience
        counted = request.messages
        if request.continue_thinking is not None and not (counted and counted[-1].role == "assistant"):
            counted = (*counted, Message(role="assistant", content=request.continue_thinking))  # the prefix is prompt too
        framing = getattr(self.counter, "prompt_tokens", None)  # a tokenizer with a chat template of its own
        prompt_tokens = int(framing(counted)) if callable(framing) else count_messages(self.counter, counted)
        room = self.context_length - prompt_tokens
        if room <= 0:
            raise ContextLengthExceeded(  # in the words OpenAI and llama-cpp-python use
                f"This model's maximum context length is {self.context_length} tokens. However, you requested "
                f"{prompt_tokens} tokens ({prompt_tokens} in the messages, 0 in the completion). "
                "Please reduce the length of the messages or completion."
            )
        # generation ends where the context window does, whatever max_tokens asked for
        request = msgspec.structs.replace(request, max_tokens=min(request.max_tokens or room, room))

        def reply(index: int) -> tuple[SimChoice, str | None, str | None]:
            """One choice: the obedient reply, then shaped as the request asks or disobeying; with how it disobeyed
            (None: it obeyed) and the answer it states."""
            obedient = self._choice(request, directives, index)
            if "script" in directives and request.purpose not in READS_TASK:
                return obedient, None, _answer_in(obedient)  # scripted replies are exact
            # how it disobeys (None: it obeys): a draw at the plan's rate from what the request says, so the same request is
            # answered the same way every time; `tools` only where tools are offered
            kind = None
            if plan.rate > 0:
                draw = random.Random(f"{self.seed}:disobey:{_request_digest(request)}:{request.purpose}:{request.seed}:{index}")
                if draw.random() < plan.rate and (kinds := [k for k in plan.kinds if k != "tools" or request.tools]):
                    kind = draw.choices(kinds, weights=[DISOBEY_WEIGHTS[k] for k in kinds])[0]
            if kind == "prose" and obedient.tool_calls:  # a tool call has no text format to ignore: it fumbles the call
                kind = "tools" if "tools" in plan.kinds else None
            if kind is not None:
                self.stats.disobeyed[kind] += 1
                choice, says = self._disobey(obedient, request, kind, index)
                return choice, kind, says
            choice = self._conform(obedient, request, forced, schema)
            meant = choice if "<answer>" in choice.text else obedient  # JSON carries what the tagged reply said
            return choice, None, _answer_in(meant) if choice.finish_reason == "stop" and not choice.tool_calls else None

        thinking, spent, finished = self._think(request, directives)
        if not finished:  # max_tokens ran out while thinking: no answer at all
            cut = SimChoice(finish_reason="length", reasoning=thinking, thinking_unfinished=True)
            replies: list[tuple[SimChoice, str | None, str | None]] = [(cut, None, None)] * max(1, request.n)
        else:
            if thinking:  # the answer gets what the thinking left of max_tokens
                request = msgspec.structs.replace(request, max_tokens=max((request.max_tokens or room) - spent, 0))
            replies = [reply(index) for index in range(max(1, request.n))]
            for choice, _, _ in replies:
                choice.reasoning = thinking or choice.reasoning
        choices, kinds, stated = (tuple(column) for column in zip(*replies, strict=True))
        reasoning_tokens = sum(self.counter.count(c.reasoning) for c in choices)
        parts = (part for c in choices for part in (c.text, *(t.name + t.arguments for t in c.tool_calls), c.reasoning))
        response = SimResponse(list(choices), prompt_tokens, sum(self.counter.count(part) for part in parts), reasoning_tokens)
        for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
            setattr(self.stats, name, getattr(self.stats, name) + getattr(response, name))
        finish_reasons, calls = tuple(c.finish_reason for c in choices), tuple(call for c in choices for call in c.tool_calls)
        self.exchanges.append(
            Exchange(request.purpose, kinds, finish_reasons, stated, calls, prompt_tokens, response.completion_tokens, reasoning_tokens)
        )
        return response

    def reasoning_plan(self, request: LLMRequest) -> ReasoningPlan:
        """How this request's reply thinks: the model's plan, as the request's directives change it (a ValueError for
        directives it cannot follow, which `respond` answers with a SimulatorError)."""
        return self.reasoning.directed(parse_directives(_last_user_text(request.messages)))

    def _think(self, request: LLMRequest, directives: dict[str, str]) -> tuple[str, int, bool]:
        """The thinking before the reply, in a reasoning mode: (text, tokens, finished within max_tokens). A reply that
        continues closed thinking (budget forcing closed it) answers at once; one that continues open thinking resumes
        from its furthest marker (a reply to the conversation also from thinking its prompt carries, as a tail or a
        summary does). Scripted replies stay exact."""
        plan = self.reasoning.directed(directives)
        prefix, kwargs = request.continue_thinking, (request.extra_body or {}).get("chat_template_kwargs")
        switched_off = isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False  # as Qwen3's chat template takes it
        if plan.form == "off" or "script" in directives or switched_off or CLOSE.search(prefix or ""):
            return "", 0, True
        total = round(plan.thinking_tokens * EFFORT_SCALE.get(request.reasoning_effort or "medium", 1.0))
        budget = request.max_tokens if request.max_tokens is not None else self.context_length
        done = resume_point(prefix, total)
        if not done and request.purpose is None:  # thinking carried forward in the prompt (a tail or a summary) resumes too
            done = resume_point(_all_text(request.messages), total)
        # cut by max_tokens, a server generates the first `budget` tokens of its thinking and says so (length, all of
        # max_tokens used): the pieces are counted one by one, and joined they count fewer (which a client reads as a
        # context window met before max_tokens ran out), so a little more is thought than fits, then cut, twice if need be
        text, finished = think(total, done, budget + 64, self.counter)
        for _ in range(2):
            if self.counter.count(text) > budget:
                text, finished = self.counter.head(text, budget), False
        return text, self.counter.count(text), finished

    # -- obeying the request's output contract --------------------------------------------------
    def _conform(self, choice: SimChoice, request: LLMRequest, forced: str | None, schema: dict[str, Any] | None) -> SimChoice:
        """The reply shaped as `tool_choice` and `response_format` ask, as an enforcing server shapes it."""
        names = structured.tool_names(request.tools)
        if forced == "none" and choice.tool_calls:
            choice = self._finish(self._without_tools(request), request)
        elif forced is not None and forced != "none":
            wanted = forced if forced != "required" else next((c.name for c in choice.tool_calls if c.name in names), names[0])
            calls = tuple(c for c in choice.tool_calls if c.name == wanted)
            if not calls:
                question = DIRECTIVE.sub("", _last_user_text(request.messages)).strip()
                found = evaluate_arithmetic(question)
                hints = {"answer": found[0] if found else question, "text": question}
                arguments = structured.instance(structured.parameters_of(request.tools, wanted), hints)
                calls = (ToolCall(id=f"call_{_request_digest(request)[:8]}_forced", name=wanted, arguments=json.dumps(arguments)),)
            choice = SimChoice(finish_reason="tool_calls", tool_calls=calls)
        if schema is not None and not choice.tool_calls:
            shaped = self._finish(structured.as_json(choice.text, schema), request)
            if choice.finish_reason == "length":
                shaped.finish_reason = "length"
            choice = shaped
        return choice

    def _without_tools(self, request: LLMRequest) -> str:
        """What the model says to a request for a tool call when it may not (or will not) call one."""
        found = evaluate_arithmetic(DIRECTIVE.sub("", _last_user_text(request.messages)))
        answer = format_number(found[1]) if found else "I cannot tell without running the tool."
        return f"<thinking>Answering without calling a tool.</thinking>\n<answer>{answer}</answer>"

    # -- disobeying -----------------------------------------------------------------------------
    def _disobey(self, obedient: SimChoice, request: LLMRequest, kind: str, index: int) -> tuple[SimChoice, str | None]:
        """The reply as a model that ignores its instructions gives it, with the answer it still states (if any)."""
        rng = random.Random(f"{self.seed}:{kind}:{_request_digest(request)}:{request.purpose}:{request.seed}:{index}")
        question = DIRECTIVE.sub("", _last_user_text(request.messages))
        budget = request.max_tokens or self.context_length
        if kind == "ramble":
            text = self.counter.head(ramble(question, self.counter.count, budget, rng), budget)
            return SimChoice(text=text, finish_reason="length"), None
        if kind == "tools" and obedient.tool_calls and rng.random() < 0.5:  # forgets the tools and answers on its own
            obedient = SimChoice(text=self._without_tools(request))
        elif kind == "tools":
            calls = obedient.tool_calls or (
                ToolCall(id=f"call_{_request_digest(request)[:8]}_{index}", name=structured.tool_names(request.tools)[0], arguments="{}"),
            )
            broken = tuple(ToolCall(id=c.id, name=c.name, arguments=malformed_arguments(c.arguments, rng)) for c in calls)
            return SimChoice(finish_reason="tool_calls", tool_calls=broken), None
        found = evaluate_arithmetic(question)
        choice = self._finish(in_prose(obedient.text, rng, found[0] if found else None), request)
        if obedient.finish_reason == "length":
            choice.finish_reason = "length"
        return choice, _answer_in(obedient) if choice.finish_reason == "stop" else None

    def _rng(self, request: LLMRequest, index: int) -> random.Random:
        """Draws that differ on every sampled call, or else seeded from what the model understands of the request (its
        purpose, directives, problem and its own earlier output shown), not from its wording: seeded draws stay the
        same when a strategy rewords."""
        if request.sampled:
            return random.Random()
        shown = _last_user_text(request.messages)
        understood = [
            request.purpose,
            sorted(parse_directives(shown).items()),
            self._problem(shown),
            OWN_STEP.findall(shown),
            PROGRESS.findall(_all_text(request.messages)),
            _tool_results_since_last_user(request.messages),
        ]
        digest = hashlib.sha256(json.dumps(understood, ensure_ascii=False).encode()).hexdigest()[:16]
        return random.Random(f"{self.seed}:{request.seed}:{index}:{digest}")

    def _choice(self, request: LLMRequest, directives: dict[str, str], index: int) -> SimChoice:
        purpose, shown = request.purpose, _last_user_text(request.messages)
        if purpose in READS_TASK:  # before the directives it quotes
            return self._finish(self._judge(shown) if purpose == "judge" else self._memories(shown, purpose), request)
        if "script" in directives:
            return self._scripted(directives["script"])
        if calls := parse_calls(shown):  # the next one as a tool call; then the last result
            results = _tool_results_since_last_user(request.messages)
            if len(results) >= len(calls):
                return SimChoice(text=f"<thinking>The tools have answered.</thinking>\n<answer>{results[-1]}</answer>")
            (name, arguments), call_id = calls[len(results)], f"call_{_request_digest(request)[:8]}_{len(results)}"
            return SimChoice(finish_reason="tool_calls", tool_calls=(ToolCall(id=call_id, name=name, arguments=json.dumps(arguments)),))
        rng = self._rng(request, index)
        if purpose == "summarize":
            return self._finish(self._carryover_summary(request, directives), request)
        if purpose == "final_answer":
            return self._finish(self._final_answer(request, directives), request)
        if purpose == "propose":
            return self._finish(self._propose(request, shown, directives, rng), request)
        if purpose in ("score", "critique"):
            return self._finish(self._value(shown, rng, wants_feedback=purpose == "critique"), request)
        if purpose == "choose":
            return self._finish(self._vote(shown, rng), request)
        if "think" in directives:
            text, cut_off = self._long_reasoning(request, directives, rng)
        else:
            text, cut_off = self._short_reasoning(request, shown, directives, rng), False
        return self._finish(text, request, cut_off)

    def _scripted(self, name: str) -> SimChoice:
        queue = self._scripts.get(name)
        if not queue:
            raise SimulatorError(f"script {name!r} has no replies left; add some with POST /v1/sim/scripts")
        reply = queue.popleft()
        self.stats.scripted += 1
        calls = tuple(
            ToolCall(id=c.get("id") or f"call_{i}", name=c["name"], arguments=json.dumps(c.get("arguments", {})))
            for i, c in enumerate(reply.get("tool_calls", []))
        )
        return SimChoice(
            text=reply.get("content") or "",
            finish_reason=reply.get("finish_reason") or ("tool_calls" if calls else "stop"),
            tool_calls=calls,
            reasoning=reply.get("reasoning_content") or "",
        )

    def _short_reasoning(self, request: LLMRequest, question: str, directives: dict[str, str], rng: random.Random) -> str:
        if "answer" in directives:
            answer = directives["answer"]
            thought = f"The instructions fix the answer; after {rng.choice(_PHRASES)} it is {answer}."
        elif (known := self._known(question)) is not None:
            answer = self._recall(request, known, rng)
            return f"<thinking>Reading the problem carefully and {rng.choice(_PHRASES)}.</thinking>\n<answer>{answer}</answer>"
        elif (found := evaluate_arithmetic(DIRECTIVE.sub("", question))) is not None:
            expr, answer = found[0], format_number(found[1])
            thought = f"The question asks for {expr}. Computing it step by step: {expr} = {answer}."
        else:
            answer = "I am a simulated model: I answer arithmetic and follow [[sim ...]] directives only."
            thought = "This is not an arithmetic question and carries no [[sim]] directive."
            return f"<thinking>{thought}</thinking>\n<answer>{answer}</answer>"
        if self._slips(request, directives, rng):
            answer = _wrong(answer, rng)
            thought = f"Working quickly, {SLIP_STEP}: it comes to {answer}."
        return f"<thinking>{thought}</thinking>\n<answer>{answer}</answer>"

    def _slips(self, request: LLMRequest, directives: dict[str, str], rng: random.Random) -> bool:
        """Whether a sampled reply (temperature > 0) slips, with the `slip` directive's probability."""
        why = "slip is a probability between 0 and 1"
        if not 0.0 <= (chance := _directed(directives, "slip", "0", float, why)) <= 1.0:
            raise SimulatorError(f"[[sim slip={directives['slip']}]]: {why}")
        return request.temperature > 0 and rng.random() < chance

    # -- tree of thought ------------------------------------------------------------------------
    def _propose(self, request: LLMRequest, shown: str, directives: dict[str, str], rng: random.Random) -> str:
        """The next step of a solution: `steps` steps (default 2), then the answer. The steps so far are
        its own step phrases that the prompt shows back."""
        depth = len(OWN_STEP.findall(shown))
        if depth >= _directed(directives, "steps", "2", int, "steps takes a whole number"):
            answer = self._final_answer(request, directives).removeprefix("<answer>").removesuffix("</answer>")
            if SLIP_STEP in shown:
                answer = _wrong(answer, rng)
            return f"<thinking>The steps so far settle it.</thinking>\n<answer>{answer}</answer>"
        thought = SLIP_STEP if self._slips(request, directives, rng) else rng.choice(_PHRASES)
        return f"<thinking>Deciding what to do next.</thinking>\n<step>Step {depth + 1}: {thought}.</step>"

    def _value(self, shown: str, rng: random.Random, wants_feedback: bool = False) -> str:
        """A 0-1 score: low for a path with a slip or a wrong answer, high for a clean path that reached its answer."""
        if self._check(shown) is False:
            score, feedback = 0.1 + 0.2 * rng.random(), "The final answer does not follow from the problem; recompute it."
            if SLIP_STEP in shown:
                feedback = f"One step is wrong: {SLIP_STEP} changes the result. Keep every intermediate value exact."
        elif _stated(shown) is not None:
            score, feedback = 0.9 + 0.1 * rng.random(), "Every step checks out."
        else:
            score, feedback = 0.6 + 0.2 * rng.random(), "The partial solution is sound so far; finish it."
        extra = f"\n<feedback>{feedback}</feedback>" if wants_feedback else ""
        return f"<thinking>Checking each step in turn.</thinking>\n<score>{score:.2f}</score>{extra}"

    def _check(self, shown: str, problem: tuple[str, str] | None = None) -> bool | None:
        """Whether the solution shown is right: False for a slip or an answer that differs from the problem's.

        The problem comes before the solution (the first arithmetic, `answer=` directive or answer-key
        question); the solution's answer is its last line, unless that line is one of the model's own
        steps (the solution is unfinished). `problem` when the problem is shown elsewhere. None when it
        cannot tell.
        """
        if SLIP_STEP in shown:
            return False
        stated = _stated(shown)
        problem = problem or self._problem(shown)
        if stated is None or problem is None:
            return None
        return _states(stated, problem[1])

    def _problem(self, text: str) -> tuple[str, str] | None:
        """What the text asks, as (how it was recognised, the right answer): an `answer=` directive, an
        answer-key question it quotes, or its first arithmetic expression; None for none of these."""
        if "answer" in (directives := parse_directives(text)):
            return "directive", directives["answer"]
        if (known := self._known(text)) is not None:
            return f"key:{known[0]}", known[1]
        if (found := evaluate_arithmetic(DIRECTIVE.sub("", text))) is not None:
            return f"arithmetic:{found[0]}", format_number(found[1])
        return None

    def _known(self, text: str) -> tuple[str, str] | None:
        """The answer-key question this text quotes, with its answer."""
        flat = " ".join(text.split()) if self._answers else ""  # the keys are whitespace-normalised
        return next(((question, answer) for question, answer in self._answers.items() if question in flat), None)

    def _recall(self, request: LLMRequest, known: tuple[str, str], rng: random.Random) -> str:
        """The key's answer, or a plausible wrong one with probability 1 - skill."""
        question, answer = known
        draw = rng if request.sampled else random.Random(f"{self.seed}:{request.seed}:{question}")
        return answer if draw.random() < self.skill else _wrong(answer, draw)

    # -- reasoning memory -----------------------------------------------------------------------
    def _judge(self, shown: str) -> str:
        """The LLM-as-judge verdict: failure for a slip or a wrong answer, success otherwise."""
        if (verdict := self._check(shown)) is None:
            verdict = _stated(shown) is not None and "I am a simulated model" not in shown
        why = "Every step holds and the answer solves the task." if verdict else "A step or the final answer is wrong."
        return f"Thoughts: {why}\n<status>{'success' if verdict else 'failure'}</status>"

    def _memories(self, shown: str, purpose: str) -> str:
        """Memory items, as the purpose asks: lessons from what worked and what failed.

        A contrast judges each numbered attempt itself (a slip or a wrong answer is a failure)."""
        if purpose == "extract_passive":  # the exchange's answer comes last: its last paragraph, without a heading line
            paragraphs = [p.strip().splitlines() for p in re.split(r"\n\s*\n", shown.strip()) if p.strip()]
            last = paragraphs[-1] if paragraphs else []
            if len(last) > 1 and last[0].rstrip().endswith(":"):
                last = last[1:]
            worked = " ".join(" ".join(last).split())[:400] or "Explain step by step."
            return f"<memory>{LESSONS['passive']}<content>{worked}</content></memory>"
        if purpose == "extract_contrast":
            attempts = [body for _, body in _enumerated(shown)] or [shown]
            problem = self._problem(shown)
            failed = [body for body in attempts if self._check(body, problem) is False]
            succeeded, slipped = len(failed) < len(attempts), any(SLIP_STEP in body for body in failed)
        else:
            failed = [shown] if purpose == "extract_failure" else []
            succeeded, slipped = purpose == "extract_success", SLIP_STEP in shown
        lessons = (["success"] if succeeded else []) + (["slip" if slipped else "unverified"] if failed else [])
        items = [f"<memory>{LESSONS[lesson]}</memory>" for lesson in lessons]
        return "<thinking>Looking for what generalises.</thinking>\n" + "\n".join(items)

    def _vote(self, shown: str, rng: random.Random) -> str:
        """A vote for a numbered candidate that is not wrong (no slip, no answer that differs from the
        problem's), preferring those that reached an answer."""
        bodies = dict(_enumerated(shown))
        if not bodies:
            return "<thinking>There are no numbered candidates to compare.</thinking>\n<vote>1</vote>"
        problem = self._problem(shown)
        clean = [n for n, body in bodies.items() if self._check(body, problem) is not False]
        finished = [n for n in clean if _stated(bodies[n]) is not None]
        choice = rng.choice(finished or clean or list(bodies))
        return f"<thinking>Comparing the candidates.</thinking>\n<vote>{choice}</vote>"

    def _long_reasoning(self, request: LLMRequest, directives: dict[str, str], rng: random.Random) -> tuple[str, bool]:
        """Reason for `think` tokens in total, resuming from the progress markers the prompt shows.

        The reasoning is visible text with a short `<thinking>` aside every few sentences. Returns
        the text and whether max_tokens cut it off; when `<continue>` is one of the request's stop
        sequences, a full chunk ends with that marker instead of being cut off.
        """
        total = _directed(directives, "think", "", int, "think takes a whole number of tokens")
        done = resume_point(_all_text(request.messages), total, PROGRESS)
        budget = request.max_tokens if request.max_tokens is not None else 10**9
        wants_continue = "<continue>" in request.stop
        reserve = self.counter.count(" <continue>") if wants_continue else 0

        def sentence(i: int, used: int) -> tuple[str, bool]:
            if done + used >= total:
                return "", True
            step = done // 20 + i
            aside = f" <thinking>scratch: re-derive step {step} to be sure</thinking>" if step % 8 == 7 else ""
            return f" Step {step}: {rng.choice(_PHRASES)} [progress {done + used}/{total}].{aside}", False

        text, finished = written(sentence, budget - reserve, self.counter)
        if finished:
            return f"{text} [progress {total}/{total}] <answer>{directives.get('answer', 'done')}</answer>", False
        return text + (" <continue>" if wants_continue else ""), not wants_continue

    def _carryover_summary(self, request: LLMRequest, directives: dict[str, str]) -> str:
        """What the model writes when asked for a structured carryover (see docs/simulator.md)."""
        if "think" in directives:
            total = _directed(directives, "think", "", int, "think takes a whole number of tokens")
            done = resume_point(_all_text(request.messages), total, PROGRESS)
            progress, step = f"[progress {done}/{total}] reasoning tokens completed.", f"step {done // 20}"
        elif marks := THOUGHT.findall(_all_text(request.messages)):
            # the thinking it was shown: a model summing up where its thinking got to says how far, so the next
            # chunk resumes from there (a summary that forgot would make it start over)
            reached, total = max((int(d), int(t)) for d, t in marks)
            progress, step = f"the thinking reached [thought {reached}/{total}].", f"thought {reached // 20}"
        else:
            progress, step = "the problem has been restated.", "the first step"
        return (
            "Current Strategy: work through the problem step by step, checking each intermediate result.\n"
            "Key Findings: the intermediate results so far are consistent with each other.\n"
            f"Progress: {progress}\n"
            f"Next Steps: continue from {step}.\n"
            "Unresolved: the final answer."
        )

    def _final_answer(self, request: LLMRequest, directives: dict[str, str]) -> str:
        if "answer" in directives:
            return f"<answer>{directives['answer']}</answer>"
        if (known := self._known(_all_text(request.messages))) is not None:
            return f"<answer>{self._recall(request, known, self._rng(request, 0))}</answer>"
        found = evaluate_arithmetic(DIRECTIVE.sub("", _last_user_text(request.messages)))
        return f"<answer>{format_number(found[1]) if found else 'unknown'}</answer>"

    def _finish(self, text: str, request: LLMRequest, cut_off: bool = False) -> SimChoice:
        """Apply stop sequences (excluded from the text, as OpenAI does) and max_tokens."""
        stops: list[tuple[int, str | None]] = [(text.find(seq), seq) for seq in request.stop if seq in text]
        stop_at, stop_reason = min(stops, key=lambda stop: stop[0], default=(len(text), None))  # the first of those found first
        text = text[:stop_at]
        if request.max_tokens is not None and self.counter.count(text) > request.max_tokens:
            return SimChoice(text=self.counter.head(text, request.max_tokens), finish_reason="length")
        if cut_off and stop_reason is None:
            return SimChoice(text=text, finish_reason="length")
        return SimChoice(text=text, finish_reason="stop", stop_reason=stop_reason)


def _answer_in(choice: SimChoice) -> str | None:
    """The answer a reply states in its `<answer>` tag; None for a reply cut off or without one."""
    if choice.finish_reason == "length":
        return None
    found = re.search(r"<answer>(.*?)</answer>", choice.text, re.DOTALL)
    return found.group(1).strip() if found else None


def _stated(solution: str) -> str | None:
    """The answer line of a solution shown (its last line), or None when the solution is unfinished:
    empty, or ending on one of the model's own steps or progress markers."""
    lines = [line for line in solution.strip().splitlines() if line.strip()]
    if not lines or OWN_STEP.search(lines[-1]) or PROGRESS.search(lines[-1]):
        return None
    return lines[-1].strip()


def _states(line: str, expected: str) -> bool:
    """Whether an answer line gives the expected answer: its last number, for a number; its end, for text
    (a hedged "approximately X" is not X)."""
    line = re.sub(r"</?answer>", " ", line)
    try:
        want = float(expected.replace(",", ""))
    except ValueError:
        said, want_text = " ".join(line.lower().split()).rstrip(" .!"), " ".join(expected.lower().split())
        return said.endswith(want_text) and not said.endswith(f"approximately {want_text}")
    numbers = NUMBER.findall(line)  # each a float once its thousands separators go
    return bool(numbers) and abs(float(numbers[-1].replace(",", "")) - want) < 1e-9


def _enumerated(text: str) -> list[tuple[int, str]]:
    """The numbered items of the outermost numbered list in `text`, with their bodies: items whose lines
    start with one label and the numbers 1, 2, ... in order ("Candidate 1:", "Option 2:" or "3."), the
    list that starts first winning (steps numbered inside each candidate restart, so they are no list)."""
    groups: dict[str, list[re.Match[str]]] = defaultdict(list)
    for match in ENUMERATED.finditer(text):
        groups[(match.group("label") or "").strip().lower()].append(match)
    lists = [marks for marks in groups.values() if [int(m.group("number")) for m in marks] == list(range(1, len(marks) + 1))]
    if not lists:
        return []
    marks = min(lists, key=lambda found: found[0].start())
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [(int(m.group("number")), text[m.end() : end]) for m, end in zip(marks, ends, strict=True)]


def _wrong(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: a number off by a little, or a hedged version of the text."""
    try:
        value = float(answer)
    except ValueError:
        return f"approximately {answer}"
    return format_number(value + rng.choice((-1, 1)) * rng.randint(1, 9))


def _tool_results_since_last_user(messages: tuple[Message, ...]) -> list[str]:
    since = itertools.takewhile(lambda m: m.role != "user", reversed(messages))
    return [m.content or "" for m in since if m.role == "tool"][::-1]


def _last_user_text(messages: tuple[Message, ...]) -> str:
    return next((m.content or "" for m in reversed(messages) if m.role == "user"), "")


def _all_text(messages: tuple[Message, ...]) -> str:
    return "\n".join(m.content or "" for m in messages)


def _directed(directives: dict[str, str], key: str, default: str, parse: Callable[[str], _T], what: str) -> _T:
    """A directive's value as `parse` reads it; one it cannot read is a SimulatorError saying `what` the directive takes."""
    raw = directives.get(key, default)
    try:
        return parse(raw)
    except ValueError:
        raise SimulatorError(f"[[sim {key}={raw}]]: {what}") from None


def _request_digest(request: LLMRequest) -> str:
    body = json.dumps([[m.role, m.content] for m in request.messages], ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def embed(text: str, dims: int = 384) -> list[float]:
    """A deterministic bag-of-words embedding: texts sharing words point the same way (feature hashing)."""
    vector = [0.0] * dims
    for word in re.findall(r"\w+", text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dims
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = sum(v * v for v in vector) ** 0.5 or 1.0
    return [v / norm for v in vector]
