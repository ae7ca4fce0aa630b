r"""Decide whether two parsed answers are mathematically the same.

``compare`` walks the two trees from ``normalize`` (sets unordered, tuples/intervals ordered with
their brackets, matrices by shape, equations up to a constant factor) and asks a ``Comparator``
about the leaves. Two comparators:

* ``FastComparator``: plain numbers with exact ``Fraction`` arithmetic and identical strings.
  Cannot hang, so it runs in the caller's process; raises ``NeedsSymbolic`` when unsure.
* ``SymbolicComparator``: sympy (LaTeX via latex2sympy2_extended). Only ever runs inside a
  killable worker process (``pool``), because sympy can take unbounded time on inputs such as
  ``9^{9^{9^9}}``.

The policy is "when unsure, say wrong": a reward model that calls a wrong answer right teaches the
policy to produce it. So equality is only granted on proof and never on a loose float tolerance:

* Exact integers and rationals compare exactly, however large (``2^{100}`` is not
  ``1267650600228229401496703205377``; ``1`` is not ``1 + 10^{-40}``).
* Other exact constants are equal when ``simplify`` proves it, or when sympy's adaptive
  evaluation of their difference cannot tell it from 0 at 60 digits plus the integers written
  in them (so ``\pi + 10^{-45}`` is not ``\pi``); with an integer above 2000 written in either
  (``10^{-10^{5}}``) only ``simplify`` can prove it.
* A tolerance applies only where a side is a decimal, scaled to the digits given: see the
  rounded-decimal convention below.
* An answer that still holds an unevaluated sum, product, integral, limit or derivative that the
  gold does not hold is no final answer, whatever its value (see ``restates`` for the line).
* Text no parser reads (prose, a piecewise rule in words) equals only the same text, signs,
  digits and case kept; only spacing is dropped.

Conventions where graders differ. Each is the reading most public graders (hendrycks MATH,
Qwen2.5-Math, NeMo-Skills, MARIO, PRM800K, lm-eval minerva, rllm, Math-Verify) take, or, where
they split, the one that cannot pay a wrong answer:

* Relations, intervals and sets are one class: ``x \ge 5``, ``5 \le x``, ``[5, \infty)`` and
  ``x \in [5, \infty)`` are equal in either direction (gold or prediction), as are
  ``-2 \le x \le 7`` and ``[-2, 7]``, ``x < 2 \text{ or } x > 3`` and
  ``(-\infty, 2) \cup (3, \infty)``, ``\mathbb{R}`` and ``(-\infty, \infty)``. Math-Verify's
  default refuses a relation against a gold interval (its ``allow_set_relation_comp`` option
  turns that on); Qwen2.5-Math and rllm compare them, and so do we. Variables must agree when
  both sides name one (``x > 5`` is not ``y > 5``); brackets always matter (``[0, 9)`` is not
  ``(0, 9)``).
* Solution lists are unordered and their duplicates collapse (``\{1, 2\}``, ``2, 1``,
  ``x = 1 \text{ or } x = 2``, ``\boxed{1}, \boxed{2}``, ``1 \pm 1``...). Tuples and intervals are
  ordered; a set never equals a tuple.
* ``name = value`` states ``value`` when the left side only names something (``x``, ``f(x)``,
  ``(p, q)``, ``|AB|``, ``A:B``, ``\frac{NO}{BO}``) or when both sides are constants
  (``\frac{1}{2} = 0.5``): ``x = 5`` equals ``5``; ``a + 3z = 0`` does not equal ``0``. In a
  chain ``x = 5 + 6 = 11`` the value is the last side.
* Decimals: thousands separators are commas followed by groups of three (``7,425,000``), spaces
  (``1 000``) or ``{,}``/``,\!`` (LaTeX). A decimal comma is read where a list of two integers
  is unlikely -- a zero integer part (``0,111``) or a fractional part of two or 4+ digits
  (``1000,99``, ``2,74``) -- and then only as an alternative: ``1,22`` equals ``1.22`` and the
  list ``1, 22``; ``-2,1`` is only the list. These are the conventions Math-Verify's suite
  documents.
* A decimal equals a value with no finite decimal expansion only when it has at least five
  significant digits and is that value rounded or truncated to its own places (``2.6667`` and
  ``2.6666`` for ``8/3``, not ``2.6668``; ``0.3333334`` is not ``1/3``): ``0.33``, ``1.41`` or
  ``3.14`` are approximations, not ``1/3``, ``\sqrt{2}`` or ``\pi`` (Qwen2.5-Math's 1e-4
  tolerance would accept some of these). A decimal inside an expression (``1.4142\pi``) must
  agree to its fewest significant digits. Two values with finite expansions must be equal
  exactly; a decimal literal that is exactly the value (``\sqrt{10.5}``) is equal.
* Percent: ``28\%`` equals ``28`` and ``0.28``; two percentages compare their numbers
  (``28\%`` is not ``0.28\%``). "percent", "pct" and "percentage" mean ``\%``.
* Degrees: a degree sign is dropped for a number (``45^\circ`` equals ``45``); against a radian
  measure written with ``\pi`` the degrees are converted (``90^\circ`` equals ``\frac{\pi}{2}``,
  a bare ``90`` does not).
* Units and scale words: a trailing unit is dropped (``125\text{ miles}``, ``15\mbox{ cm}^2``);
  ``3\text{ million}`` equals ``3000000`` and also ``3`` (the question's own unit).
* Ratios and times (``7:32``, ``12:00``) are ordered pairs: ``12:00`` is not ``1:00``. A 12-hour
  time is its 24-hour pair (``7:30 p.m.`` is ``19:30``, ``12:15 a.m.`` is ``0:15``); an hour alone
  (``7 pm``) also equals the bare hour ``7``.
* Amounts: ``€``, ``£``, ``¥``, ``₹`` and ``$`` are dropped like units; ``350 cents`` equals
  ``3.50`` (dollars) and ``350`` (the question's unit). A quantity in two units is its value in
  either unit and never one of its numbers: "1 hour 30 minutes" equals ``1.5`` and ``90``, "5
  feet 3 inches" ``5.25`` and ``63``, "2 dollars and 50 cents" ``2.5`` and ``250``.
* Durations (``verify``, rules in ``duration``): against a gold with a unit of time, an answer
  with a unit of time is compared exactly in seconds ("90 minutes" equals "1.5 hours", "90
  hours" does not equal "90 minutes"), and a bare ``h:mm`` is hours and minutes (``1:30`` equals
  "1.5 hours", not "1.3 hours") unless the completion gives it as a time of day ("at 1:30").
* Dates are (month, day[, year]) in any of "March 15, 2024", "15 March 2024", ``2024-03-15``
  and ``3/15/2024`` (month first); a date never equals its day or year.
* Number words are numbers (``twenty-one`` is ``21``); an ordinal stated as the answer
  (``21^{st}``, ``21st``) is its number.
* Set-builder notation, absolute-value bounds and exclusions are intervals:
  ``\{y : y \le -1\}`` is ``(-\infty, -1]``, ``|x - 3| \le 2`` is ``[1, 5]``, ``|x| > 2`` is
  ``(-\infty, -2) \cup (2, \infty)``, and ``x \ne 3``, ``\mathbb{R} \setminus \{3\}`` and "all
  real numbers except 3" are ``(-\infty, 3) \cup (3, \infty)``.
* Piecewise functions compare case by case in any order (value and condition both equal);
  "if"/"for" in a condition are words, and "otherwise" stands for the remaining case. Otherwise
  they are compared as real functions of their one variable (``piecewise``): cases against a
  closed form for the same function (``|x|``, ``\max(x, 0)``, ``\min``, sums of absolute
  values), in either direction, or against cases split at other points, are equal only when
  every case's value is proved equal to the other side on that case's region and both cover the
  same points. A wrong sign in one case, a shifted boundary, a missing point and another value
  at a boundary point are different functions.
* Vectors and matrices: ``3\mathbf{i} + 4\mathbf{j}`` (also ``\hat``, ``\vec``) is ``(3, 4)``, with
  a k-term ``(a, b, c)``; a scalar times a matrix is that matrix scaled; ``2I`` is twice the
  identity of the other side's size. A bare ``i`` is the imaginary unit when it is the only
  symbol (``e^{i\pi/3}`` equals ``\frac{1}{2} + \frac{\sqrt{3}}{2}i``).
* Identities of real variables that sympy does not prove for complex ones (``\sqrt{x^2}`` is
  ``|x|``) are checked with real symbols; degrees inside a trigonometric function are converted
  (``\cos 60^\circ`` is ``\sin 30^\circ``).
* Multiple choice: a letter equals the value of the option it names when the completion lists
  the options ("(A) 10 (B) 11 (C) 12"), and a value equals a letter when exactly one listed
  option has that value (``verify``); without a listing a value never equals a letter.

Why one module over 500 lines: the two comparators walk the same answer tree and must agree on
every node type (side by side, a node type one of them misses is visible), and the conventions
above and the tree walk that applies them are one decision procedure; splitting it would
separate each convention from the code that applies it.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from grpo_envs.math.answer_tree import (
    Alt,
    AnswerRejected,
    Choice,
    Matrix,
    Node,
    Piecewise,
    Relation,
    Scalar,
    Seq,
    SetOf,
    Union,
)
from grpo_envs.math.latex_clean import is_words, latex_text_key, normalize_text
from grpo_envs.math.normalize import identity_multiple, parse_answer
from grpo_envs.math.numeric import (
    MIN_ROUNDED_DIGITS,
    Number,
    numbers_equal,
    parse_number,
    tower_log10,
)
from grpo_envs.math.piecewise import MAX_CASES, Cases, Interval, Points, Region, same_function
from grpo_envs.math.relations import is_name_like, relation_as_set

if TYPE_CHECKING:
    import sympy


class NeedsSymbolic(Exception):
    """The fast comparator cannot decide; the pair must go to a sympy worker."""


class Comparator(Protocol):
    """Equality of leaves: scalars and relations."""

    def scalar(self, gold: Scalar, pred: Scalar) -> bool:
        """Tell whether two scalar answers are equal."""
        ...

    def relation(self, gold: Relation, pred: Relation) -> bool:
        """Tell whether two relations (equations, inequalities) are equivalent."""
        ...

    def function(self, gold: Cases, pred: Cases) -> bool:
        """Tell whether two functions by cases (or a closed form) are the same real function."""
        ...


# --- tree walk ------------------------------------------------------------------------------

_SIMPLE_NAME = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?$|^\\[a-z]+$")


def compare(gold: Node, pred: Node, cmp: Comparator) -> bool:
    """Tell whether ``pred`` answers ``gold``; ``cmp`` decides the leaves."""
    if isinstance(gold, Alt):
        return any(compare(g, pred, cmp) for g in gold.options)
    if isinstance(pred, Alt):
        return any(compare(gold, p, cmp) for p in pred.options)
    if isinstance(gold, Choice) or isinstance(pred, Choice):
        return isinstance(gold, Choice) and isinstance(pred, Choice) and gold.letter == pred.letter
    if isinstance(gold, Scalar) and isinstance(pred, Scalar):
        return cmp.scalar(gold, pred)
    if isinstance(gold, Relation) and isinstance(pred, Relation):
        if (
            gold.op == pred.op == "="
            and gold.rhs_node is not None
            and pred.rhs_node is not None
            and _same_name(gold.lhs.text, pred.lhs.text)
            and not (isinstance(gold.rhs_node, Scalar) and isinstance(pred.rhs_node, Scalar))
        ):
            return compare(gold.rhs_node, pred.rhs_node, cmp)  # (p, q) = (3, 2)
        return cmp.relation(gold, pred)
    # The values of a variable: x \in [a, b], a <= x <= b, x >= a, or the bare interval.
    if isinstance(gold, SetOf | Relation) and isinstance(pred, SetOf | Relation | Seq | Union):
        g_set = relation_as_set(gold) if isinstance(gold, Relation) else gold
        if g_set is not None:
            return _compare_set_of(g_set, pred, cmp)
    if isinstance(pred, SetOf | Relation) and isinstance(gold, Seq | Union):
        p_set = relation_as_set(pred) if isinstance(pred, Relation) else pred
        if p_set is not None:
            return compare(gold, p_set.members, cmp)
    # "x = 5" answers "5" (and the reverse) when the left side only names the quantity.
    if isinstance(pred, Relation) and not isinstance(gold, Relation):
        return _named_value(pred) is not None and compare(gold, _named_value(pred), cmp)  # type: ignore[arg-type]
    if isinstance(gold, Relation):
        return _named_value(gold) is not None and compare(_named_value(gold), pred, cmp)  # type: ignore[arg-type]
    if isinstance(gold, Seq) and isinstance(pred, Seq):
        return _compare_seq(gold, pred, cmp)
    if isinstance(gold, Union) or isinstance(pred, Union):
        # "x < 2 or x > 3" is the union (-oo, 2) u (3, oo).
        g_union, p_union = _as_union(gold), _as_union(pred)
        if g_union is None or p_union is None:
            return False
        return _match_unordered(g_union.parts, p_union.parts, cmp)
    if isinstance(gold, Piecewise) or isinstance(pred, Piecewise):
        if (
            isinstance(gold, Piecewise)
            and isinstance(pred, Piecewise)
            and _compare_piecewise(gold, pred, cmp)
        ):
            return True
        # |x| against its cases, or cases split at other points: the same real function.
        g_cases, p_cases = as_cases(gold), as_cases(pred)
        return g_cases is not None and p_cases is not None and cmp.function(g_cases, p_cases)
    if isinstance(gold, Matrix) or isinstance(pred, Matrix):
        size = len(gold.rows) if isinstance(gold, Matrix) else len(pred.rows)  # type: ignore[union-attr]
        # 2I against a 2 x 2 matrix: that multiple of the identity, cell by cell.
        gold = identity_multiple(gold, size) or gold
        pred = identity_multiple(pred, size) or pred
        return _compare_matrix(gold, pred, cmp)
    return False


def _compare_piecewise(gold: Piecewise, pred: Piecewise, cmp: Comparator) -> bool:
    """Match the cases in any order: equal values under equal conditions.

    An "otherwise" case matches the one case left on the other side once all others matched: for
    a function, it is the complement of the other conditions on both sides.
    """
    if len(gold.branches) != len(pred.branches):
        return False
    unused = list(pred.branches)
    deferred = []
    for g_value, g_cond in gold.branches:
        for k, (p_value, p_cond) in enumerate(unused):
            if (g_cond is None) != (p_cond is None):
                continue
            if g_cond is not None and p_cond is not None and not compare(g_cond, p_cond, cmp):
                continue
            if compare(g_value, p_value, cmp):
                del unused[k]
                break
        else:
            deferred.append(g_value)
    if not deferred:
        return not unused
    if len(deferred) != 1 or len(unused) != 1:
        return False
    (p_value, p_cond), g_value = unused[0], deferred[0]
    g_otherwise = any(c is None for _, c in gold.branches)
    return (g_otherwise or p_cond is None) and compare(g_value, p_value, cmp)


def as_cases(node: Node) -> Cases | None:
    r"""Read a piecewise answer, or a closed form of one variable, as ``Cases`` (else None).

    >>> from grpo_envs.math.normalize import parse_answer
    >>> cases = as_cases(parse_answer(r"\begin{cases} x & x \ge 0 \\ 0 & x < 0 \end{cases}"))
    >>> cases.var, [value for value, _ in cases.branches]
    ('x', ['x', '0'])
    >>> cases.branches[0][1]
    (Interval(lo='0', hi='\\infty', closed_lo=True, closed_hi=False),)
    >>> as_cases(parse_answer(r"\max(x, 0)"))
    Cases(var='', branches=(('\\max(x, 0)', None),))
    """
    if isinstance(node, Scalar):
        return None if node.percent or node.degrees else Cases("", ((node.text, None),))
    if not isinstance(node, Piecewise) or len(node.branches) > MAX_CASES:
        return None
    names: set[str] = set()
    branches: list[tuple[str, Region | None]] = []
    for value, cond in node.branches:
        if not isinstance(value, Scalar) or value.percent or value.degrees:
            return None
        region: Region | None = None
        if cond is not None:
            read = _condition_region(cond)
            if read is None:
                return None
            name, region = read
            names.add(name)
        branches.append((value.text, region))
    return Cases(names.pop(), tuple(branches)) if len(names) == 1 else None


def _condition_region(cond: Node) -> tuple[str, Region] | None:
    r"""Read a case's condition (``x \ge 0``, ``0 \le x < 1``, ``x = 0``) as (variable, region)."""
    if isinstance(cond, Scalar) and _OR.search(cond.text):
        return _either_region(cond.text)
    if isinstance(cond, Relation):
        point = cond.op == "=" and _is_scalar_or_none(cond.rhs_node)
        if point and _SIMPLE_NAME.match(cond.lhs.text):
            return re.sub(r"\s+", "", cond.lhs.text), (Points((cond.rhs.text,)),)
        cond = relation_as_set(cond)  # type: ignore[assignment]
    if not isinstance(cond, SetOf):
        return None
    region = _members_region(cond.members)
    return None if region is None else (re.sub(r"\s+", "", cond.var), region)


_OR = re.compile(r"\s+(?:or|\\lor|\\vee)\s+")


def _either_region(text: str) -> tuple[str, Region] | None:
    """Read ``x < -1 or x > 1`` as the union of the parts' regions (one variable)."""
    names: set[str] = set()
    region: list[Interval | Points] = []
    for part in _OR.split(text):
        try:
            read = _condition_region(parse_answer(part))
        except AnswerRejected:
            return None
        if read is None:
            return None
        names.add(read[0])
        region.extend(read[1])
    return (names.pop(), tuple(region)) if len(names) == 1 else None


def _is_scalar_or_none(node: Node | None) -> bool:
    return node is None or isinstance(node, Scalar)


def _members_region(members: Node) -> Region | None:
    if isinstance(members, Union):
        parts = [_members_region(p) for p in members.parts]
        if any(p is None for p in parts):
            return None
        return tuple(i for p in parts if p is not None for i in p)
    if not isinstance(members, Seq) or not all(isinstance(i, Scalar) for i in members.items):
        return None
    texts = tuple(i.text for i in members.items if isinstance(i, Scalar))
    if members.kind == "set":
        return (Points(texts),)
    brackets = members.left in ("(", "[") and members.right in (")", "]")
    if members.kind == "tuple" and len(texts) == 2 and brackets:
        return (Interval(texts[0], texts[1], members.left == "[", members.right == "]"),)
    return None


def _as_union(node: Node) -> Union | None:
    """Read a union, or a list of bounds on one variable, as a union of intervals (else None)."""
    if isinstance(node, Union):
        return node
    if not (isinstance(node, Seq) and node.kind == "list"):
        return None
    sets = [relation_as_set(i) if isinstance(i, Relation) else i for i in node.items]
    if not all(isinstance(s, SetOf) for s in sets):
        return None
    names = {re.sub(r"\s+", "", s.var) for s in sets if isinstance(s, SetOf)}
    if len(names) != 1:
        return None
    return Union(tuple(s.members for s in sets if isinstance(s, SetOf)))


def _same_name(a: str, b: str) -> bool:
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


def _named_value(rel: Relation) -> Node | None:
    """Return the value stated by ``name = value`` (``f(x) = 2x + 3``, ``|AB| = 1``), else None."""
    if rel.op != "=" or (rel.rhs_node is None and not is_name_like(rel.lhs.text)):
        return None
    return rel.rhs_node if rel.rhs_node is not None else rel.rhs


def _compare_set_of(gold: SetOf, pred: Node, cmp: Comparator) -> bool:
    if isinstance(pred, Relation):
        as_set = relation_as_set(pred)
        if as_set is None:
            return False
        pred = as_set
    if isinstance(pred, SetOf):
        return _same_name(gold.var, pred.var) and compare(gold.members, pred.members, cmp)
    return compare(gold.members, pred, cmp)


def _compare_seq(gold: Seq, pred: Seq, cmp: Comparator) -> bool:
    if len(gold.items) != len(pred.items):
        return False
    kinds = {gold.kind, pred.kind}
    if kinds == {"set", "tuple"}:
        return False  # {1, 2} is not the point (1, 2)
    if kinds == {"ordered"}:
        # "10, 4, -2" against "4, 10, -2": bare lists are ordered answers ("find a, b, c").
        return all(compare(g, p, cmp) for g, p in zip(gold.items, pred.items))
    if "tuple" in kinds:
        # (1, 2] vs (1, 2): the brackets carry meaning for pairs (intervals). For longer tuples,
        # ( ) vs [ ] is notation only.
        brackets_differ = (gold.left, gold.right) != (pred.left, pred.right)
        if (
            gold.kind == pred.kind == "tuple"
            and brackets_differ
            and (len(gold.items) == 2 or not _same_bracket_family(gold, pred))
        ):
            return False
        return all(compare(g, p, cmp) for g, p in zip(gold.items, pred.items))
    return _match_unordered(gold.items, pred.items, cmp)


def _same_bracket_family(a: Seq, b: Seq) -> bool:
    return a.left + a.right in ("()", "[]") and b.left + b.right in ("()", "[]")


def _match_unordered(gold: tuple[Node, ...], pred: tuple[Node, ...], cmp: Comparator) -> bool:
    """Match every gold item with a distinct pred item (greedy; equality is transitive)."""
    if len(gold) != len(pred):
        return False
    unused = list(pred)
    for g in gold:
        for k, p in enumerate(unused):
            if compare(g, p, cmp):
                del unused[k]
                break
        else:
            return False
    return True


def _compare_matrix(gold: Node, pred: Node, cmp: Comparator) -> bool:
    def flat(node: Node) -> tuple[tuple[int, int], tuple[Node, ...]] | None:
        if isinstance(node, Matrix):
            widths = {len(r) for r in node.rows}
            if len(widths) != 1:
                return None
            return (len(node.rows), widths.pop()), tuple(c for r in node.rows for c in r)
        if isinstance(node, Seq) and node.kind != "set":
            return (0, len(node.items)), node.items  # a vector written as a tuple
        return None

    fg, fp = flat(gold), flat(pred)
    if fg is None or fp is None:
        return False
    (gr, gc), gitems = fg
    (pr, pc), pitems = fp
    if isinstance(gold, Matrix) and isinstance(pred, Matrix):
        if (gr, gc) != (pr, pc):
            return False
    elif len(gitems) != len(pitems) or 1 not in ((gr, gc) if gr else (pr, pc)):
        return False  # only a row or column vector may be compared with a tuple
    return all(compare(g, p, cmp) for g, p in zip(gitems, pitems))


# --- fast, in-process comparator -------------------------------------------------------------


def _number_candidates(s: Scalar, raw_only: bool = False) -> list[Number] | None:
    n = parse_number(s.text)
    if n is None:
        return None
    if s.percent and not raw_only:  # "50%" may be meant as 50 or as 0.5
        return [n, Number(n.value / 100, n.decimal)]
    return [n]


# Operators that leave a value unevaluated: a prediction that still holds one the gold does not
# hold restates a question ("\sum_{k=1}^{10} k" for 55) instead of answering it.
_UNEVALUATED = (
    ("sum", re.compile(r"\\sum(?![A-Za-z])|\\[cl]?dots\s*\+|\+\s*(?:\\[cl]?dots|\.\.\.)")),
    ("product", re.compile(r"\\prod(?![A-Za-z])")),
    ("integral", re.compile(r"\\(?:i{1,3}nt|oint)(?![A-Za-z])")),
    ("limit", re.compile(r"\\lim(?:sup|inf)?(?![A-Za-z])|\blim\b")),
    (
        "derivative",
        re.compile(
            r"\\frac\s*\{\s*(?:d|\\partial|\\mathrm\s*\{d\})[^{}]*\}\s*\{\s*(?:d|\\partial|\\mathrm)"
            r"|\\partial(?![A-Za-z])|\bd/d[a-z]\b"
            # An evaluation bar: f(x) |_{x=1}, F |_{0}^{1}.
            r"|\|\s*_\s*(?:\{[^{}]*=[^{}]*\}|(?:\{[^{}]*\}|\w)\s*\^)"
        ),
    ),
)


def unevaluated_operators(text: str) -> frozenset[str]:
    r"""Return the unevaluated operators in an answer: sums, products, integrals, limits and
    derivatives (with evaluation bars).

    >>> sorted(unevaluated_operators(r"\sum_{k=1}^{n} k + \int_0^1 x\,dx"))
    ['integral', 'sum']
    >>> unevaluated_operators(r"x != 3")
    frozenset()
    """  # noqa: D205
    return frozenset(name for name, pattern in _UNEVALUATED if pattern.search(text))


def restates(gold: str, pred: str) -> bool:
    r"""Tell whether ``pred`` holds an unevaluated operator that ``gold`` does not hold.

    Where the line is drawn: a sum (also ``1 + 2 + \cdots + n``), product, integral, limit or
    derivative (also ``f(x) |_{x=1}``) is never the final answer for a gold that has none, even
    when it evaluates to the gold: it restates the question. A gold that itself holds the
    operator (``\sum_{k=0}^{n-1} F_k F_{n-k-1}``) is compared as usual. Binomial coefficients
    and factorials with numeric arguments (``\binom{6}{3}``, ``4!``, ``\frac{10!}{3!7!}``) are
    closed forms, as every grader's own tests label them, and so is plain arithmetic
    (``2^{10}``, ``\frac{6}{8}``, ``3\sqrt{2}``): they are graded by their value.

    >>> restates("55", r"\sum_{k=1}^{10} k"), restates("20", r"\binom{6}{3}")
    (True, False)
    """
    return bool(unevaluated_operators(pred) - unevaluated_operators(gold))


class FastComparator:
    """Exact comparison of plain numbers and identical strings; raises NeedsSymbolic otherwise."""

    def scalar(self, gold: Scalar, pred: Scalar) -> bool:
        """Compare as numbers (exactly) or as identical normalized text."""
        if gold.text == pred.text:
            return True
        if restates(gold.text, pred.text):
            return False
        both = gold.percent and pred.percent  # 28% vs 0.28%: the numbers themselves
        gn, pn = _number_candidates(gold, both), _number_candidates(pred, both)
        if gn is not None and pn is not None:
            return any(numbers_equal(a, b) for a in gn for b in pn)
        # A plain number (at most 200 characters) cannot equal a power tower with more than a
        # million digits; sympy would try to build that integer, so decide it here.
        for num, other in ((gn, pred), (pn, gold)):
            if num is not None:
                size = tower_log10(other.text)
                if size is not None and size > 1e6:
                    return False
        g_words, p_words = is_words(gold.text), is_words(pred.text)
        if g_words or p_words:
            if g_words and p_words:
                return normalize_text(gold.text) == normalize_text(pred.text)
            if gn is not None or pn is not None:
                return False  # a number against a sentence
        raise NeedsSymbolic

    def relation(self, gold: Relation, pred: Relation) -> bool:
        """Compare sides after orienting both relations the same way, else ask sympy."""
        g, p = _orient(gold), _orient(pred)
        if g.op != p.op:
            return False
        if restates(f"{g.lhs.text} {g.rhs.text}", f"{p.lhs.text} {p.rhs.text}"):
            return False
        if g.lhs.text == p.lhs.text and g.op == "=" and _SIMPLE_NAME.match(g.lhs.text):
            return self.scalar(g.rhs, p.rhs)  # x = 0.5 vs x = 1/2
        if (g.lhs.text, g.rhs.text) == (p.lhs.text, p.rhs.text):
            return True
        if g.op in ("=", "!=") and (g.lhs.text, g.rhs.text) == (p.rhs.text, p.lhs.text):
            return True
        raise NeedsSymbolic

    def function(self, gold: Cases, pred: Cases) -> bool:
        """Functions by cases need sympy: raise NeedsSymbolic."""
        raise NeedsSymbolic


def _orient(rel: Relation) -> Relation:
    """Write > and >= as < and <= with the sides swapped."""
    if rel.op == ">":
        return Relation("<", rel.rhs, rel.lhs)
    if rel.op == ">=":
        return Relation("<=", rel.rhs, rel.lhs)
    return rel


# --- sympy comparator (runs in worker processes only) ----------------------------------------

#: Two exact constants whose difference sympy cannot tell from 0 at this many digits (plus the
#: integers written in them) are equal: no two distinct answers to a math problem agree that far.
#: The difference is evaluated adaptively (no cancellation), so 1 + 10^{-40} is not 1.
_EXACT_DIGITS = 60
#: An integer literal above this (``\pi + 10^{-10^{5}}``) makes the numeric proof unaffordable:
#: then only ``simplify`` can prove equality.
_MAX_LITERAL_DIGITS = 2000
_DECIMAL_LITERAL = re.compile(r"(?<![\d.])(\d*)\.(\d+)")
_INT_LITERAL = re.compile(r"\d+")
_LETTER_RUN = re.compile(r"[A-Za-z]{3,}")
_COMMAND = re.compile(r"\\[A-Za-z]+")


@functools.lru_cache(maxsize=4096)
def to_sympy(text: str) -> tuple[sympy.Expr, Decimals | None] | None:
    """Parse one scalar with latex2sympy2_extended into (expression, its decimals), or None.

    The second item describes the decimal literals written in ``text`` (None: there are none).

    Text (a run of 3+ letters outside LaTeX commands, e.g. "Monday") is not parsed: latex2sympy
    would read it as the product M*o*n*d*a*y, which equals "Dynamo".
    """
    import sympy
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig, latex2sympy
    from latex2sympy2_extended.math_normalization import NormalizationConfig

    if _LETTER_RUN.search(_COMMAND.sub(" ", text)):
        return None
    try:
        expr = latex2sympy(
            text,
            normalization_config=NormalizationConfig(
                basic_latex=True, units=False, malformed_operators=True, nits=False, boxed="none"
            ),
            conversion_config=ConversionConfig(lowercase_symbols=False),
        )
    except Exception:  # latex2sympy raises bare Exception on syntax errors
        return None
    if not isinstance(expr, sympy.Expr) or isinstance(expr, sympy.Tuple):
        return None
    floats = expr.atoms(sympy.Float)
    if floats:
        # 0.333 -> 333/1000 exactly, from its decimal string (not from the binary float).
        expr = expr.xreplace({f: sympy.Rational(str(f)) for f in floats})
    return expr, decimals_of(text) if floats else None


def _numeric(expr: sympy.Expr) -> sympy.Expr | None:
    """Evaluate a constant expression to 50 digits; None when it has no finite value.

    Kept as a sympy (mpmath) number: a Python float would underflow ``1/2006!`` to 0.
    """
    import sympy

    val = expr.evalf(50)
    if not val.is_number or val.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        return None
    return val


def _terminating(expr: sympy.Expr) -> bool:
    """Tell whether a constant expression is a rational with a finite decimal expansion."""
    import sympy

    try:
        val = expr if expr.is_Rational else sympy.nsimplify(expr)
    except Exception:  # nsimplify gives up with assorted errors; then it is not a known rational
        return False
    return isinstance(val, sympy.Rational) and _denominator_terminates(int(val.q))


def _denominator_terminates(q: int) -> bool:
    for p in (2, 5):
        while q % p == 0:
            q //= p
    return q == 1


def _close(a: sympy.Expr, b: sympy.Expr, rel: float) -> bool:
    """Test |a - b| <= rel * max(|a|, |b|) in arbitrary precision."""
    import sympy

    diff = sympy.Abs(a - b).evalf(50)
    scale = sympy.Max(sympy.Abs(a), sympy.Abs(b)).evalf(50)
    if diff == 0:
        return True
    result = diff <= sympy.Float(rel, 50) * scale
    return bool(result) if isinstance(result, sympy.logic.boolalg.BooleanAtom) else False


@dataclass(frozen=True)
class Decimals:
    """The decimal literals of an answer: the fewest places and significant digits among them."""

    places: int
    digits: int
    #: The whole answer is one decimal literal (``3.1416``), not an expression holding one.
    plain: bool


def decimals_of(text: str) -> Decimals | None:
    """Describe the decimal literals of ``text`` (None when it has none).

    >>> decimals_of("3.1416")
    Decimals(places=4, digits=5, plain=True)
    """
    found = _DECIMAL_LITERAL.findall(text)
    if not found:
        return None
    places = min(len(frac) for _, frac in found)
    digits = min(len((whole + frac).lstrip("0")) for whole, frac in found)
    plain = re.fullmatch(r"\s*-?\d*\.\d+\s*", text) is not None
    return Decimals(places, digits, plain)


def _decimal_approximates(dec: sympy.Expr, info: Decimals, exact: sympy.Expr) -> bool:
    r"""Tell whether the decimal ``dec`` stands for the exact, non-terminating value ``exact``.

    The tolerance is scaled to the digits given: a plain decimal must be ``exact`` rounded or
    truncated to its own places, with at least ``MIN_ROUNDED_DIGITS`` significant digits
    (``2.6667`` and ``2.6666`` for 8/3; not ``2.67`` or ``2.6668``). A decimal inside an
    expression (``1.4142\pi``) must agree to its fewest significant digits.
    """
    import sympy

    if info.digits < MIN_ROUNDED_DIGITS:
        return False
    if not info.plain:
        return _close(dec, exact, 10.0 ** (1 - info.digits))
    scaled = dec * sympy.Integer(10) ** info.places
    target = sympy.Abs(exact) * sympy.Integer(10) ** info.places
    if not scaled.is_Integer or not exact.is_real:
        return False
    if bool(exact.is_negative) != bool(scaled.is_negative):
        return False
    try:
        candidates = {int(sympy.floor(target)), int(sympy.floor(target + sympy.S.Half))}
    except (TypeError, ValueError):  # floor could not be decided numerically
        return False
    return abs(int(scaled)) in candidates


def _constants_equal(ge: sympy.Expr, pe: sympy.Expr, texts: str) -> bool:
    """Decide equality of two exact constant expressions (no decimals on either side)."""
    import sympy
    from sympy.core.evalf import PrecisionExhausted

    if ge.is_Rational and pe.is_Rational:
        return bool(ge == pe)  # exact: 2^{100} is not 2^{100} + 1
    diff = ge - pe
    if diff == 0:
        return True
    literals = _INT_LITERAL.findall(texts)
    if any(len(x) > 4 for x in literals) or any(int(x) > _MAX_LITERAL_DIGITS for x in literals):
        return bool(sympy.simplify(diff) == 0)
    digits = _EXACT_DIGITS + sum(int(x) for x in literals if len(x) > 1)
    try:
        value = diff.evalf(30, strict=True, maxn=min(digits, 4 * _MAX_LITERAL_DIGITS))
    except PrecisionExhausted:
        return True  # equal to more digits than any written number has
    except Exception:  # evalf gives up on some functions; then only a proof counts
        return bool(sympy.simplify(diff) == 0)
    return bool(value == 0)


def exprs_equal(
    gold: tuple[sympy.Expr, Decimals | None],
    pred: tuple[sympy.Expr, Decimals | None],
    texts: str = "",
) -> bool:
    """Decide equality of two parsed scalars under the module's policy.

    ``texts``: the two answers as written (their integer literals bound the numeric proof).
    """
    import sympy

    (ge, g_dec), (pe, p_dec) = gold, pred
    # Same printed form: latex2sympy builds the same name twice as distinct objects in some
    # constructs (indexed names inside a Sum), and simplify would spend seconds proving it.
    if ge == pe or str(ge) == str(pe):
        return True
    symbols = ge.free_symbols | pe.free_symbols
    imaginary = sympy.Symbol("i")
    if symbols == {imaginary}:
        # A constant with i in it (3 + i, e^{i\pi}): i is the imaginary unit on both sides; as a
        # variable, an answer holding it could not equal a constant gold anyway.
        ge, pe = ge.subs(imaginary, sympy.I), pe.subs(imaginary, sympy.I)
        symbols = set()
    if not symbols:
        gv, pv = _numeric(ge), _numeric(pe)
        if gv is None or pv is None:
            return bool(sympy.simplify(ge - pe) == 0)
        # A decimal literal is its exact value (10.5 is 21/2): exact equality first.
        if _constants_equal(ge, pe, texts):
            return True
        if g_dec is None and p_dec is None:
            return False
        if g_dec is not None and p_dec is not None:
            return bool(ge - pe == 0)  # two decimals: exactly the same number
        # A decimal against an exact value: only a non-terminating value may be approximated.
        dec, info, exact = (pe, p_dec, ge) if p_dec is not None else (ge, g_dec, pe)
        if info is None or _terminating(exact):
            return False
        return _decimal_approximates(dec, info, exact)
    if ge.free_symbols != pe.free_symbols:
        return False
    if not _probe_agrees(ge, pe, symbols):
        return False
    if sympy.simplify(ge - pe) == 0 or sympy.expand(ge - pe) == 0:
        return True
    # Identities of real variables sympy does not prove for complex ones: \sqrt{x^2} = |x|.
    real = {s: sympy.Symbol(s.name, real=True) for s in symbols if isinstance(s, sympy.Symbol)}
    return bool(sympy.simplify((ge - pe).xreplace(real)) == 0)


def _probe_agrees(ge: sympy.Expr, pe: sympy.Expr, symbols: set[sympy.Symbol]) -> bool:
    """Quick rejection: evaluate both at a few fixed pseudo-random points."""
    rng = random.Random(1234)
    for _ in range(3):
        point = {s: sympy_rational(rng.randint(11, 97), rng.randint(7, 13)) for s in symbols}
        gv, pv = _numeric(ge.subs(point)), _numeric(pe.subs(point))
        if gv is None or pv is None:
            continue  # a pole or a complex branch: no evidence either way
        if not _close(gv, pv, 1e-9):
            return False
    return True


def sympy_rational(p: int, q: int) -> sympy.Rational:
    """Build a sympy Rational (sympy is imported lazily)."""
    import sympy

    return sympy.Rational(p, q)


class SymbolicComparator(FastComparator):
    """Sympy-backed comparator: the fast checks first, then latex2sympy + sympy."""

    def scalar(self, gold: Scalar, pred: Scalar) -> bool:
        """Compare as numbers, as text, or as sympy expressions."""
        try:
            return super().scalar(gold, pred)
        except NeedsSymbolic:
            pass
        gs, ps = to_sympy(gold.text), to_sympy(pred.text)
        if gs is None or ps is None:
            # Neither reading is math: only the same text, signs and all, is the same answer.
            return latex_text_key(gold.text) == latex_text_key(pred.text)
        both = gold.percent and pred.percent
        for g in _percent_variants(gs, gold.percent and not both):
            for p in _percent_variants(ps, pred.percent and not both):
                if exprs_equal(g, p, f"{gold.text} {pred.text}"):
                    return True
        # 90 degrees against pi/2 radians: only when one side is marked in degrees and the
        # other is written with pi (a radian measure).
        for deg, rad, deg_text, rad_text in ((gs, ps, gold, pred), (ps, gs, pred, gold)):
            if deg_text.degrees and not rad_text.degrees and "\\pi" in rad_text.text:
                import sympy

                if exprs_equal((deg[0] * sympy.pi / 180, deg[1]), rad, deg_text.text):
                    return True
        return False

    def relation(self, gold: Relation, pred: Relation) -> bool:
        """Compare relations: lhs - rhs proportional (positively for inequalities)."""
        try:
            return super().relation(gold, pred)
        except NeedsSymbolic:
            pass
        import sympy

        g, p = _orient(gold), _orient(pred)
        sides = [to_sympy(x.text) for x in (g.lhs, g.rhs, p.lhs, p.rhs)]
        if any(x is None for x in sides):
            return False
        gl, gr, pl, pr = (x[0] for x in sides if x is not None)
        dg, dp = gl - gr, pl - pr
        if dg.free_symbols != dp.free_symbols or dp == 0:
            return False
        ratio = sympy.simplify(dg / dp)
        if ratio.free_symbols or ratio == 0 or not ratio.is_number:
            return False
        return bool(ratio.is_positive) if g.op in ("<", "<=") else bool(ratio.is_nonzero)

    def function(self, gold: Cases, pred: Cases) -> bool:
        """Compare two functions piece by piece with sympy (``piecewise.same_function``)."""
        if restates(" ".join(t for t, _ in gold.branches), " ".join(t for t, _ in pred.branches)):
            return False
        var = gold.var or pred.var
        return same_function(Cases(var, gold.branches), Cases(var, pred.branches), to_sympy)


def _percent_variants(
    parsed: tuple[sympy.Expr, Decimals | None], percent: bool
) -> list[tuple[sympy.Expr, Decimals | None]]:
    if not percent:
        return [parsed]
    import sympy

    return [parsed, (parsed[0] / sympy.Integer(100), parsed[1])]
