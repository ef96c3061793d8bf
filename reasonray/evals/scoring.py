"""Scorers: exact numeric match for GSM8K, functional correctness for HumanEval.

HumanEval solutions run with the dataset's tests in the sandbox the session reasoner's `python`
tool uses (`reasonray/kernel/sandbox.py`: a subprocess with time and memory limits, no network, no
children); a solution is correct when `check(entry_point)` passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reasonray.evals.datasets import Example
from reasonray.kernel.sandbox import SandboxLimits, run_python

# A minus is a sign only where it cannot be an operator: not after a word character, a closing bracket or a
# point ("9-4" is 9 and 4; "-4", "x = -4" and "(-4)" are -4).
NUMBER = re.compile(r"(?:(?<![\w)\]}.])-)?\$?\d[\d,]*(?:\.\d+)?")
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
HUMANEVAL_LIMITS = SandboxLimits(timeout_s=10.0, memory_mb=512, max_output_chars=2000)


@dataclass(frozen=True)
class Score:
    correct: bool
    extracted: str | None  # the number or code that was scored
    detail: str = ""  # why it is wrong, when that can be told (the test's error)


def extract_number(answer: str) -> str | None:
    """The last number in the answer, `$` and thousands separators removed ("$1,200.50" -> "1200.50")."""
    found = all_numbers(answer)
    return found[-1] if found else None


def all_numbers(text: str) -> list[str]:
    """Every number in the text, in order, cleaned as `extract_number` cleans the last one."""
    return [n.replace("$", "").replace(",", "").rstrip(".") for n in NUMBER.findall(text)]


def lenient_correct(texts: list[str], example: Example) -> bool:
    """Lenient scoring: any number anywhere in the reply's texts equals the reference. An upper bound on what a
    better answer reader could find; never the headline figure (strict is)."""
    return example.kind == "gsm8k" and any(same_number(n, example.reference) for t in texts for n in all_numbers(t))


def same_number(given: str, expected: str) -> bool:
    try:
        return abs(float(given) - float(expected)) < 1e-6
    except ValueError:
        return False


def score_gsm8k(answer: str, example: Example) -> Score:
    number = extract_number(answer)
    if number is None:
        return Score(False, None, "the answer holds no number")
    return Score(same_number(number, example.reference), number)


def extract_code(answer: str) -> str:
    """The answer's ```python block (the last one, when there are several), else the whole answer."""
    blocks = CODE_BLOCK.findall(answer)
    return (blocks[-1] if blocks else answer).strip("\n")


async def score_humaneval(answer: str, example: Example, limits: SandboxLimits = HUMANEVAL_LIMITS) -> Score:
    """Run the solution (completed from the prompt when it is only a body) with the tests and the check call."""
    code = extract_code(answer)
    defined = re.search(rf"^\s*def {re.escape(example.entry_point)}\s*\(", code, re.MULTILINE)
    run = await run_python(f"{code if defined else example.prompt + code}\n\n{example.tests}\n\ncheck({example.entry_point})\n", limits)
    if run.ok:
        return Score(True, code)
    if run.timed_out:
        return Score(False, code, f"timed out after {limits.timeout_s:g} s")
    lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
    return Score(False, code, lines[-1][:300] if lines else f"exit code {run.exit_code}")


async def score(answer: str, example: Example) -> Score:
    if example.kind == "gsm8k":
        return score_gsm8k(answer, example)
    return await score_humaneval(answer, example)
