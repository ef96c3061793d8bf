"""Bounded-context reasoning (Delethink-style): reasoning in chunks whose context never exceeds
`chunk_size` tokens, each chunk starting from the query and a carryover of the one before.

Four carryover modes. `delethink`, for models that think (a reply's `reasoning`): each chunk continues the
model's own thinking by prefix continuation (`LLMRequest.continue_thinking`) from the first `head_tokens`
of its thinking and the raw last `carryover_size` tokens of the thinking so far; when the iterations run
out the answer is forced (`thinking_budget=0`). `tail` carries the first `head_tokens` of the first chunk
and the last `carryover_size` tokens of the previous one into a user prompt (no extra call); `summary`
asks the model for a structured carryover and falls back to the raw tail when that fails. `auto` is
`delethink` once the first reply shows thinking, `tail` otherwise. In every mode a chunk cut while
thinking is carried by its thinking (its answer text is empty), and a chunk that would leave the next
prompt unchanged stops the chunking (the run would only repeat itself). Only the current chunk and the
carryover are held in memory; the full text of every chunk goes to the event log.

The bound holds by the model's own count: every cut uses the context's token counter, and each call's
`max_tokens` is what is left of `chunk_size` after the prompt as the server will count it. Until the
server has reported a prompt's size, that is the counter's count x 1.15 plus a margin for the chat
template's framing; after, the ratio of the server's count to ours on the largest prompt of the run so
far (raised to the largest ratio seen on a reply's text, since carryovers are cut from replies), plus that
margin (which covers the framing's constant part). `iterations[].tokens` are the server's usage.

A chunk answers with `<answer>`; a model that ignores the tag answers with a chunk that stops (not
cut by `max_tokens`) on a last line stating it ("The answer is: 76", "#### 76"); a thinking model answers
with whatever follows its closed thinking. Unfinished thinking is never an answer. The final-answer
call's reply is read as chain of thought's is. `found_by` says which.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from reasonray.gateway.errors import LLMError
from reasonray.gateway.protocol import Completion, LLMRequest, Message, system, user
from reasonray.gateway.tokens import count_messages
from reasonray.kernel.errors import (
    InvalidParamsError,
    MaxIterationsError,
    ModelBehaviorError,
    attach_partial,
)
from reasonray.kernel.events import Carryover, IterationEnd
from reasonray.kernel.extraction import FoundBy, find_answer, numeric_question
from reasonray.kernel.tags import extract_answer, strip_thinking
from reasonray.strategies.base import (
    ReasoningResult,
    Strategy,
    StrategyConfig,
    StrategyContext,
    StrategySettings,
)
from reasonray.strategies.compute_cost import CostLedger

INSTRUCTIONS = (
    "Solve the problem by reasoning step by step in plain text: your visible reasoning is what you keep "
    "when your working memory is cleared between chunks. Use <thinking>...</thinking> only for scratch "
    "work you will not need again. When you are certain, write the final answer as <answer>...</answer>. "
    "If you run out of room before finishing, end with <continue> and you will resume from your latest reasoning."
)
SUMMARY_INSTRUCTIONS = (
    "You compress a reasoning process into a carryover for its next chunk. Keep the key insights, the "
    "approach, what is done, what is left and the open questions; drop redundant detail and completed "
    "steps. Answer with exactly these five lines:\n"
    "Current Strategy: ...\nKey Findings: ...\nProgress: ...\nNext Steps: ...\nUnresolved: ..."
)
DELETHINK_INSTRUCTIONS = "Think the problem through, then give the final answer inside <answer>...</answer>."
FINAL_INSTRUCTION = "You have used your reasoning budget. Stop reasoning and give your final answer now inside <answer></answer>."
# The later chunks' prompt: the query, then what is carried over (tail mode: the head and the tail).
TAIL_MEMORY = "It began:\n{head}\n[...]\nMost recently:\n{carryover}"
SUMMARY_MEMORY = "Carryover from your earlier reasoning:\n{carryover}"
CONTINUE_PROMPT = "{query}\n\n--- Your reasoning so far ---\n{memory}\n--- Continue from here. ---"
FINAL_PROMPT = "{prompt}\n\n{instruction}"
SUMMARY_FRAME = "Problem:\n{query}\n\nPrevious carryover:\n{carryover}\n\nLatest reasoning:\n"
NO_CARRYOVER = "(none)"
_THINK_TAG = re.compile(r"</?(?:think|thinking)\s*>", re.IGNORECASE)
STOP_SEQUENCES = ("</answer>", "<continue>")
MIN_GENERATION_TOKENS = 256
FINAL_ANSWER_TOKENS = 512
MIN_CHUNK_SIZE = 128
"""The smallest chunk: a short query's prompt (about 40 tokens with the chat framing), a carryover of at least
MIN_CARRYOVER_SIZE and a generation of a quarter of the chunk must share it. Whether a given prompt fits is
checked before every call ("context size exceeded")."""
MIN_CARRYOVER_SIZE = 16
UNCALIBRATED_RATIO = 1.15  # before the server has counted a prompt: real tokenizers ran 5-14% above cl100k
MIN_CALIBRATION_TOKENS = 32  # a reply shorter than this (in our count) says little about the ratio between tokenizers
PROMPT_MARGIN = 16  # chat-template framing a counter does not see (ChatML: a token or two per message)


CarryoverMode = Literal["delethink", "tail", "summary"]


class BoundedContextConfig(StrategyConfig):
    chunk_size: int = Field(
        8192,
        ge=MIN_CHUNK_SIZE,
        le=32768,
        description="Most tokens in one iteration's context: prompt, carryover and generation (at least 128).",
    )
    carryover_size: int = Field(
        4096, ge=MIN_CARRYOVER_SIZE, le=16384, description="Most tokens carried into the next iteration (at least 16); below chunk_size."
    )
    max_iterations: int = Field(5, ge=1, le=50, description="Most iterations; capped by the server's max_allowed_iterations.")
    carryover_mode: Literal["auto", "delethink", "tail", "summary"] = Field(
        "auto",
        description="delethink: continue the model's own thinking from its head and raw tail; tail: the last carryover_size "
        "tokens in the prompt (no extra call); summary: a structured summary written by the model; auto: delethink once "
        "the model shows its thinking, else tail.",
    )
    head_tokens: int = Field(
        100, ge=0, le=1024, description="Tokens of the first chunk (its thinking, in delethink mode) kept in every later prompt."
    )
    on_max_iterations: Literal["auto", "error", "final_answer"] = Field(
        "auto",
        description="error: fail with -32001 and the partial trace; final_answer: one more call that must answer (forced, "
        "thinking closed, in delethink mode); auto: final_answer in delethink mode, else error.",
    )
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature of the reasoning calls.")
    seed: int | None = Field(None, description="Sampling seed of the reasoning calls.")

    @model_validator(mode="after")
    def _carryover_below_chunk(self) -> BoundedContextConfig:
        if self.carryover_size >= self.chunk_size:
            raise ValueError(
                f"carryover_size must be less than chunk_size (got carryover_size={self.carryover_size}, "
                f"chunk_size={self.chunk_size}): lower carryover_size or raise chunk_size"
            )
        return self


class BoundedContextSettings(StrategySettings):
    max_allowed_iterations: int = Field(50, ge=1, le=50, description="Most iterations any request may ask for.")


@dataclass
class Chunk:
    text: str
    answer: str | None
    stop: str
    """answer, continue, length (cut by max_tokens), thinking (cut while thinking) or answer_cut (thinking closed,
    the answer cut or never written: the answer is forced)."""
    found_by: FoundBy | None = None
    reasoning: str = ""
    """The chunk's own thinking (the continuation only, in delethink mode)."""


@dataclass
class RunState:
    """All a run holds between iterations: the head and carryover text (bounded by the config, whatever
    the depth) and a few numbers per iteration for its metrics."""

    query: str = ""  # the problem every prompt of the run starts from
    head: str = ""
    carryover: str = ""
    """tail and summary modes: what the next prompt carries; delethink mode: the raw tail of the thinking after the head."""
    mode: CarryoverMode | None = None  # None until `auto` has seen the first reply
    first: tuple[Message, ...] = ()  # the first chunk's messages, which every delethink chunk continues from
    thinks: bool = False  # some reply showed thinking (the final answer is then asked with its thinking closed)
    iterations: list[dict[str, Any]] = field(default_factory=list)
    ledger: CostLedger = field(default_factory=CostLedger)
    compressions: int = 0
    fallbacks: int = 0
    found_by: FoundBy | None = None
    prompt_ratio: float = UNCALIBRATED_RATIO
    """The server's prompt count over ours, measured on the largest prompt of the run so far (where a
    constant difference, the template's framing, weighs least); UNCALIBRATED_RATIO before any."""
    calibrated_on: int = 0  # our count of the prompt the ratio was measured on
    text_ratio: float = 1.0
    """The largest ratio of the server's count to ours seen on a reply's text: the carryover is cut from replies,
    so a prompt made mostly of one is counted at least at this ratio, whatever the first (short) prompt showed."""

    def kept(self) -> str:
        """What the next chunk carries: in delethink mode the thinking it continues, its head and its raw tail joined as
        they were cut; else the carryover."""
        return self.head + self.carryover if self.mode == "delethink" else self.carryover

    def calibrate(self, counted: int, served: int) -> None:
        """Learn from a prompt the server counted (`served` tokens) that our counter made `counted`."""
        if counted <= 0 or served <= 0:  # a server that reports no usage teaches nothing
            return
        if counted >= self.calibrated_on:
            self.calibrated_on = counted
            self.prompt_ratio = max(served / counted, self.text_ratio, 1.0)

    def calibrate_text(self, counted: int, served: int) -> None:
        """Learn from a reply the server counted (`served` completion tokens) that our counter made `counted`."""
        if counted < MIN_CALIBRATION_TOKENS or served <= 0:  # a few tokens say little about a ratio
            return
        self.text_ratio = max(self.text_ratio, served / counted)
        if self.calibrated_on:  # the prompt's ratio holds until a prompt has been served, then rises to this
            self.prompt_ratio = max(self.prompt_ratio, self.text_ratio)


class BoundedContext(Strategy):
    name = "bounded_context"
    description = "Long reasoning in fixed-size chunks with carryover: linear compute in the reasoning length."
    Config = BoundedContextConfig
    Settings = BoundedContextSettings
    extra_capabilities = ("reasoning.long_form", "reasoning.bounded_memory")

    async def reason(self, query: str, *, context: StrategyContext, config: Any = None, **_: Any) -> ReasoningResult:
        cfg = self.parse_config(config)
        if cfg.max_iterations > (allowed := self.settings.max_allowed_iterations):
            raise InvalidParamsError(
                f"max_iterations {cfg.max_iterations} exceeds this server's max_allowed_iterations ({allowed}): ask for at most {allowed}",
                {"max_allowed_iterations": allowed},
            )
        state = RunState(query, mode=None if cfg.carryover_mode == "auto" else cfg.carryover_mode)
        try:
            for iteration in range(cfg.max_iterations):
                chunk = await self._reason_chunk(state, iteration, cfg, context)
                if chunk.answer is not None:
                    state.found_by = chunk.found_by
                    return self._result(context, cfg, state, chunk.answer, "answer")
                if chunk.stop == "answer_cut":  # the thinking is done: only the answer is missing
                    await self._carry(chunk, state, iteration, cfg, context)
                    return self._result(context, cfg, state, await self._final_answer(state, cfg, context), "final_answer")
                if not await self._carry(chunk, state, iteration, cfg, context):
                    if (require_room := getattr(context.llm, "require_room", None)) is not None:
                        require_room(MIN_CARRYOVER_SIZE)  # a chunk the run's budget cut short stopped for the budget
                    # nothing new to carry (an empty reply, thinking out of sight, or the same carryover again): another
                    # chunk would repeat the last one, so the answer is asked for now, or the run fails
                    why = f"chunk {iteration} left nothing new to carry into the next one"
                    context.warn(self.name, "no_progress", why)
                    if not (self._forces_answer(cfg, state) or state.thinks):
                        raise ModelBehaviorError(
                            f"the reasoning made no progress: {why} (an empty reply, or the same reasoning again); check the model, "
                            'or set on_max_iterations="final_answer" to have it answer from what it has',
                            self._partial(cfg, state),
                        )
                    return self._result(context, cfg, state, await self._final_answer(state, cfg, context), "final_answer")
            if self._forces_answer(cfg, state):
                return self._result(context, cfg, state, await self._final_answer(state, cfg, context), "final_answer")
        except BaseException as exc:  # provider, budget, deadline, cancellation: keep the iterations done
            raise attach_partial(exc, self._partial(cfg, state)) from None
        suggestion = min(cfg.max_iterations * 2, allowed)
        hint = (
            f"Consider increasing max_iterations to {suggestion}."
            if suggestion > cfg.max_iterations
            else "max_iterations is at the server's limit: raise chunk_size or lower carryover_size instead."
        )
        raise MaxIterationsError(
            f"Unable to complete reasoning within {cfg.max_iterations} iterations (capacity {capacity(cfg)} tokens). {hint}",
            {**self._partial(cfg, state), "suggested_max_iterations": suggestion},
        )

    @staticmethod
    def _forces_answer(cfg: BoundedContextConfig, state: RunState) -> bool:
        return state.mode == "delethink" if cfg.on_max_iterations == "auto" else cfg.on_max_iterations == "final_answer"

    def _messages(self, state: RunState, iteration: int) -> tuple[Message, ...]:
        if iteration == 0:
            return system(DELETHINK_INSTRUCTIONS if state.mode == "delethink" else INSTRUCTIONS), user(state.query)
        if state.mode == "delethink":
            return state.first
        memory = (SUMMARY_MEMORY if state.mode == "summary" else TAIL_MEMORY).format(head=state.head, carryover=state.carryover)
        return system(INSTRUCTIONS), user(CONTINUE_PROMPT.format(query=state.query, memory=memory))

    def _prompt(self, messages: tuple[Message, ...], state: RunState, context: StrategyContext, thinking: str = "") -> int:
        """The prompt's size as the server will count it (see the module docstring), with the thinking it continues."""
        if thinking:
            messages = (*messages, Message(role="assistant", content=thinking))
        return math.ceil(count_messages(context.tokens, messages) * state.prompt_ratio) + PROMPT_MARGIN

    def _fit(
        self, state: RunState, iteration: int, cfg: BoundedContextConfig, context: StrategyContext, final: bool = False
    ) -> tuple[tuple[Message, ...], str, int]:
        """The call's messages, the thinking it continues (delethink mode) and its generation budget, shortening the
        carryover (then, in delethink mode, the head) if the prompt leaves less than a chunk needs to reason in or,
        for the `final` answer, than that answer's room (outside delethink mode: the last prompt, told to answer now)."""
        # a chunk needs 256 tokens to reason in, the final answer 512: a quarter of a smaller chunk either way
        need = min(FINAL_ANSWER_TOKENS if final else MIN_GENERATION_TOKENS, cfg.chunk_size // 4)
        delethink = state.mode == "delethink" and iteration > 0
        told = final and not delethink

        def measure() -> tuple[tuple[Message, ...], str, int]:
            messages = self._messages(state, iteration)
            if told:
                messages = (messages[0], user(FINAL_PROMPT.format(prompt=messages[1].content, instruction=FINAL_INSTRUCTION)))
            thinking = state.kept() if delethink else ""
            return messages, thinking, cfg.chunk_size - self._prompt(messages, state, context, thinking)

        messages, thinking, room = measure()
        if room < need and (state.carryover or (delethink and state.head)):
            while room < need and (state.carryover or (delethink and state.head)):
                cut = math.ceil((need - room) / state.prompt_ratio) + 1
                if state.carryover:
                    state.carryover = context.tokens.tail(state.carryover, max(0, context.tokens.count(state.carryover) - cut))
                else:
                    state.head = context.tokens.head(state.head, max(0, context.tokens.count(state.head) - cut))
                messages, thinking, room = measure()
            kept = context.tokens.count(state.kept())
            to = "leave room for the final answer" if told else f"fit chunk_size {cfg.chunk_size}"
            context.warn(self.name, "carryover_truncated", f"carryover cut to {kept} tokens to {to}")
        if room < need and not told:  # the final answer's prompt is checked by the caller, which needs less
            raise InvalidParamsError(
                f"context size exceeded: the prompt takes {cfg.chunk_size - room} of chunk_size {cfg.chunk_size} tokens "
                f"(as the model counts them, with a margin), leaving {room} to reason in (at least {need} "
                "needed); shorten the query, reduce carryover_size or raise chunk_size"
            )
        return messages, thinking, room

    async def _reason_chunk(self, state: RunState, iteration: int, cfg: BoundedContextConfig, context: StrategyContext) -> Chunk:
        messages, thinking, room = self._fit(state, iteration, cfg, context)
        if iteration == 0:
            state.first = messages
        completion = await context.llm.complete(
            LLMRequest(
                messages=messages,
                max_tokens=room,
                stop=() if state.mode == "delethink" else STOP_SEQUENCES,
                temperature=cfg.temperature,
                seed=cfg.seed,
                continue_thinking=thinking or None,
            )
        )
        if thinking and completion.thinking_control == "unsupported":
            # the endpoint cannot continue a reply (no prefix continuation): this chunk thought afresh and every later
            # one would too; the head and raw tail of the thinking go in the prompt instead, which any model reads
            state.mode = "tail"
            context.warn(self.name, "carryover_fallback", "the endpoint cannot continue the thinking; carrying its raw tail in the prompt")
            return await self._reason_chunk(state, iteration, cfg, context)
        usage = completion.usage
        sent = (*messages, Message(role="assistant", content=thinking)) if thinking else messages  # the continued thinking is prompt too
        state.calibrate(count_messages(context.tokens, sent), usage.prompt_tokens)
        reasoning = completion.reasoning
        if thinking and reasoning.startswith(thinking):  # a server that hands back the continued prefix with the reply
            reasoning = reasoning[len(thinking) :]
        if usage.reasoning_tokens == 0 or reasoning:  # hidden thinking says nothing of the tokenizers' ratio
            generated = context.tokens.count(completion.text) + context.tokens.count(reasoning)
            state.calibrate_text(generated, usage.completion_tokens)
        state.thinks = state.thinks or bool(reasoning) or completion.thinking_unfinished or usage.reasoning_tokens > 0
        if state.mode is None:  # auto: the first reply tells how the model reasons
            # a model that thinks first and answers after (R1, Qwen3, gpt-oss): its thinking was handed over, and the reply
            # either ended inside it or closed it and stopped. A model whose visible text is still reasoning when the chunk
            # ends (cut off, or asking to continue) reasons in the open, its thinking only asides: that text's tail is carried
            state.mode = "delethink" if reasoning and (completion.thinking_unfinished or stopped(completion)) else "tail"
            if state.mode == "delethink":  # later chunks continue the thinking under delethink's own (shorter) instructions
                state.first = self._messages(state, 0)
        # what the chunk came to: an answer, more reasoning to carry, or closed thinking with its answer missing
        if completion.thinking_unfinished:  # cut inside the thinking: whatever it says, it is not an answer
            answer, found_by, stop = None, None, "thinking"
        elif state.mode == "delethink":  # the thinking closed: what follows it is the answer
            answer, found_by = chunk_answer(completion.text, completion.finish_reason)
            if answer is None and stopped(completion):
                found = find_answer(completion.text, numeric=numeric_question(state.query))
                answer, found_by = (found.answer, found.found_by) if found is not None else (None, None)
            stop = "answer" if answer is not None else "answer_cut"
        else:
            answer, found_by = chunk_answer(completion.text, completion.finish_reason)
            stop = "answer" if answer is not None else ("length" if completion.finish_reason == "length" else "continue")
        chunk = Chunk(completion.text, answer, stop, found_by, reasoning)
        state.ledger.chunk(usage.prompt_tokens, usage.completion_tokens)
        record = {
            "iteration": iteration,
            "tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "thinking_tokens": usage.reasoning_tokens or context.tokens.count(reasoning),
            "thinking_finished": not completion.thinking_unfinished,
            "continued_tokens": context.tokens.count(thinking),
            "has_answer": chunk.answer is not None,
            "stop": chunk.stop,
        }
        state.iterations.append(record)
        ended = {k: v for k, v in record.items() if k not in ("tokens", "continued_tokens")}  # the event's fields
        context.emit(IterationEnd(trace_id=context.trace_id, strategy=self.name, **ended))
        return chunk

    async def _carry(self, chunk: Chunk, state: RunState, iteration: int, cfg: BoundedContextConfig, context: StrategyContext) -> bool:
        """Make the next chunk's carryover; False when it would leave the next prompt as it was (no progress)."""
        before = (state.head, state.carryover)
        delethink = state.mode == "delethink"
        # delethink carries the thinking; the other modes the chunk's visible reasoning, and a chunk with none (cut while
        # thinking) by its thinking, which the endpoint handed over apart or left in the text's tags, rather than by nothing
        material = (
            chunk.reasoning if delethink else strip_thinking(chunk.text) or chunk.reasoning or _THINK_TAG.sub(" ", chunk.text).strip()
        )
        if iteration == 0:
            state.head = context.tokens.head(material, cfg.head_tokens)
            if delethink:  # the raw tail of the thinking is what follows its head
                material = (
                    material[len(state.head) :]
                    if material.startswith(state.head)
                    else context.tokens.tail(material, context.tokens.count(material) - cfg.head_tokens)
                )
        if not material and not delethink:
            return False
        summary = await self._summarize(state, material, cfg, context) if state.mode == "summary" else None
        fallback = state.mode == "summary" and summary is None
        if summary is None:  # the raw tail: of the thinking so far in delethink mode, else of this chunk's reasoning
            summary = context.tokens.tail((state.carryover if delethink else "") + material, cfg.carryover_size)
        state.carryover = summary
        # the thinking carried unchanged: the next chunk would continue from exactly where this one did
        if delethink and (state.head, state.carryover) == before:
            return False
        carried = state.kept()
        state.compressions += 1
        state.fallbacks += fallback
        state.iterations[-1]["carryover_tokens"] = context.tokens.count(carried)
        context.emit(
            Carryover(
                trace_id=context.trace_id,
                strategy=self.name,
                iteration=iteration,
                mode=state.mode or "tail",
                tokens=state.iterations[-1]["carryover_tokens"],
                text=carried,
                fallback=fallback,
            )
        )
        return True

    async def _summarize(self, state: RunState, visible: str, cfg: BoundedContextConfig, context: StrategyContext) -> str | None:
        """A structured carryover of at most carryover_size tokens, or None when the model gives none."""
        frame = SUMMARY_FRAME.format(query=state.query, carryover=state.carryover or NO_CARRYOVER)
        framed = lambda source: (system(SUMMARY_INSTRUCTIONS), user(frame + source))
        room = cfg.chunk_size - self._prompt(framed(""), state, context)
        source = context.tokens.tail(visible, max(math.floor((room - cfg.carryover_size) / state.prompt_ratio), 0))
        # tokens do not add up across a join (the frame's end and the source's start may encode
        # differently together), so the budget comes from the prompt as sent, never from the parts
        while (room := cfg.chunk_size - self._prompt(framed(source), state, context)) < cfg.carryover_size and source:
            cut = math.ceil((cfg.carryover_size - room) / state.prompt_ratio) + 1
            source = context.tokens.tail(source, max(context.tokens.count(source) - cut, 0))
        messages, max_tokens = framed(source), min(cfg.carryover_size, room)
        if max_tokens < 1:
            context.warn(self.name, "carryover_fallback", "the summary prompt alone fills chunk_size; carrying the raw tail")
            return None
        try:
            completion = await context.llm.complete(
                LLMRequest(messages=messages, max_tokens=max_tokens, temperature=0.0, purpose="summarize")
            )
        except LLMError as exc:
            context.warn(self.name, "carryover_fallback", f"summary generation failed ({type(exc).__name__}); carrying the raw tail")
            return None
        state.calibrate(count_messages(context.tokens, messages), completion.usage.prompt_tokens)
        state.ledger.other(completion.usage.prompt_tokens, completion.usage.completion_tokens)
        summary = strip_thinking(completion.text)
        if not summary:
            context.warn(self.name, "carryover_fallback", "the summary came back empty; carrying the raw tail")
            return None
        return context.tokens.head(summary, cfg.carryover_size)

    async def _final_answer(self, state: RunState, cfg: BoundedContextConfig, context: StrategyContext) -> str:
        """One more call that must answer: in delethink mode the thinking so far, closed (`thinking_budget=0`), else the
        last carryover with an instruction to answer now."""
        messages, thinking, room = self._fit(state, max(len(state.iterations), 1), cfg, context, final=True)
        if room < 1:
            raise InvalidParamsError(
                f"context size exceeded: the final-answer prompt takes {cfg.chunk_size - room} of chunk_size {cfg.chunk_size} tokens; "
                "shorten the query or raise chunk_size"
            )
        completion = await context.llm.complete(
            LLMRequest(
                messages=messages,
                max_tokens=min(room, FINAL_ANSWER_TOKENS),
                stop=() if state.mode == "delethink" else ("</answer>",),
                temperature=0.0,
                purpose="final_answer",
                continue_thinking=thinking or None,
                thinking_budget=0 if state.thinks else None,
            )
        )
        state.ledger.other(completion.usage.prompt_tokens, completion.usage.completion_tokens)
        found = None if completion.thinking_unfinished else find_answer(completion.text, numeric=numeric_question(state.query))
        answer = found.answer if found is not None else ""
        state.found_by = found.found_by if found is not None else None
        if not answer.strip():
            raise ModelBehaviorError(
                "the final-answer call held no answer ("
                + ("it ended still thinking" if completion.thinking_unfinished else "an empty <answer>, or nothing outside <thinking>")
                + "); raise max_iterations or chunk_size so the reasoning can finish, or check the model",
                {"total_iterations": len(state.iterations), "thinking_unfinished": completion.thinking_unfinished},
            )
        return answer

    def _progress(self, cfg: BoundedContextConfig, state: RunState) -> dict[str, Any]:
        """The metrics a finished and an interrupted run share."""
        return {
            "iterations": state.iterations,
            "total_iterations": len(state.iterations),
            "reasoning_capacity_tokens": capacity(cfg),
            **state.ledger.summary(),
        }

    def _partial(self, cfg: BoundedContextConfig, state: RunState) -> dict[str, Any]:
        return {**self._progress(cfg, state), "last_carryover": state.kept()}

    def _result(
        self, context: StrategyContext, cfg: BoundedContextConfig, state: RunState, answer: str, stopped_by: str
    ) -> ReasoningResult:
        return context.result(
            self.name,
            answer,
            stopped_by=stopped_by,
            carryover_mode=state.mode or "tail",
            carryover_compressions=state.compressions,
            carryover_fallbacks=state.fallbacks,
            found_by=state.found_by,
            **self._progress(cfg, state),
        )


def chunk_answer(text: str, finish_reason: str) -> tuple[str | None, FoundBy | None]:
    """A chunk's answer: its `<answer>`, or (when it stopped rather than ran out of tokens) the answer its
    last visible line states; (None, None) while the reasoning goes on. `text` is the answer text only: a reply
    cut inside its thinking has none."""
    tagged = extract_answer(text)
    if tagged is not None:
        return tagged, "tag"
    lines = [line for line in strip_thinking(text).splitlines() if line.strip()]
    if finish_reason == "length" or not lines:
        return None, None
    stated = find_answer(lines[-1], fallback=False)
    return (stated.answer, "phrase") if stated is not None and stated.found_by == "phrase" else (None, None)


def stopped(completion: Completion) -> bool:
    """The reply ended by itself: neither cut by max_tokens nor stopped on `<continue>` (reported by the server, or left
    at the end of the text)."""
    asked = completion.choices[0].stop_sequence == "<continue>" or completion.text.rstrip().endswith("<continue>")
    return completion.finish_reason != "length" and not asked


def capacity(cfg: BoundedContextConfig) -> int:
    """How many tokens of reasoning a run can hold in all: the first chunk, then each later chunk adds what
    is not carried over: chunk_size + (max_iterations - 1) x (chunk_size - carryover_size)."""
    return cfg.chunk_size + (cfg.max_iterations - 1) * (cfg.chunk_size - cfg.carryover_size)
