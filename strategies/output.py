"""How a strategy asks for an answer, a score, a step or a choice, and reads what came back.

Where the endpoint enforces a JSON schema (`capabilities_of(llm).structured_output`), the request
carries `response_format` and its system message says which fields to fill; elsewhere the prompt's
tags are all the model is given, and `reasonray.kernel.extraction` reads the reply tolerantly. Either
way the result says how the answer was found (`found_by`), and a reply found by anything less than
the structure asked for is a WARNING event (`answer_format`) in the run's trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from reasonray.gateway.capabilities import capabilities_of
from reasonray.gateway.protocol import LLMRequest, system, user, with_system_note
from reasonray.kernel.extraction import Extracted
from reasonray.strategies.base import StrategyContext
from reasonray.strategies.context_fit import fitted


@dataclass(frozen=True)
class OutputFormat:
    """A JSON schema a reply must fill where the endpoint enforces one, and what the prompt says of it."""

    name: str
    schema: dict[str, Any]
    note: str


def _object(**properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


_TEXT = {"type": "string"}
# no minimum/maximum: not every enforcing endpoint accepts them in a strict schema; the readers check ranges
_NUMBER = {"type": "number"}
ANSWER = OutputFormat(
    "answer",
    _object(reasoning=_TEXT, answer=_TEXT),
    'Reply with a JSON object: "reasoning" (your step-by-step reasoning), then "answer" (only the final answer).',
)
CRITIQUE = OutputFormat(
    "critique",
    _object(score=_NUMBER, feedback=_TEXT),
    'Reply with a JSON object: "score" (0 to 1), then "feedback" (what to fix).',
)
SCORE = OutputFormat("score", _object(score=_NUMBER), 'Reply with a JSON object: "score" (0 to 1).')
STEP = OutputFormat(
    "step",
    _object(step=_TEXT, answer=_TEXT),
    'Reply with a JSON object: "step" (the next step only), and "answer" (the final answer if the steps so far determine it, else "").',
)
VOTE = OutputFormat(
    "vote",
    _object(reasoning=_TEXT, vote={"type": "integer"}),
    'Reply with a JSON object: "reasoning", then "vote" (the number of the best candidate).',
)


def structured(context: StrategyContext) -> bool:
    """Whether the context's endpoint enforces a JSON schema on its replies."""
    return capabilities_of(context.llm).structured_output


def shaped(request: LLMRequest, output: OutputFormat, enforced: bool) -> LLMRequest:
    """`request` asking for `output` as JSON when the endpoint enforces it (the system message says so too);
    unchanged otherwise, its tags being what the model is asked for."""
    if not enforced:
        return request
    messages = with_system_note(request.messages, output.note)
    response_format = {"type": "json_schema", "json_schema": {"name": output.name, "schema": output.schema, "strict": True}}
    return msgspec.structs.replace(request, messages=messages, response_format=response_format)


def asking(output: OutputFormat, instructions: str, prompt: str, enforced: bool, **fields: Any) -> LLMRequest:
    """A request of `instructions` (the system message) and `prompt` for `output`, as JSON where it is `enforced`."""
    return shaped(LLMRequest(messages=(system(instructions), user(prompt)), **fields), output, enforced)


Quoting = Callable[[tuple[str, ...]], str]  # a prompt quoting earlier replies, made from the texts as they were cut


async def ask(
    context: StrategyContext, output: OutputFormat, instructions: str, prompt: str | Quoting, quoted: tuple[str, ...] = (), **fields: Any
) -> tuple[Any, bool]:
    """The completion of `asking(...)` on the context's model, and whether the endpoint enforced `output`. A prompt that
    quotes earlier replies is `prompt(quoted)`, the texts cut (head and tail, `context_fit.fitted`) where the whole would
    not fit the model's context."""
    enforced = structured(context)
    build = lambda parts: asking(output, instructions, prompt if isinstance(prompt, str) else prompt(parts), enforced, **fields)
    return await context.llm.complete(fitted(context, build, quoted) if quoted else build(())), enforced


def note_found_by(context: StrategyContext, strategy: str, extracted: Extracted, where: str = "the answer") -> None:
    """A WARNING event when the model did not give `where` in the structure it was asked for."""
    if not extracted.structured:
        context.warn(strategy, "answer_format", f"the model gave {where} without the requested format; found by {extracted.found_by}")
