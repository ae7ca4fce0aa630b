r"""Relations between an expression and a value: equations, bounds and the intervals they state.

``relation_as_set`` turns a bound on one variable (``x > 5``, ``x \ne 3``, ``|x - a| < b``) into
the set of its values; ``between`` reads a chain ``a < x <= b`` as an interval. ``is_name_like``
tells a name (``x``, ``f(2)``, ``|AB|``) from an expression, so that "name = value" states the
value.
"""

from __future__ import annotations

import itertools
import re

from grpo_envs.math.answer_tree import Node, Relation, Scalar, Seq, SetOf, Union
from grpo_envs.math.latex_clean import split_top
from grpo_envs.math.leaves import scalar
from grpo_envs.math.numeric import fraction_text, parse_number

REL_OPS = ("\\leq", "\\geq", "\\neq", "\\le", "\\ge", "\\ne", "<=", ">=", "!=", "=", "<", ">")
_REL_CANON = {"\\leq": "<=", "\\le": "<=", "\\geq": ">=", "\\ge": ">=", "\\neq": "!=", "\\ne": "!="}


SIMPLE_VAR = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?$")
_NAME_COMMANDS = re.compile(
    r"\\(?:frac|dfrac|overline|angle|measuredangle|triangle|widehat|hat|vec|bar|tilde|mathbf|"
    r"mathrm|mathcal|text|operatorname|lvert|rvert|vert|mid|left|right|alpha|beta|gamma|delta|"
    r"theta|phi|varphi|lambda|mu|sigma|omega|rho|tau|psi|epsilon|varepsilon|eta|xi|zeta|kappa|"
    r"nu|chi|Delta|Gamma|Theta|Lambda|Sigma|Omega|Phi|Psi)(?![A-Za-z])"
)


def is_name_like(text: str) -> bool:
    r"""Tell whether ``text`` only names a quantity: ``x``, ``f(x)``, ``(p, q)``, ``|AB|``,
    ``A:B``, ``x_{1}``, ``\frac{NO}{BO}``, ``S_{ABC}``, ``\angle A``.

    A name has letters and no arithmetic: ``a + 3z``, ``2x``, ``7`` or ``\sqrt{x}`` are
    expressions, and "expression = value" does not state the answer "value".
    """  # noqa: D205
    t = re.sub(r"_\{[^{}]*\}|_\w|'", "", text)
    t = re.sub(r"(?<=[A-Za-z])\([^()]*\)", "", t)  # f(2), P(A): function applications
    t = _NAME_COMMANDS.sub(" ", t)
    return (
        bool(re.search(r"[A-Za-z]", t))
        and "\\" not in t
        and re.fullmatch(r"[A-Za-z{}()|:,\s]*", t) is not None
    )


def is_constant(text: str) -> bool:
    r"""Tell whether ``text`` has no variables (letters only in ``\infty``, ``\pi``, ...)."""
    return not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", text))


def relation_as_set(rel: Relation) -> SetOf | None:
    r"""``x > 5`` -> the values of x, (5, oo); None when it is not a bound on one variable.

    Also ``x \ne 3`` (all reals but 3) and ``|x - a| < b`` (an interval around a; with ``>``, the
    union outside it), for numbers a and b.
    """
    if rel.op not in ("<", "<=", ">", ">=", "!="):
        return None
    lhs, rhs, op = rel.lhs.text, rel.rhs.text, rel.op
    if (SIMPLE_VAR.match(rhs) and is_constant(lhs)) or _ABS_LINEAR.match(rhs):
        lhs, rhs = rhs, lhs
        op = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}[op]
    absolute = _ABS_LINEAR.match(lhs)
    if absolute is not None:
        return _absolute_bound(absolute, op, rhs)
    if not (SIMPLE_VAR.match(lhs) and is_constant(rhs)):
        return None
    bound = Scalar(rhs)
    if op == "!=":
        return SetOf(lhs, all_reals_except([bound]))
    if op in ("<", "<="):
        return SetOf(lhs, Seq("tuple", (Scalar("-\\infty"), bound), "(", ")" if op == "<" else "]"))
    return SetOf(lhs, Seq("tuple", (bound, Scalar("\\infty")), "(" if op == ">" else "[", ")"))


_ABS_LINEAR = re.compile(r"^\|\s*([A-Za-z])\s*(?:([+-])\s*(\d+(?:\.\d+)?|\d+/\d+))?\s*\|$")


def _absolute_bound(m: re.Match[str], op: str, rhs: str) -> SetOf | None:
    """``|x - a| < b`` -> x in (a - b, a + b); ``|x - a| > b`` -> outside it (numbers only)."""
    radius = parse_number(rhs)
    shift = parse_number(m.group(3) or "0")
    if radius is None or shift is None or radius.value < 0 or op == "!=":
        return None
    center = shift.value if m.group(2) == "-" else -shift.value
    lo, hi = (
        Scalar(fraction_text(center - radius.value)),
        Scalar(fraction_text(center + radius.value)),
    )
    if op in ("<", "<="):
        closed = op == "<="
        return SetOf(
            m.group(1), Seq("tuple", (lo, hi), "[" if closed else "(", "]" if closed else ")")
        )
    closed = op == ">="
    left = Seq("tuple", (Scalar("-\\infty"), lo), "(", "]" if closed else ")")
    right = Seq("tuple", (hi, Scalar("\\infty")), "[" if closed else "(", ")")
    return SetOf(m.group(1), Union((left, right)))


def all_reals_except(points: list[Scalar]) -> Node:
    """Return the real line without the given numbers: a union of open intervals, in order."""
    values = []
    for p in points:
        n = parse_number(p.text)
        if n is None:
            return Union((Seq("tuple", (Scalar("-\\infty"), p), "(", ")"),
                          Seq("tuple", (p, Scalar("\\infty")), "(", ")")))  # fmt: skip
        values.append((n.value, p))
    values.sort(key=lambda v: v[0])
    ends = [Scalar("-\\infty"), *(p for _, p in values), Scalar("\\infty")]
    return Union(tuple(Seq("tuple", (a, b), "(", ")") for a, b in itertools.pairwise(ends)))


def split_relation(s: str) -> tuple[list[str], list[str]]:
    """Split ``s`` on its top-level relation signs: the sides and the (canonical) operators."""
    sides = split_top(s, REL_OPS)
    ops = []
    pos = 0
    for side in sides[:-1]:
        pos = s.index(side, pos) + len(side) if side else pos
        ops.append(_relation_op(s[pos:], ""))
        for op in REL_OPS:
            if s.startswith(op, pos):
                pos += len(op)
                break
    return sides, ops


def between(sides: list[str], ops: list[str], s: str) -> Node:
    """Read ``a < x <= b`` as the values of x, (a, b]; other chains stay text."""
    lo, var, hi = (p.strip() for p in sides)
    if ops[0] in ("<", "<=") and ops[1] in ("<", "<="):
        pass
    elif ops[0] in (">", ">=") and ops[1] in (">", ">="):
        lo, hi = hi, lo
        ops = [{">": "<", ">=": "<="}[ops[1]], {">": "<", ">=": "<="}[ops[0]]]
    else:
        return scalar(s)
    if not (is_constant(lo) and is_constant(hi)):
        return scalar(s)
    left = "(" if ops[0] == "<" else "["
    right = ")" if ops[1] == "<" else "]"
    interval = Seq("tuple", (scalar(lo), scalar(hi)), left, right)
    m = re.fullmatch(r"\|\s*([A-Za-z])\s*\|", var)
    low = parse_number(lo)
    if m and low is not None and low.value >= 0:
        # a <= |z| <= b with a >= 0: z in [-b, -a] u [a, b].
        mirror = {"(": ")", "[": "]", ")": "(", "]": "["}
        negative = Seq(
            "tuple", (scalar(f"-({hi})"), scalar(f"-({lo})")), mirror[right], mirror[left]
        )
        return SetOf(m.group(1), Union((negative, interval)))
    return SetOf(var, interval)


def _relation_op(s: str, lhs: str) -> str:
    rest = s[len(lhs) :]
    for op in REL_OPS:
        if rest.startswith(op):
            return _REL_CANON.get(op, op)
    return "="
