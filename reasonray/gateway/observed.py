"""`ObservedLLM`: the LLM a strategy sees. Every call becomes an `LLM_INVOCATION` event, counts
towards the run's tally, and is held to the run's token budget."""

from __future__ import annotations

import json
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import msgspec
import structlog

from reasonray.gateway.capabilities import Layer
from reasonray.gateway.protocol import LLM, Completion, LLMRequest, Message, with_system_note
from reasonray.gateway.tokens import TokenCounter, count_messages, counter_of
from reasonray.kernel import tracing
from reasonray.kernel.errors import BudgetExceededError
from reasonray.kernel.events import Budget, EventSink, LLMInvocation, RunWarning, Tally

log = structlog.get_logger("reasonray.events")


class Sampling(msgspec.Struct, frozen=True, omit_defaults=True):
    """Sampling the caller asked for, applied to every call of its run (None: the strategy's own choice)."""

    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    """Mixed into each call's own seed, so a run is reproducible while its branches still differ."""

    def apply(self, request: LLMRequest) -> LLMRequest:
        changes: dict[str, Any] = {
            k: v for k in ("temperature", "top_p", "presence_penalty", "frequency_penalty") if (v := getattr(self, k)) is not None
        }
        if self.seed is not None:
            changes["seed"] = self.seed if request.seed is None else (self.seed * 1_000_003 + request.seed) % 2**31
        return msgspec.structs.replace(request, **changes) if changes else request


OMITTED = "\n[... {n} tokens omitted to fit the prompt budget ...]\n"


@dataclass(eq=False, repr=False)
class ObservedLLM(Layer):
    """Emits an LLM_INVOCATION event per call and keeps the run's tally.

    It also applies what is the run's, not the strategy's, to every request: retrieved memories
    (`guidance`, added to the system message) and the token budget. Before each call it counts the
    prompt; a prompt above `max_prompt_tokens` loses the middle of its longest message (head and tail
    kept, a WARNING event says how much went); `max_tokens` is capped by `max_output_tokens` and by
    what is left of `max_total_tokens`, so the run never spends more than its budget, and a call that
    cannot fit fails with BudgetExceededError before it is made. `spent` counts tokens used elsewhere
    in the run (a fan-out branch starts from its parent's total).
    """

    inner: LLM
    emit: EventSink
    _: KW_ONLY
    trace_id: str
    strategy: str
    guidance: str | None = None
    budget: Budget = field(default_factory=Budget)
    spent: int = 0
    counter: TokenCounter | None = None
    spent_completion: int = 0
    sampling: Sampling | None = None
    tally: Tally = field(default_factory=Tally, init=False)

    @property
    def tokens(self) -> TokenCounter:
        """What the run counts with: the budget's counter, else the endpoint's (the model's own tokens where known)."""
        return self.counter or counter_of(self.inner)

    @property
    def spent_tokens(self) -> int:
        return self.spent + self.tally.prompt_tokens + self.tally.completion_tokens

    def branch_options(self, branches: int = 1) -> dict[str, Any]:
        """What a branch running elsewhere needs to apply the same guidance and budget.

        Each of `branches` concurrent branches gets an equal share of what is left of the total budget,
        so together they cannot overspend it.
        """

        def shared(limit: int | None, used: int) -> int:  # what a branch starts from: all but its share of what is left
            return used if limit is None else limit - max(limit - used, 0) // max(branches, 1)

        spent = shared(self.budget.max_total_tokens, self.spent_tokens)
        completion = shared(self.budget.max_completion_tokens, self.spent_completion + self.tally.completion_tokens)
        options: dict[str, Any] = {"guidance": self.guidance, "budget": self.budget, "spent": spent}
        if completion or self.sampling is not None:  # only what a branch needs beyond the original three
            options |= {"spent_completion": completion, "sampling": self.sampling}
        return options

    def _within_budget(self, request: LLMRequest) -> LLMRequest:
        b = self.budget
        if b.max_prompt_tokens is None and b.max_output_tokens is None and b.max_total_tokens is None and b.max_completion_tokens is None:
            return request
        counter = self.counter or counter_of(self.inner)
        messages = request.messages
        prompt = count_messages(counter, messages)
        if b.max_prompt_tokens is not None and prompt > b.max_prompt_tokens:
            messages, prompt = self._truncate(counter, messages, prompt, b.max_prompt_tokens)
        max_tokens = request.max_tokens
        for cap in (b.max_output_tokens, self._total_left(1, prompt), self._completion_left(1)):
            if cap is not None:
                max_tokens = min(max_tokens or cap, cap)
        return msgspec.structs.replace(request, messages=messages, max_tokens=max_tokens)

    def _completion_left(self, tokens: int) -> int | None:
        """What the completion budget leaves to generate (None: no such budget); raises when under `tokens`."""
        b = self.budget
        if b.max_completion_tokens is None:
            return None
        generated = self.spent_completion + self.tally.completion_tokens
        if (left := b.max_completion_tokens - generated) < tokens:
            raise BudgetExceededError(
                f"the request's completion budget ({b.max_completion_tokens} tokens, reasoning included) is spent: "
                f"{generated} generated so far; raise max_completion_tokens",
                {"max_completion_tokens": b.max_completion_tokens, "completion_tokens": generated},
            )
        return left

    def _total_left(self, tokens: int, prompt: int = 0) -> int | None:
        """What the total budget leaves after the next call's `prompt` (None: no such budget); raises when under `tokens`."""
        b, spent = self.budget, self.spent_tokens
        if b.max_total_tokens is None:
            return None
        if (left := b.max_total_tokens - spent - prompt) < tokens:
            next_prompt = f" and the next call's prompt alone is {prompt} tokens" if prompt else ""
            raise BudgetExceededError(
                f"the request's token budget ({b.max_total_tokens} tokens) is spent: {spent} used so far{next_prompt}; "
                "raise budget.max_total_tokens",
                {"max_total_tokens": b.max_total_tokens, "spent_tokens": spent, **({"next_prompt_tokens": prompt} if prompt else {})},
            )
        return left

    def require_room(self, tokens: int) -> None:
        """Raise the budget's own error when the run's budget leaves fewer than `tokens` tokens to generate: a
        strategy whose last call the budget cut short learns that the budget, not the model, stopped it."""
        self._completion_left(tokens)
        self._total_left(tokens)

    def _truncate(self, counter: TokenCounter, messages: tuple[Message, ...], prompt: int, limit: int) -> tuple[tuple[Message, ...], int]:
        index = max(range(len(messages)), key=lambda i: counter.count(messages[i].content or ""))
        text = messages[index].content or ""
        excess = prompt - limit
        keep = counter.count(text) - excess - counter.count(OMITTED.format(n=excess)) - 2
        if keep < 2:
            raise BudgetExceededError(
                f"the prompt is {prompt} tokens and cannot be cut to the budget's max_prompt_tokens={limit} "
                "without losing all of it; raise budget.max_prompt_tokens",
                {"prompt_tokens": prompt, "max_prompt_tokens": limit},
            )
        cut = counter.head(text, keep // 2) + OMITTED.format(n=excess) + counter.tail(text, keep - keep // 2)
        messages = (*messages[:index], msgspec.structs.replace(messages[index], content=cut), *messages[index + 1 :])
        after = count_messages(counter, messages)
        self._warn(
            "prompt_truncated",
            f"the prompt was {prompt} tokens, above max_prompt_tokens={limit}: the middle of message "
            f"{index} ({messages[index].role}) was omitted, head and tail kept ({after} tokens now)",
        )
        return messages, after

    async def complete(self, request: LLMRequest) -> Completion:
        if self.guidance:
            request = msgspec.structs.replace(request, messages=with_system_note(request.messages, self.guidance))
        request = self._within_budget(request)
        if self.sampling is not None:
            request = self.sampling.apply(request)
        # a model call span, GenAI semantic conventions (no-op unless OTEL_* configure an exporter)
        requested = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": self.model,
            "gen_ai.request.max_tokens": request.max_tokens,
            "gen_ai.request.temperature": request.temperature,
            "gen_ai.request.seed": request.seed,
            "reasonray.strategy": self.strategy,
            "reasonray.trace_id": self.trace_id,
        }
        with tracing.span(f"chat {self.model}", requested, kind="client") as span:
            try:
                completion = await self.inner.complete(request)
            except Exception as exc:  # a call that failed was still made: it counts, with what its attempts are known to have cost
                spent: tuple[int, int] = getattr(exc, "spent", (0, 0))
                self.tally.add(Tally(*spent, calls=1, retries=max(getattr(exc, "attempts", 1) - 1, 0)))
                raise
            if span is not tracing.NO_SPAN:
                span.set(self._span_attributes(request, completion))
        unenforced = completion.thinking_control == "unsupported"  # a budget, an effort or a continuation was asked, none held
        call = Tally(**msgspec.structs.asdict(completion.usage), thinking_unenforced=unenforced, calls=1, cache_hits=completion.cached)
        call.retries, call.simulated, call.model = max(completion.attempts - 1, 0), completion.simulated, completion.model
        self.tally.add(call)
        if unenforced and self.tally.thinking_unenforced == 1:  # said once a run: the result's metrics count them all
            self._warn(
                "thinking_budget_unenforced",
                f"{self.model} at this endpoint can neither take a reasoning effort nor continue a reply: "
                "the thinking budget was not enforced (docs/reasoning-models.md)",
            )
        self.emit(
            LLMInvocation(
                trace_id=self.trace_id,
                strategy=self.strategy,
                messages=[msgspec.to_builtins(m) for m in request.messages],
                responses=[c.text for c in completion.choices],
                finish_reason=completion.finish_reason,
                **msgspec.structs.asdict(completion.usage),  # prompt, completion and reasoning tokens
                latency_ms=round(completion.latency_ms, 3),
                cached=completion.cached,
                attempts=completion.attempts,
                model=completion.model,
                simulated=completion.simulated,
                reasoning=[c.reasoning for c in completion.choices],
            )
        )
        return completion

    def _warn(self, code: str, message: str) -> None:
        self.emit(RunWarning(trace_id=self.trace_id, strategy=self.strategy, code=code, message=message))

    @staticmethod
    def _span_attributes(request: LLMRequest, completion: Completion) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "gen_ai.response.model": completion.model,
            "gen_ai.response.finish_reasons": [completion.finish_reason or "unknown"],
            "gen_ai.usage.input_tokens": completion.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": completion.usage.completion_tokens,
            "reasonray.cached": completion.cached,
            "reasonray.attempts": completion.attempts,
            "reasonray.simulated": completion.simulated,
        }
        if tracing.content_allowed():  # `[events] record = "full"`: the text, as the event log has it
            attributes["gen_ai.input.messages"] = json.dumps([msgspec.to_builtins(m) for m in request.messages])
            attributes["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "content": c.text} for c in completion.choices])
        return attributes
