"""A model that thinks before it answers, as vLLM with a reasoning parser hands it over: the thinking in
`Choice.reasoning`, the answer in `Choice.text`, and a reply cut by `max_tokens` inside the thinking comes
back with no answer text and `thinking_unfinished`.

It thinks `think` tokens in all, writing a progress marker ("[progress 120/900]") every sentence, and
resumes from the furthest marker its prompt shows (in any message or in the thinking it is asked to
continue): so a chunk that carried nothing forward starts over, and one that carried the thinking resumes.
A request with `thinking_budget=0` answers at once (budget forcing, as the gateway does it). Its summaries
(purpose "summarize") restate the furthest marker they were shown. Used by the bounded-context tests and
bench/bounded_context.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from reasonray.gateway.protocol import Choice, Completion, LLMRequest, Usage
from reasonray.gateway.tokens import count_messages, counter_for_model

COUNTER = counter_for_model("simulated")
_MARKER = re.compile(r"\[progress (\d+)/(\d+)\]")
OPENING = "Okay, so the question asks for a running total. Let me restate it before I start: every step adds to the sum, "
SENTENCE = "step {n}: I carry the running total forward and check it once more. [progress {done}/{total}] "


@dataclass
class Call:
    """What the model saw and did on one call."""

    request: LLMRequest
    resumed_from: int  # the furthest progress its prompt showed (0: it started over)
    reached: int  # where its thinking got to
    finished: bool  # its thinking closed
    thinking: str  # the thinking it wrote


@dataclass
class ThinkingModel:
    think: int = 900
    answer: str = "7"
    model: str = "thinking-double"
    calls: list[Call] = field(default_factory=list)

    @property
    def requests(self) -> list[LLMRequest]:
        return [c.request for c in self.calls]

    def furthest(self, request: LLMRequest) -> int:
        shown = " ".join(m.content or "" for m in request.messages) + " " + (request.continue_thinking or "")
        return max((int(m.group(1)) for m in _MARKER.finditer(shown)), default=0)

    async def complete(self, request: LLMRequest) -> Completion:
        done = self.furthest(request)
        prompt = count_messages(COUNTER, request.messages) + COUNTER.count(request.continue_thinking or "")
        if request.purpose == "summarize":
            text = f"Current Strategy: add step by step\nKey Findings: none\nProgress: [progress {done}/{self.think}]\nNext Steps: go on\nUnresolved: none"
            return self._reply(request, done, done, "", text, prompt, finished=True)
        if request.thinking_budget == 0:  # forced: the thinking is closed and the model answers from it
            return self._reply(request, done, done, "", f"<answer>{self.answer}</answer>", prompt, finished=True)
        budget = request.max_tokens or 10**9
        thinking = "" if done else OPENING
        n = 0
        while done < self.think:
            sentence = SENTENCE.format(n=n, done=min(done + 20, self.think), total=self.think)
            if COUNTER.count(thinking + sentence) > budget:
                return self._reply(request, self.furthest(request), done, thinking, "", prompt, finished=False)
            thinking += sentence
            done, n = min(done + 20, self.think), n + 1
        return self._reply(
            request,
            self.furthest(request),
            done,
            thinking,
            f"The total is {self.answer}. <answer>{self.answer}</answer>",
            prompt,
            finished=True,
        )

    def _reply(self, request: LLMRequest, start: int, reached: int, thinking: str, text: str, prompt: int, *, finished: bool) -> Completion:
        self.calls.append(Call(request, start, reached, finished, thinking))
        generated = COUNTER.count(thinking) + COUNTER.count(text)
        choice = Choice(text=text, finish_reason="stop" if finished else "length", reasoning=thinking, thinking_unfinished=not finished)
        return Completion(choices=(choice,), usage=Usage(prompt, generated, COUNTER.count(thinking)), model=self.model)
