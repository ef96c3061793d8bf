"""Finding the answer, a score or a choice in whatever a model wrote, and saying how it was found.

A model asked for `<answer>`, `<score>` or `<vote>` may ignore the format: real small models answer in
prose ("17 * 23 = 391. The answer is: 391"), rate on their own scale ("Score: 8/10") and name a
candidate in words. Each reader here tries, in order, the requested tag, a JSON object (what an
endpoint that enforces `response_format` returns), the phrases models use, a final number (for
numeric tasks only) and the whole visible text, and reports which one matched as `found_by`, so a
result says how much the format was obeyed. A score that cannot be read is None ("unscored"), never 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from reasonray.kernel.tags import extract_answer, extract_tag, strip_thinking

FoundBy = Literal["tag", "json", "phrase", "final_number", "whole_text"]
"""How an answer can be found, from the most to the least obedient reply."""


@dataclass(frozen=True)
class Extracted:
    """An answer read from a reply, and which way it was found."""

    answer: str
    found_by: FoundBy

    @property
    def structured(self) -> bool:
        """True when the model gave the answer in the structure it was asked for (a tag or JSON)."""
        return self.found_by in ("tag", "json")


_NUMBER = r"[-+]?\$?\d[\d,]*(?:\.\d+)?"
_FINAL_NUMBER = re.compile(rf"(?<![\w.]){_NUMBER}")
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_HASHES = re.compile(r"^[ \t]*####[ \t]*(.+?)[ \t]*$", re.MULTILINE)
# "Answer: 76", "The answer is: 76", "**Final answer:** 76", "answer = 76"
_ANSWER_COLON = re.compile(r"\b(?:final\s+)?answer\b(?:\s+is)?\s*\**\s*[:=]\s*\**\s*(.+)", re.IGNORECASE)
# "The answer is 76." (no colon): accepted unless it is a judgement of the answer ("The answer is correct")
_ANSWER_IS = re.compile(r"\b(?:the|my|final|correct)\s+answer\s+(?:is|would be|=)\s+\**(.+)", re.IGNORECASE)
_JUDGEMENTS = re.compile(
    "correct|incorrect|right|wrong|not|unclear|unknown|above|below|as|that|this|simple|clear|obvious|likely|probably|"
    "definitely|indeed|consistent|inconsistent|valid|invalid|accurate|inaccurate"
)
_NUMERIC_QUESTION = re.compile(
    r"\d\s*(?:[-+*/×÷^x]|times|plus|minus|divided by|multiplied by)\s*\d"
    r"|\bhow\s+(?:many|much|long|far|old|often)\b"
    r"|\b(?:calculate|compute|sum|total|product|difference|quotient|remainder|percent(?:age)?|average|solve for)\b",
    re.IGNORECASE,
)


def numeric_question(query: str) -> bool:
    """Whether a question asks for a number (arithmetic, "how many ...", "calculate ..."), so that a final
    number in an untagged reply may be taken as its answer."""
    return bool(_NUMERIC_QUESTION.search(query))


def _clean(value: str) -> str:
    """A stated answer without its markdown emphasis and the sentence's closing punctuation."""
    return value.strip().strip("*_`").rstrip(" .!;,").strip("*_` ")


def json_values(text: str) -> Iterator[Any]:
    """The JSON values a reply holds: the whole text, a fenced block, else each `{`/`[` that starts one. Lazily, so a
    caller taking the first that fits does not decode from every bracket of a long reply."""
    text = text.strip()
    decoder = json.JSONDecoder()
    fenced = [block.removeprefix("json").strip() for block in text.split("```")[1::2]]  # none without a fence
    for candidate in [text, *fenced]:
        try:
            yield json.loads(candidate)
        except ValueError:
            continue
    for i, char in enumerate(text):
        if char in "{[":
            try:
                yield decoder.raw_decode(text, i)[0]
            except ValueError:
                continue


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object a reply holds outside its thinking (whole, fenced, or within prose), or None."""
    return next((value for value in json_values(strip_thinking(text)) if isinstance(value, dict)), None)


def _json_text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _phrase(visible: str) -> str | None:
    """The answer a reply states in words, the last statement winning; None when it states none."""
    if boxed := _BOXED.findall(visible):
        return _clean(boxed[-1]) or None
    if hashes := _HASHES.findall(visible):
        return _clean(hashes[-1]) or None
    found: list[tuple[int, int, str]] = []  # (line, column, statement)
    for n, line in enumerate(visible.splitlines(keepends=True)):  # line by line: `\s` never carries a match over a line break
        found += [(n, match.start(), match.group(1)) for match in _ANSWER_COLON.finditer(line)]
        for match in _ANSWER_IS.finditer(line):
            sentence = re.split(r"(?<=[.!?])\s", match.group(1), maxsplit=1)[0]
            first = re.sub(r"[^\w]", "", sentence.split()[0].lower()) if sentence.split() else ""
            if not _JUDGEMENTS.fullmatch(first):
                found.append((n, match.start(), sentence))
    return next(filter(None, (_clean(value) for *_, value in sorted(found, reverse=True))), None)


def final_number(text: str) -> str | None:
    """The last number in the visible text ("17 * 23 = 391" gives "391"), or None."""
    found = _FINAL_NUMBER.findall(strip_thinking(text))
    return found[-1].rstrip(",") if found else None


def find_answer(text: str, *, numeric: bool = False, structured: bool = False, fallback: bool = True) -> Extracted | None:
    """The answer in a reply: `<answer>`, else a JSON object's "answer" (when `structured` output was asked
    for), else a phrase ("The answer is: 76", "Answer: 76", "#### 76", "\\boxed{76}"), else the final number
    (when the question is `numeric`), else the whole visible text (unless `fallback` is false: None).
    An empty answer is None."""
    if tagged := extract_answer(text):
        return Extracted(tagged, "tag")
    if structured and (obj := parse_json_object(text)) is not None and (value := _json_text(obj.get("answer"))):
        return Extracted(extract_answer(value) or value, "json")
    visible = strip_thinking(text)
    if phrase := _phrase(visible):
        return Extracted(phrase, "phrase")
    if numeric and (number := final_number(visible)):
        return Extracted(number, "final_number")
    if fallback and visible.strip():
        return Extracted(visible.strip(), "whole_text")
    return None


_SCORE_VALUE = re.compile(r"([-+]?\d+(?:\.\d+)?|\.\d+)\s*(%|/\s*(\d+(?:\.\d+)?)|out of\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)
_SCORE_PHRASE = re.compile(
    r"\b(?:score|rating|rate|rated|grade|confidence)\b[^\d\n]{0,20}?([-+]?\d+(?:\.\d+)?|\.\d+)\s*(%|/\s*\d+(?:\.\d+)?|out of\s*\d+(?:\.\d+)?)?",
    re.IGNORECASE,
)


def _score_of(match: re.Match[str] | None, *, scaled: bool = True) -> float | None:
    """A 0-1 score from a matched number and what follows it ("%", "/10", "out of 10"); None when out of range.

    `scaled`: a bare number above 1 was given where a score was asked for, so 8 reads as 8/10 and 80 as 80/100."""
    if match is None:
        return None
    value = float(match.group(1))
    suffix = (match.group(2) or "").strip().lower()
    if suffix == "%":
        value /= 100
    elif suffix:
        denominator = float(re.sub(r"^(/|out of)\s*", "", suffix))
        if denominator <= 0:
            return None
        value /= denominator
    elif value > 1 and scaled:
        value = value / 10 if value <= 10 else value / 100
    return value if 0.0 <= value <= 1.0 else None


def find_score(text: str, *, structured: bool = False) -> float | None:
    """A 0-1 score in a reply: `<score>0.8</score>` (or 8/10, 80% inside it), a JSON object's "score",
    "Score: 8/10" (or "rating: 80%", "score of 0.7"), or a reply that is only a value ("0.8", "80%");
    None (unscored) when none can be read."""
    if (tagged := extract_tag(text, "score")) is not None:
        return _score_of(_SCORE_VALUE.search(tagged))
    score = obj.get("score") if structured and (obj := parse_json_object(text)) is not None else None
    if isinstance(score, (int, float, str)) and (match := _SCORE_VALUE.search(str(score))):
        return _score_of(match)
    visible = strip_thinking(text)
    if phrases := list(_SCORE_PHRASE.finditer(visible)):
        return _score_of(phrases[-1])
    return _score_of(_SCORE_VALUE.fullmatch(visible.strip().rstrip(".").strip()), scaled=False)


def find_feedback(text: str, *, structured: bool = False) -> str:
    """What a review says to fix: `<feedback>`, a JSON object's "feedback", else the review's visible text."""
    if (tagged := extract_tag(text, "feedback")) is not None:
        return tagged.strip()
    if structured and (obj := parse_json_object(text)) is not None and (value := _json_text(obj.get("feedback"))):
        return value
    return re.sub(r"<score>.*?(?:</score>|$)", "", strip_thinking(text), flags=re.IGNORECASE | re.DOTALL).strip()


_CHOICE_PHRASE = re.compile(r"\b(?:candidate|option|solution|attempt|vote|choice|number|pick|choose|#)\s*:?\s*#?(\d+)\b", re.IGNORECASE)


def find_choice(text: str, count: int, *, structured: bool = False) -> int | None:
    """The 0-based index of the candidate a reply picks among `count` numbered from 1: `<vote>2</vote>`,
    a JSON "vote", "Candidate 2" / "vote: 2" (the last one named), or a reply that is only the number.
    None when it names none in range."""

    def index(raw: str | None) -> int | None:
        raw = (raw or "").strip().rstrip(".")
        return int(raw) - 1 if raw.isdigit() and 1 <= int(raw) <= count else None

    if (tagged := extract_tag(text, "vote")) is not None:
        number = re.search(r"\d+", tagged)
        return index(number.group(0)) if number else None
    if structured and (obj := parse_json_object(text)) is not None and (value := _json_text(obj.get("vote"))) is not None:
        return index(value)
    visible = strip_thinking(text)
    named = [chosen for m in _CHOICE_PHRASE.finditer(visible) if (chosen := index(m.group(1))) is not None]
    return named[-1] if named else index(visible)
