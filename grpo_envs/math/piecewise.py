r"""Decide whether two descriptions of one real function are the same function.

A function by cases (``\begin{cases} x & x \ge 0 \\ -x & x < 0 \end{cases}``) against a closed
form for it (``|x|``, ``\max(x, 0)``, ``\min``) or against cases split at other points. Both
sides become pieces, (expression, region of the real line):

* a case is its value on its condition's region; "otherwise" is the part of the line no other
  case names;
* a closed form is rewritten into pieces with sympy's ``rewrite(Piecewise)`` (absolute values,
  max, min, sign) and ``piecewise_fold``, the first matching condition winning as in sympy.

The two are the same function when their pieces cover the same set and, wherever a piece of one
overlaps a piece of the other, the two expressions agree there. Agreement is proved, never
sampled: on an overlap that holds an interval the difference must simplify to 0 (two analytic
expressions equal on an interval are equal everywhere); on an isolated point both sides are
evaluated there exactly. So a wrong sign in one case, a shifted boundary (``x \ge 1`` for
``x \ge 0``), a missing case (the point 0 left out) or another value at a boundary point is a
different function. An identity that holds on a region only through a further kink the rewrite
does not expose is judged wrong (a refused right answer, never a paid wrong one).

Runs in sympy worker processes only (see ``equivalence``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sympy

#: More cases than this on one side is no plausible answer; it is judged wrong without sympy.
MAX_CASES = 8
#: ``\max\{x, 0\}`` (braces, which latex2sympy does not read) is ``\max(x, 0)``.
_BRACED_MAX_MIN = re.compile(r"\\(max|min)\s*\\\{([^{}]*)\\\}")


@dataclass(frozen=True)
class Interval:
    r"""A region of the real line: ``lo``/``hi`` are LaTeX numbers (``-\infty`` allowed)."""

    lo: str
    hi: str
    closed_lo: bool
    closed_hi: bool


@dataclass(frozen=True)
class Points:
    """A region of finitely many points (LaTeX numbers): the condition ``x = 0``."""

    values: tuple[str, ...]


Region = tuple[Interval | Points, ...]
"""A union of intervals and points."""


@dataclass(frozen=True)
class Cases:
    r"""A real function of ``var`` by cases: (value as LaTeX, region or None for "otherwise").

    A closed form (``|x|``) is one case with the region None: the whole line.
    """

    var: str
    branches: tuple[tuple[str, Region | None], ...]


LatexParser = Callable[[str], "tuple[sympy.Expr, object] | None"]
"""LaTeX -> (sympy expression, anything) or None: the verifier's own parser, passed in so that
this module does not import ``equivalence`` (which imports it)."""


def same_function(gold: Cases, pred: Cases, parse: LatexParser) -> bool:
    """Tell whether two functions by cases (or closed forms) are the same real function."""
    import sympy

    if gold.var != pred.var or len(gold.branches) + len(pred.branches) > 2 * MAX_CASES:
        return False
    x = sympy.Symbol(gold.var, real=True)
    g_pieces, p_pieces = _pieces(gold, x, parse), _pieces(pred, x, parse)
    if g_pieces is None or p_pieces is None:
        return False
    g_cover = sympy.Union(*(s for _, s in g_pieces))
    p_cover = sympy.Union(*(s for _, s in p_pieces))
    if sympy.Complement(g_cover, p_cover) != sympy.S.EmptySet:
        return False
    if sympy.Complement(p_cover, g_cover) != sympy.S.EmptySet:
        return False
    for g_expr, g_set in g_pieces:
        for p_expr, p_set in p_pieces:
            overlap = sympy.Intersection(g_set, p_set)
            if overlap != sympy.S.EmptySet and not _agree_on(g_expr, p_expr, overlap, x):
                return False
    return True


def _pieces(
    cases: Cases, x: sympy.Symbol, to_sympy: LatexParser
) -> list[tuple[sympy.Expr, sympy.Set]] | None:
    """Split a function into (expression, set) pieces free of Abs/Max/Min; None if unreadable."""
    import sympy

    regions: list[sympy.Set | None] = []
    for _, region in cases.branches:
        regions.append(None if region is None else _region_set(region, to_sympy))
        if region is not None and regions[-1] is None:
            return None
    named = sympy.Union(*(r for r in regions if r is not None))
    pieces: list[tuple[sympy.Expr, sympy.Set]] = []
    for (text, _), region_set in zip(cases.branches, regions):
        parsed = to_sympy(_BRACED_MAX_MIN.sub(r"\\\1(\2)", text))
        if parsed is None:
            return None
        expr = parsed[0].xreplace({sympy.Symbol(x.name): x})
        if not expr.free_symbols <= {x}:
            return None  # another variable (or i): not a real function of x
        where = sympy.Complement(sympy.S.Reals, named) if region_set is None else region_set
        pieces.extend(_split(expr, where))
    return [(e, s) for e, s in pieces if s != sympy.S.EmptySet]


def _split(expr: sympy.Expr, where: sympy.Set) -> list[tuple[sympy.Expr, sympy.Set]]:
    """Rewrite |.|, max, min and sign as cases and split ``where`` along their conditions."""
    import sympy

    folded = sympy.piecewise_fold(
        expr.rewrite(sympy.Piecewise)  # type: ignore[no-untyped-call]
    )
    if not isinstance(folded, sympy.Piecewise):
        return [(folded, where)]
    out = []
    taken: sympy.Set = sympy.S.EmptySet
    for value, cond in folded.args:
        cond_set = sympy.S.Reals if cond == sympy.true else cond.as_set()
        out.append((value, sympy.Intersection(sympy.Complement(cond_set, taken), where)))
        taken = sympy.Union(taken, cond_set)
    return out


def _region_set(region: Region, to_sympy: LatexParser) -> sympy.Set | None:
    import sympy

    parts: list[sympy.Set] = []
    for part in region:
        texts = (part.lo, part.hi) if isinstance(part, Interval) else part.values
        values = [to_sympy(t) for t in texts]
        if any(v is None or not v[0].is_number for v in values):
            return None
        nums = [v[0] for v in values if v is not None]
        if isinstance(part, Interval):
            lo, hi = nums
            parts.append(sympy.Interval(lo, hi, not part.closed_lo, not part.closed_hi))
        else:
            parts.append(sympy.FiniteSet(*nums))
    return sympy.Union(*parts)


def _agree_on(a: sympy.Expr, b: sympy.Expr, overlap: sympy.Set, x: sympy.Symbol) -> bool:
    """Prove ``a == b`` on ``overlap``: identically on an interval, exactly at a point."""
    import sympy

    components = overlap.args if isinstance(overlap, sympy.Union) else (overlap,)
    for part in components:
        if isinstance(part, sympy.FiniteSet):
            for point in part:
                av, bv = a.subs(x, point), b.subs(x, point)
                if av.has(sympy.nan, sympy.zoo) or bv.has(sympy.nan, sympy.zoo):
                    return False
                if sympy.simplify(av - bv) != 0:
                    return False
        elif isinstance(part, sympy.Interval):
            if sympy.simplify(a - b) != 0:
                return False
        else:
            return False  # a set sympy could not reduce to intervals and points
    return True
