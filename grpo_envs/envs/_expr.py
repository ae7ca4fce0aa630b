"""Safe evaluation of arithmetic expressions (``+ - * /`` and parentheses over integers).

Parsed with ``ast`` and evaluated by walking the tree with exact ``Fraction`` arithmetic; any
other node (names, calls, powers, attributes, floats) is refused, so no model output ever reaches
``eval``. Why not sympy's parser: it evaluates ``2**10**10`` eagerly and accepts names.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fractions import Fraction

#: Longer expressions are refused before parsing (bounded work; Countdown needs < 100 chars).
MAX_EXPRESSION_CHARS = 300

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}

# LaTeX and unicode spellings of the four operations that models write.
_REPLACEMENTS = (
    ("\\times", "*"),
    ("\\cdot", "*"),
    ("\\div", "/"),
    ("\\left", ""),
    ("\\right", ""),
    ("×", "*"),
    ("·", "*"),
    ("÷", "/"),
    ("−", "-"),
    ("\\(", ""),
    ("\\)", ""),
)


class ExpressionError(ValueError):
    """The text is not an allowed arithmetic expression (the message says why)."""


@dataclass(frozen=True)
class Operation:
    """One binary operation as evaluated: ``left op right = result``."""

    left: Fraction
    op: str
    right: Fraction
    result: Fraction


@dataclass(frozen=True)
class Evaluated:
    """An expression's exact value, the integer literals it uses and its operations, in order."""

    value: Fraction
    numbers: tuple[int, ...]
    operations: tuple[Operation, ...]


def normalize(text: str) -> str:
    """Map LaTeX/unicode operators to Python's and drop a trailing ``= result``."""
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    text = text.replace("{", "(").replace("}", ")")
    return text.split("=", 1)[0].strip()


def safe_eval(text: str) -> Evaluated:
    """Evaluate ``text`` (after ``normalize``); ExpressionError on anything not allowed."""
    expr = normalize(text)
    if not expr:
        raise ExpressionError("empty expression")
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExpressionError(f"not an expression: {type(exc).__name__}") from exc
    numbers: list[int] = []
    operations: list[Operation] = []
    value = _walk(tree.body, numbers, operations)
    return Evaluated(value, tuple(numbers), tuple(operations))


def _walk(node: ast.expr, numbers: list[int], operations: list[Operation]) -> Fraction:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise ExpressionError(f"only integer literals are allowed, got {node.value!r}")
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left = _walk(node.left, numbers, operations)
        right = _walk(node.right, numbers, operations)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ExpressionError("division by zero")
        result: Fraction = _OPS[type(node.op)](left, right)
        operations.append(Operation(left, _SYMBOLS[type(node.op)], right, result))
        return result
    raise ExpressionError(f"{type(node).__name__} is not allowed (only + - * / and parentheses)")
