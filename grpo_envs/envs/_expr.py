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
class Evaluated:
    """An expression's exact value and the integer literals it uses, in order."""

    value: Fraction
    numbers: tuple[int, ...]


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
    value = _walk(tree.body, numbers)
    return Evaluated(value, tuple(numbers))


def _walk(node: ast.expr, numbers: list[int]) -> Fraction:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise ExpressionError(f"only integer literals are allowed, got {node.value!r}")
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _walk(node.left, numbers), _walk(node.right, numbers)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ExpressionError("division by zero")
        return _OPS[type(node.op)](left, right)  # type: ignore[no-any-return]
    raise ExpressionError(f"{type(node).__name__} is not allowed (only + - * / and parentheses)")
