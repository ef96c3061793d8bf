"""Safe arithmetic: evaluates `+ - * / // % **` over numbers by walking the AST, never with eval().

Shared by the simulated model (which answers arithmetic questions) and the calculator server tool.
"""

from __future__ import annotations

import ast
import operator

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


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression; ValueError (or ZeroDivisionError) for anything else."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        return _OPS[type(node.op)](left, right)
    raise ValueError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


def format_number(value: float) -> str:
    """`391.0` -> "391", `3.5` -> "3.5", six significant digits otherwise."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.6g}"
