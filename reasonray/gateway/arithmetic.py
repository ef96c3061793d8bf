"""Safe arithmetic: evaluates `+ - * / // % **` over numbers by walking the AST, never with eval().

Shared by the simulated model (which answers arithmetic questions) and the calculator server tool.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import cast

from reasonray.kernel.errors import CapExceededError

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
MAX_EXPONENT = 64
# results are bounded before they are computed: (((9**64)**64)**64)**64 has small exponents and a
# result of 15 million digits (seconds of CPU on the caller's event loop). The service sets the cap
# from `[limits] max_calculator_digits`; this default serves the simulated model and tests.
DEFAULT_MAX_RESULT_DIGITS = 10_000


def evaluate(expression: str, max_result_digits: int = DEFAULT_MAX_RESULT_DIGITS) -> float:
    """The value of an arithmetic expression; ValueError (or ZeroDivisionError) for anything else,
    including a result of more than `max_result_digits` decimal digits."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    try:
        return _eval(tree.body, max_result_digits)
    except OverflowError:
        raise ValueError("the result is too large for a floating-point number") from None
    except RecursionError:  # e.g. a thousand unary minus signs
        raise ValueError("the expression nests too deeply") from None


def _eval(node: ast.AST, max_digits: int) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand, max_digits)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left, max_digits), _eval(node.right, max_digits)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CapExceededError(
                f"exponent {right} is too large (the calculator's cap is {MAX_EXPONENT})",
                {"cap": "calculator exponent", "limit": MAX_EXPONENT},
            )
        # an upper estimate of the result's decimal digits, from its operands alone
        if isinstance(node.op, ast.Pow):
            digits = max(right, 0) * _digits(left)
        elif isinstance(node.op, ast.Mult):
            digits = _digits(left) + _digits(right)
        else:
            digits = max(_digits(left), _digits(right)) + 1
        if digits > max_digits:
            raise CapExceededError(
                f"the result would have about {digits:.0f} digits; the calculator's cap is {max_digits}"
                " ([limits] max_calculator_digits in config.toml)",
                {"cap": "[limits] max_calculator_digits", "limit": max_digits},
            )
        return cast(float, _OPS[type(node.op)](left, right))
    raise ValueError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


def _digits(value: float) -> float:
    if isinstance(value, int):
        return value.bit_length() * math.log10(2)
    return math.log10(abs(value)) if value and math.isfinite(value) else 0.0


def format_number(value: float) -> str:
    """`391.0` -> "391", `3.5` -> "3.5", six significant digits otherwise."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.6g}"
