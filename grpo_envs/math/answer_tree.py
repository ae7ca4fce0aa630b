r"""The typed tree an answer is parsed into (``normalize.parse_answer``), and its limits.

A node per answer class: a scalar expression, a multiple-choice letter, a set/list/tuple/interval
(``Seq``), a union of intervals, a matrix, a relation, the values of one variable (``SetOf``), an
answer with two readings (``Alt``) and a function by cases. ``equivalence`` walks two such trees.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bracket nesting deeper than this is not a plausible final answer (and would make recursive
#: parsers slow): the answer is judged wrong without parsing.
MAX_DEPTH = 24
#: Sets/tuples/matrices with more elements than this are judged wrong without comparing.
MAX_ITEMS = 64


class AnswerRejected(ValueError):
    """The answer cannot be parsed into a comparable tree (judged wrong without comparing)."""


class AnswerTooComplex(AnswerRejected):
    """The answer is nested too deeply or has too many parts to be compared safely."""


class MalformedAnswer(AnswerRejected):
    r"""The answer has an empty part: "(1, )", "x =", a bare "\cup"."""


@dataclass(frozen=True)
class Scalar:
    """One expression: a number, a LaTeX formula or text. ``percent``: it ended in a % sign."""

    text: str
    percent: bool = False
    #: It carried a degree sign (``30^\circ``): equal to the same number, or to radians.
    degrees: bool = False


@dataclass(frozen=True)
class Choice:
    """A multiple-choice letter, upper-cased."""

    letter: str


@dataclass(frozen=True)
class Seq:
    r"""A bracketed or comma-separated group.

    ``kind``: "set" (``\{..\}``, unordered), "list" (solutions joined by "or"/"and", or a list of
    tuples or equations: unordered), "ordered" (bare commas between values, ``10, 4, -2``: an
    ordered answer, as hendrycks MATH, Qwen2.5-Math, rllm and PRM800K grade it),
    "tuple" (ordered; also intervals, whose brackets are in ``left``/``right``).
    """

    kind: str
    items: tuple[Node, ...]
    left: str = ""
    right: str = ""


@dataclass(frozen=True)
class Union:
    r"""Intervals joined by ``\cup`` (order does not matter)."""

    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Matrix:
    """A matrix: rows of scalars."""

    rows: tuple[tuple[Node, ...], ...]


@dataclass(frozen=True)
class Relation:
    """``lhs op rhs`` with op one of = < > <= >= !=."""

    op: str
    lhs: Scalar
    rhs: Scalar
    #: The right side parsed as an answer of its own ("(p, q) = (3, 2)" -> the tuple (3, 2)).
    rhs_node: Node | None = None


@dataclass(frozen=True)
class SetOf:
    r"""The values of one variable: ``x \in [a, b]``, ``a \le x \le b``, ``x > 5``.

    ``members`` is an interval (a 2-tuple ``Seq`` with its brackets), a union or a set.
    """

    var: str
    members: Node


@dataclass(frozen=True)
class Alt:
    """An answer with two readings ("1,22": the decimal 1.22 or the list 1, 22).

    It equals another answer when either reading does.
    """

    options: tuple[Node, ...]


@dataclass(frozen=True)
class Piecewise:
    r"""A function by cases (``\begin{cases} x & x > 0 \\ -x & \text{otherwise} \end{cases}``).

    ``branches`` are (value, condition) pairs; a condition of None is "otherwise". The order of
    the cases does not matter.
    """

    branches: tuple[tuple[Node, Node | None], ...]


Node = Scalar | Choice | Seq | Union | Matrix | Relation | SetOf | Alt | Piecewise
