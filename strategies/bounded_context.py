"""Bounded-context reasoning (Delethink-style): reasoning in chunks whose context never exceeds
`chunk_size` tokens, each chunk starting from the query and a carryover of the one before.

`tail` carries the first `head_tokens` of the first chunk and the last `carryover_size` tokens of
the previous one (no extra call); `summary` asks the model for a structured carryover and falls back
to the raw tail when that fails. Only the current chunk and the carryover are held in memory; the
full text of every chunk goes to the event log.

The bound holds by the model's own count: every cut uses the context's token counter, and each call's
`max_tokens` is what is left of `chunk_size` after the prompt as the server will count it. Until the
server has reported a prompt's size, that is the counter's count x 1.15 plus a margin for the chat
template's framing; after, the ratio of the server's count to ours on the largest prompt of the run so
far (raised to the largest ratio seen on a reply's text, since carryovers are cut from replies), plus that
margin (which covers the framing's constant part). `iterations[].tokens` are the server's usage.

A chunk answers with `<answer>`; a model that ignores the tag answers with a chunk that stops (not
cut by `max_tokens`) on a last line stating it ("The answer is: 76", "#### 76"). The final-answer
call's reply is read as chain of thought's is. `found_by` says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from reasonray.gateway.errors import LLMError
from reasonray.gateway.protocol import LLMRequest, Message, system, user
from reasonray.gateway.tokens import count_messages
from reasonray.kernel.errors import (
    InvalidParamsError,
    MaxIterationsError,
    ModelBehaviorError,
    attach_partial,
)
from reasonray.kernel.events import Carryover, IterationEnd, RunWarning
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
FINAL_INSTRUCTION = "You have used your reasoning budget. Stop reasoning and give your final answer now inside <answer></answer>."
# The later chunks' prompt: the query, then what is carried over (tail mode: the head and the tail).
TAIL_MEMORY = "It began:\n{head}\n[...]\nMost recently:\n{carryover}"
SUMMARY_MEMORY = "Carryover from your earlier reasoning:\n{carryover}"
CONTINUE_PROMPT = "{query}\n\n--- Your reasoning so far ---\n{memory}\n--- Continue from here. ---"
FINAL_PROMPT = "{prompt}\n\n{instruction}"
SUMMARY_FRAME = "Problem:\n{query}\n\nPrevious carryover:\n{carryover}\n\nLatest reasoning:\n"
NO_CARRYOVER = "(none)"
STOP_SEQUENCES = ("</answer>", "<continue>")
MIN_GENERATION_TOKENS = 256
FINAL_ANSWER_TOKENS = 512
UNCALIBRATED_RATIO = 1.15  # before the server has counted a prompt: real tokenizers ran 5-14% above cl100k
MIN_CALIBRATION_TOKENS = 32  # a reply shorter than this (in our count) says little about the ratio between tokenizers
PROMPT_MARGIN = 16  # chat-template framing a counter does not see (ChatML: a token or two per message)


class BoundedContextConfig(StrategyConfig):
    chunk_size: int = Field(
        8192, ge=1024, le=32768, description="Most tokens in one iteration's context: prompt, carryover and generation."
    )
    carryover_size: int = Field(4096, ge=512, le=16384, description="Most tokens carried into the next iteration; below chunk_size.")
    max_iterations: int = Field(5, ge=1, le=50, description="Most iterations; capped by the server's max_allowed_iterations.")
    carryover_mode: Literal["tail", "summary"] = Field(
        "tail",
        description="tail: the last carryover_size tokens (Delethink, no extra call); summary: a structured summary written by the model.",
    )
    head_tokens: int = Field(100, ge=0, le=1024, description="Tokens of the first chunk kept in every later prompt (tail mode).")
    on_max_iterations: Literal["error", "final_answer"] = Field(
        "error",
        description="error: fail with -32009 and the partial trace; final_answer: one more call for an answer from the last carryover.",
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
    prompt_tokens: int
    completion_tokens: int
    answer: str | None
    stop: str
    found_by: FoundBy | None = None


@dataclass
class RunState:
    """All a run holds between iterations: the head and carryover text (bounded by the config, whatever
    the depth) and a few numbers per iteration for its metrics."""

    head: str = ""
    carryover: str = ""
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
        self._check_limits(cfg)
        state = RunState()
        try:
            for iteration in range(cfg.max_iterations):
                chunk = await self._reason_chunk(query, state, iteration, cfg, context)
                if chunk.answer is not None:
                    state.found_by = chunk.found_by
                    return self._result(context, cfg, state, chunk.answer, "answer")
                await self._carry(query, chunk, state, iteration, cfg, context)
            if cfg.on_max_iterations == "final_answer":
                return self._result(context, cfg, state, await self._final_answer(query, state, cfg, context), "final_answer")
        except BaseException as exc:  # provider, budget, deadline, cancellation: keep the iterations done
            raise attach_partial(exc, self._partial(cfg, state)) from None
        raise self._out_of_iterations(cfg, state)

    def _check_limits(self, cfg: BoundedContextConfig) -> None:
        allowed = self.settings.max_allowed_iterations
        if cfg.max_iterations > allowed:
            raise InvalidParamsError(
                f"max_iterations {cfg.max_iterations} exceeds this server's max_allowed_iterations ({allowed}): ask for at most {allowed}",
                {"max_allowed_iterations": allowed},
            )

    def _messages(self, query: str, state: RunState, iteration: int, cfg: BoundedContextConfig) -> tuple[Message, ...]:
        if iteration == 0:
            return system(INSTRUCTIONS), user(query)
        if cfg.carryover_mode == "tail":
            memory = TAIL_MEMORY.format(head=state.head, carryover=state.carryover)
        else:
            memory = SUMMARY_MEMORY.format(carryover=state.carryover)
        return system(INSTRUCTIONS), user(CONTINUE_PROMPT.format(query=query, memory=memory))

    def _prompt(self, messages: tuple[Message, ...], state: RunState, context: StrategyContext) -> int:
        """The prompt's size as the server will count it (see the module docstring)."""
        return math.ceil(count_messages(context.tokens, messages) * state.prompt_ratio) + PROMPT_MARGIN

    def _fit(
        self, query: str, state: RunState, iteration: int, cfg: BoundedContextConfig, context: StrategyContext
    ) -> tuple[tuple[Message, ...], int]:
        """The iteration's messages and generation budget, shortening the carryover if the prompt is too long."""
        messages = self._messages(query, state, iteration, cfg)
        room = cfg.chunk_size - self._prompt(messages, state, context)
        if room < MIN_GENERATION_TOKENS and state.carryover:
            while room < MIN_GENERATION_TOKENS and state.carryover:
                keep = max(0, context.tokens.count(state.carryover) - math.ceil((MIN_GENERATION_TOKENS - room) / state.prompt_ratio) - 1)
                state.carryover = context.tokens.tail(state.carryover, keep)
                messages = self._messages(query, state, iteration, cfg)
                room = cfg.chunk_size - self._prompt(messages, state, context)
            kept = context.tokens.count(state.carryover)
            self._warn(context, "carryover_truncated", f"carryover cut to {kept} tokens to fit chunk_size {cfg.chunk_size}")
        if room < MIN_GENERATION_TOKENS:
            raise InvalidParamsError(
                f"context size exceeded: the prompt takes {cfg.chunk_size - room} of chunk_size {cfg.chunk_size} tokens "
                f"(as the model counts them, with a margin), leaving {room} to reason in (at least {MIN_GENERATION_TOKENS} "
                "needed); shorten the query, reduce carryover_size or raise chunk_size"
            )
        return messages, room

    async def _reason_chunk(
        self, query: str, state: RunState, iteration: int, cfg: BoundedContextConfig, context: StrategyContext
    ) -> Chunk:
        messages, room = self._fit(query, state, iteration, cfg, context)
        completion = await context.llm.complete(
            LLMRequest(messages=messages, max_tokens=room, stop=STOP_SEQUENCES, temperature=cfg.temperature, seed=cfg.seed)
        )
        state.calibrate(count_messages(context.tokens, messages), completion.usage.prompt_tokens)
        state.calibrate_text(context.tokens.count(completion.text), completion.usage.completion_tokens)
        answer, found_by = chunk_answer(completion.text, completion.finish_reason)
        stop = "answer" if answer is not None else ("length" if completion.finish_reason == "length" else "continue")
        chunk = Chunk(completion.text, completion.usage.prompt_tokens, completion.usage.completion_tokens, answer, stop, found_by)
        state.ledger.chunk(chunk.prompt_tokens, chunk.completion_tokens)
        state.iterations.append(
            {
                "iteration": iteration,
                "tokens": chunk.prompt_tokens + chunk.completion_tokens,
                "prompt_tokens": chunk.prompt_tokens,
                "completion_tokens": chunk.completion_tokens,
                "has_answer": answer is not None,
                "stop": stop,
            }
        )
        context.emit(
            IterationEnd(
                trace_id=context.trace_id,
                strategy=self.name,
                iteration=iteration,
                prompt_tokens=chunk.prompt_tokens,
                completion_tokens=chunk.completion_tokens,
                has_answer=answer is not None,
                stop=stop,
            )
        )
        return chunk

    async def _carry(
        self, query: str, chunk: Chunk, state: RunState, iteration: int, cfg: BoundedContextConfig, context: StrategyContext
    ) -> None:
        visible = strip_thinking(chunk.text)
        if iteration == 0:
            state.head = context.tokens.head(visible, cfg.head_tokens)
        fallback = False
        if cfg.carryover_mode == "summary":
            summary = await self._summarize(query, state, visible, cfg, context)
            fallback = summary is None
            state.carryover = summary if summary is not None else context.tokens.tail(visible, cfg.carryover_size)
        else:
            state.carryover = context.tokens.tail(visible, cfg.carryover_size)
        state.compressions += 1
        state.fallbacks += fallback
        state.iterations[-1]["carryover_tokens"] = context.tokens.count(state.carryover)
        context.emit(
            Carryover(
                trace_id=context.trace_id,
                strategy=self.name,
                iteration=iteration,
                mode=cfg.carryover_mode,
                tokens=state.iterations[-1]["carryover_tokens"],
                text=state.carryover,
                fallback=fallback,
            )
        )

    async def _summarize(
        self, query: str, state: RunState, visible: str, cfg: BoundedContextConfig, context: StrategyContext
    ) -> str | None:
        """A structured carryover of at most carryover_size tokens, or None when the model gives none."""
        frame = user(SUMMARY_FRAME.format(query=query, carryover=state.carryover or NO_CARRYOVER))
        framed = self._prompt((system(SUMMARY_INSTRUCTIONS), frame), state, context)
        room_for_source = math.floor((cfg.chunk_size - cfg.carryover_size - framed) / state.prompt_ratio)
        source = context.tokens.tail(visible, max(room_for_source, 0))
        messages = (system(SUMMARY_INSTRUCTIONS), user(frame.content + source))
        # tokens do not add up across a join (the frame's end and the source's start may encode
        # differently together), so the budget comes from the prompt as sent, never from the parts
        excess = self._prompt(messages, state, context) + cfg.carryover_size - cfg.chunk_size
        while excess > 0 and source:
            source = context.tokens.tail(source, max(context.tokens.count(source) - math.ceil(excess / state.prompt_ratio) - 1, 0))
            messages = (system(SUMMARY_INSTRUCTIONS), user(frame.content + source))
            excess = self._prompt(messages, state, context) + cfg.carryover_size - cfg.chunk_size
        max_tokens = min(cfg.carryover_size, cfg.chunk_size - self._prompt(messages, state, context))
        if max_tokens < 1:
            self._warn(context, "carryover_fallback", "the summary prompt alone fills chunk_size; carrying the raw tail")
            return None
        try:
            completion = await context.llm.complete(
                LLMRequest(messages=messages, max_tokens=max_tokens, temperature=0.0, purpose="summarize")
            )
        except LLMError as exc:
            self._warn(context, "carryover_fallback", f"summary generation failed ({type(exc).__name__}); carrying the raw tail")
            return None
        state.calibrate(count_messages(context.tokens, messages), completion.usage.prompt_tokens)
        state.ledger.other(completion.usage.prompt_tokens, completion.usage.completion_tokens)
        summary = strip_thinking(completion.text)
        if not summary:
            self._warn(context, "carryover_fallback", "the summary came back empty; carrying the raw tail")
            return None
        return context.tokens.head(summary, cfg.carryover_size)

    def _final_messages(self, query: str, state: RunState, cfg: BoundedContextConfig) -> tuple[Message, ...]:
        last = self._messages(query, state, len(state.iterations), cfg)
        return (last[0], user(FINAL_PROMPT.format(prompt=last[1].content, instruction=FINAL_INSTRUCTION)))

    async def _final_answer(self, query: str, state: RunState, cfg: BoundedContextConfig, context: StrategyContext) -> str:
        """One more call, from the last carryover, that must answer."""
        messages = self._final_messages(query, state, cfg)
        room = cfg.chunk_size - self._prompt(messages, state, context)
        if room < FINAL_ANSWER_TOKENS and state.carryover:  # the answer's room comes out of the carryover, as in _fit
            while room < FINAL_ANSWER_TOKENS and state.carryover:
                keep = max(0, context.tokens.count(state.carryover) - math.ceil((FINAL_ANSWER_TOKENS - room) / state.prompt_ratio) - 1)
                state.carryover = context.tokens.tail(state.carryover, keep)
                messages = self._final_messages(query, state, cfg)
                room = cfg.chunk_size - self._prompt(messages, state, context)
            kept = context.tokens.count(state.carryover)
            self._warn(context, "carryover_truncated", f"carryover cut to {kept} tokens to leave room for the final answer")
        if room < 1:
            raise InvalidParamsError(
                f"context size exceeded: the final-answer prompt takes {cfg.chunk_size - room} of chunk_size {cfg.chunk_size} tokens; "
                "shorten the query or raise chunk_size"
            )
        completion = await context.llm.complete(
            LLMRequest(
                messages=messages, max_tokens=min(room, FINAL_ANSWER_TOKENS), stop=("</answer>",), temperature=0.0, purpose="final_answer"
            )
        )
        state.ledger.other(completion.usage.prompt_tokens, completion.usage.completion_tokens)
        found = find_answer(completion.text, numeric=numeric_question(query))
        answer = found.answer if found is not None else ""
        state.found_by = found.found_by if found is not None else None
        if not answer.strip():
            raise ModelBehaviorError(
                "the final-answer call held no answer (an empty <answer>, or nothing outside <thinking>); "
                "raise max_iterations or chunk_size so the reasoning can finish, or check the model",
                {"total_iterations": len(state.iterations)},
            )
        return answer

    def _warn(self, context: StrategyContext, code: str, message: str) -> None:
        context.emit(RunWarning(trace_id=context.trace_id, strategy=self.name, code=code, message=message))

    def _progress(self, cfg: BoundedContextConfig, state: RunState) -> dict[str, Any]:
        """The metrics a finished and an interrupted run share."""
        return {
            "iterations": state.iterations,
            "total_iterations": len(state.iterations),
            "reasoning_capacity_tokens": capacity(cfg),
            **state.ledger.summary(),
        }

    def _partial(self, cfg: BoundedContextConfig, state: RunState) -> dict[str, Any]:
        return {**self._progress(cfg, state), "last_carryover": state.carryover}

    def _out_of_iterations(self, cfg: BoundedContextConfig, state: RunState) -> MaxIterationsError:
        allowed = self.settings.max_allowed_iterations
        suggestion = min(cfg.max_iterations * 2, allowed)
        hint = (
            f"Consider increasing max_iterations to {suggestion}."
            if suggestion > cfg.max_iterations
            else "max_iterations is at the server's limit: raise chunk_size or lower carryover_size instead."
        )
        return MaxIterationsError(
            f"Unable to complete reasoning within {cfg.max_iterations} iterations (capacity {capacity(cfg)} tokens). {hint}",
            {**self._partial(cfg, state), "suggested_max_iterations": suggestion},
        )

    def _result(
        self, context: StrategyContext, cfg: BoundedContextConfig, state: RunState, answer: str, stopped_by: str
    ) -> ReasoningResult:
        return context.result(
            self.name,
            answer,
            stopped_by=stopped_by,
            carryover_mode=cfg.carryover_mode,
            carryover_compressions=state.compressions,
            carryover_fallbacks=state.fallbacks,
            found_by=state.found_by,
            **self._progress(cfg, state),
        )


def chunk_answer(text: str, finish_reason: str) -> tuple[str | None, FoundBy | None]:
    """A chunk's answer: its `<answer>`, or (when it stopped rather than ran out of tokens) the answer its
    last visible line states; (None, None) while the reasoning goes on."""
    tagged = extract_answer(text)
    if tagged is not None:
        return tagged, "tag"
    lines = [line for line in strip_thinking(text).splitlines() if line.strip()]
    if finish_reason == "length" or not lines:
        return None, None
    stated = find_answer(lines[-1], fallback=False)
    return (stated.answer, "phrase") if stated is not None and stated.found_by == "phrase" else (None, None)


def capacity(cfg: BoundedContextConfig) -> int:
    """How many tokens of reasoning a run can hold in all: the first chunk, then each later chunk adds what
    is not carried over: chunk_size + (max_iterations - 1) x (chunk_size - carryover_size)."""
    return cfg.chunk_size + (cfg.max_iterations - 1) * (cfg.chunk_size - cfg.carryover_size)
