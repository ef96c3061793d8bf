"""Evaluation datasets: GSM8K-style and HumanEval-style JSONL (optionally gzipped), read from a path.

GSM8K records carry `question` and `answer`, whose final answer follows `####`. HumanEval records
carry `task_id`, `prompt`, `test` (or `tests`), `entry_point` and, for the simulated model's answer
key only, `canonical_solution`. The kind is told from the first record's fields.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from reasonray.evals.generate import PREFIX, GenerationError, generate
from reasonray.kernel.errors import InvalidParamsError

Kind = Literal["gsm8k", "humaneval"]

HUMANEVAL_QUERY = (
    "Complete the following Python function so that it passes its tests. Give the complete code of the "
    "function (signature included) as your final answer, in a ```python code block.\n\n```python\n{prompt}```"
)


class DatasetError(InvalidParamsError, ValueError):
    """The dataset cannot be read; the message names the file, the line and what is wrong (still a
    ValueError, as callers written before the one error tree catch it)."""


def json_object(text: str, error: type[Exception], what: str) -> dict:
    """`text` as a JSON object, or `error` saying that `what` is not one."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise error(f"{what} must be a JSON object")
    return value


@dataclass(frozen=True)
class Example:
    id: str
    kind: Kind
    query: str  # what the strategy is asked
    reference: str  # GSM8K: the final number; HumanEval: a correct solution (the simulator's answer key)
    key: str  # the text by which the simulated model recognises the question
    tests: str = ""
    entry_point: str = ""
    prompt: str = ""


@dataclass(frozen=True)
class Dataset:
    path: Path
    kind: Kind
    examples: list[Example]

    @property
    def digest(self) -> str:
        """Identifies the selected examples: a rerun with another selection is told apart."""
        return hashlib.sha256("\n".join(e.id for e in self.examples).encode()).hexdigest()[:16]

    @property
    def sha256(self) -> str:
        """The hash of the selected examples' content (ids, questions, references, tests): two runs with the
        same hash asked the same questions and were scored against the same answers."""
        content = "".join(json.dumps([e.id, e.query, e.reference, e.tests, e.entry_point]) + "\n" for e in self.examples)
        return hashlib.sha256(content.encode()).hexdigest()


def load_dataset(path: str | Path, *, limit: int | None = None, offset: int = 0) -> Dataset:
    """Read `path` (or generate a `gen:FAMILY?...` spec: evals/generate.py); `offset` and `limit` select a
    contiguous slice of the examples, in file order."""
    if str(path).startswith(PREFIX):
        try:
            made = generate(str(path))
        except GenerationError as exc:
            raise DatasetError(str(exc)) from None
        generated = [Example(id=i, kind="gsm8k", query=q, reference=a, key=q) for i, q, a in made][offset:][:limit]
        if not generated:
            raise DatasetError(f"{path} holds no examples at offset {offset}")
        return Dataset(Path(str(path)), "gsm8k", generated)
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset {path} does not exist; give the path of a GSM8K or HumanEval JSONL(.gz) file")
    if limit is not None and limit < 1:
        raise DatasetError(f"--limit must be at least 1, got {limit}")
    opener = gzip.open if path.suffix == ".gz" else open
    examples: list[Example] = []
    kind: Kind | None = None
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                record = json_object(line, DatasetError, f"{path}:{number}: the record")
                kind = kind or _kind(record, path, number)
                if number - 1 < offset:
                    continue
                examples.append(_example(kind, record, path, number))
                if limit is not None and len(examples) >= limit:
                    break
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    if not examples:
        raise DatasetError(f"{path} holds no examples at offset {offset}")
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise DatasetError(f"{path}: example ids repeat; each record needs its own id (`id` or `task_id`)")
    return Dataset(path, kind, examples)  # type: ignore[arg-type]


def _kind(record: dict, path: Path, number: int) -> Kind:
    if {"question", "answer"} <= record.keys():
        return "gsm8k"
    if {"prompt", "entry_point"} <= record.keys() and {"test", "tests"} & record.keys():
        return "humaneval"
    raise DatasetError(
        f"{path}:{number}: neither GSM8K (question, answer) nor HumanEval (prompt, test, entry_point); the record has {sorted(record)}"
    )


def _example(kind: Kind, record: dict, path: Path, number: int) -> Example:
    try:
        if kind == "gsm8k":
            question, answer = str(record["question"]).strip(), str(record["answer"])
            if "####" not in answer:
                raise ValueError("no '####' before the final answer")
            reference = answer.rsplit("####", 1)[1].strip().replace(",", "")  # "#### 1,200" -> "1200"
            return Example(id=str(record.get("id") or f"gsm8k-{number}"), kind=kind, query=question, reference=reference, key=question)
        prompt = str(record["prompt"])
        return Example(
            id=str(record.get("task_id") or record.get("id") or f"humaneval-{number}"),
            kind=kind,
            query=HUMANEVAL_QUERY.format(prompt=prompt),
            reference=prompt + str(record.get("canonical_solution", "")),
            key=prompt.strip(),
            tests=str(record.get("test") or record.get("tests")),
            entry_point=str(record["entry_point"]),
            prompt=prompt,
        )
    except (KeyError, ValueError) as exc:
        raise DatasetError(f"{path}:{number}: not a {kind} record ({exc})") from None
