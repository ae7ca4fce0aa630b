r"""Turn an extracted answer string into a small typed tree the comparator can walk.

Pure Python (no sympy) so it runs in the caller's process: the structure of an answer -- a set, a
tuple, an interval, a matrix, an equation, a multiple-choice letter -- is decided here from the
brackets, and only the scalar leaves go to sympy. Deciding structure ourselves (instead of trusting
latex2sympy's guess) is what keeps ``(2,1)`` a tuple: latex2sympy reads it as the open interval
(2, 1), which is empty, and every empty interval equals every other one -- a false positive.

Every function here is linear in the input, and inputs are capped (``MAX_ANSWER_CHARS`` in
``extract``, ``MAX_DEPTH`` and ``MAX_ITEMS`` in ``answer_tree``).

The stages live in their own modules: ``latex_clean`` (spelling), ``numeric`` (exact numbers),
``leaves`` (one value with its unit), ``relations`` (bounds and intervals) and ``answer_tree`` (the
node types). This module is the recursive parser that decides the structure, and the public face
of the whole: the names below are importable from here.
"""

from __future__ import annotations

import re

from grpo_envs.math.answer_tree import (
    MAX_DEPTH,
    MAX_ITEMS,
    Alt,
    AnswerRejected,
    AnswerTooComplex,
    Choice,
    MalformedAnswer,
    Matrix,
    Node,
    Piecewise,
    Relation,
    Scalar,
    Seq,
    SetOf,
    Union,
)
from grpo_envs.math.latex_clean import (
    clean,
    is_words,
    latex_text_key,
    matching_bracket,
    max_depth,
    normalize_text,
    split_top,
    strip_units,
    unit_vectors_as_tuple,
)
from grpo_envs.math.leaves import (
    clock_time,
    compound_quantity,
    date,
    leaf,
    scalar,
    spelled_number,
)
from grpo_envs.math.numeric import (
    MIN_ROUNDED_DIGITS,
    THOUSANDS,
    Number,
    number_from_words,
    numbers_equal,
    parse_number,
    terminates,
    tower_log10,
)
from grpo_envs.math.relations import (
    SIMPLE_VAR,
    all_reals_except,
    between,
    is_constant,
    is_name_like,
    relation_as_set,
    split_relation,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MIN_ROUNDED_DIGITS",
    "Alt",
    "AnswerRejected",
    "AnswerTooComplex",
    "Choice",
    "MalformedAnswer",
    "Matrix",
    "Node",
    "Number",
    "Piecewise",
    "Relation",
    "Scalar",
    "Seq",
    "SetOf",
    "Union",
    "all_reals_except",
    "clean",
    "gold_choice",
    "identity_multiple",
    "is_name_like",
    "is_words",
    "latex_text_key",
    "max_depth",
    "normalize_text",
    "number_from_words",
    "numbers_equal",
    "parse_answer",
    "parse_number",
    "relation_as_set",
    "split_top",
    "strip_units",
    "terminates",
    "tower_log10",
    "unit_vectors_as_tuple",
]


_CHOICE = re.compile(r"^\(?\s*([A-J])\s*\)?(?:\s*[).:]\s*.*|\s+.*)?$", re.DOTALL)


_MATRIX = re.compile(r"^\\begin\{([pbvBV]?matrix|array)\}(?:\{[^}]*\})?(.*)\\end\{\1\}$", re.DOTALL)


_OR = re.compile(r"\s+(?:or|and)\s+")


_PLAIN_NUMBER = re.compile(r"^\s*[+-]?\d{1,30}(?:\.\d{1,30})?\s*$")


def parse_answer(raw: str, *, choice: bool = False) -> Node:
    """Parse an extracted answer into a tree. ``choice``: read a leading A-J letter as an option.

    Raises:
        AnswerTooComplex: nesting deeper than ``MAX_DEPTH`` or more than ``MAX_ITEMS`` parts.
        MalformedAnswer: an empty element, side or expression.
    """
    if _PLAIN_NUMBER.match(raw):
        return Scalar(raw.strip().lstrip("+"))  # most answers: no clean-up or structure to read
    s = clean(unit_vectors_as_tuple(raw))
    if max_depth(s) > MAX_DEPTH:
        raise AnswerTooComplex(f"bracket nesting deeper than {MAX_DEPTH}")
    if choice:
        m = _CHOICE.match(s)
        # "(B) 12" is option B; "A and B" / "(A) or (C)" names two options and is not an answer.
        if m and not re.search(r"\b[A-J]\b", s[m.end(1) + 1 :]):
            return Choice(m.group(1))
    return _parse(s, 0)


def gold_choice(raw: str) -> str | None:
    """Return the letter when a gold answer is a bare option ("B", "(B)", "B)"), else None."""
    s = clean(raw)
    m = re.match(r"^\(?\s*([A-J])\s*\)?$", s)
    return m.group(1) if m else None


_DECIMAL_COMMA = re.compile(r"^(-?\d+),(\d+)$")
_IN_SET = re.compile(r"^([A-Za-z](?:_\{?\w+\}?)?)\s*\\in\s*(.+)$", re.DOTALL)
_OR_TIGHT = re.compile(r"(?<=[)\]}])\s*(?:or|and)\s*(?=[(\[{\\])")


def _dedupe(items: list[Node]) -> tuple[Node, ...]:
    """Drop repeated identical elements: a solution set lists each solution once."""
    out: list[Node] = []
    for item in items:
        if item not in out:
            out.append(item)
    return tuple(out)


def _parse(s: str, level: int) -> Node:
    r"""Parse one answer element (nesting ``level``): the first reading that applies, in order.

    Matrices, a decimal comma, ``x \in S``, unions, assignments and bare lists, brackets, then
    relations, plus-minus and ratios; what is left is a scalar leaf.
    """
    s = s.strip()
    if not s:
        raise MalformedAnswer("an empty element")
    for read in (
        spelled_number,
        compound_quantity,
        date,
        _cases,
        _matrix_expression,
        _scaled_matrix,
        _matrix_literal,
        _decimal_comma,
        _all_but,
        _membership,
        _union,
    ):
        node = read(s, level)
        if node is not None:
            return node
    is_set = s.startswith("\\{") and s.endswith("\\}") and matching_bracket(s, 1) == len(s) - 1
    bracketed = is_set or (s[0] in "([" and matching_bracket(s, 0) == len(s) - 1)
    if not bracketed:
        node = _assignment_groups(s)
        if node is None:
            node = _bare_list(s, level)
    else:
        node = _bracketed(s, level, is_set)
    if node is None:
        node = _relation_chain(s, level)
    return node if node is not None else _plus_minus_ratio_or_leaf(s)


def _matrix_literal(s: str, level: int) -> Matrix | None:
    r"""Read a ``\begin{pmatrix} ... \end{pmatrix}`` literal, cell by cell."""
    m = _MATRIX.match(s)
    if not m:
        return None
    rows = [r for r in re.split(r"\\\\", m.group(2)) if r.strip()]
    if len(rows) > MAX_ITEMS:
        raise AnswerTooComplex("matrix too large")
    if sum(r.count("&") + 1 for r in rows) > 4 * MAX_ITEMS:
        raise AnswerTooComplex("matrix too large")
    return Matrix(tuple(tuple(_parse(c, level + 1) for c in r.split("&")) for r in rows))


def _decimal_comma(s: str, level: int) -> Node | None:
    """``1000,99``: a decimal comma where a list of two integers is unlikely, else the list."""
    m = _DECIMAL_COMMA.match(s)
    if not m or THOUSANDS.match(s):
        return None
    whole, frac = m.group(1), m.group(2)
    as_list = Seq("ordered", (scalar(whole), scalar(frac)))
    # Decimal comma (1000,99; 0,111; 2,74) where a list of two integers is unlikely: see the
    # module docstring of ``equivalence`` for the convention.
    if whole.lstrip("-") == "0" or len(frac) == 2 or len(frac) >= 4:
        return Alt((as_list, scalar(f"{whole}.{frac}")))
    return as_list


def _membership(s: str, level: int) -> SetOf | None:
    r"""Read ``x \in S``: the set ``S``, named by ``x``."""
    m = _IN_SET.match(s)
    return SetOf(m.group(1), _parse(m.group(2), level + 1)) if m else None


def _union(s: str, level: int) -> Union | None:
    r"""Read ``A \cup B``: a union of its parts (intervals, sets)."""
    unions = split_top(s, ("\\cup",))
    if len(unions) < 2:
        return None
    if len(unions) > MAX_ITEMS:
        raise AnswerTooComplex("too many intervals")
    return Union(tuple(_parse(u, level + 1) for u in unions))


def _bare_list(s: str, level: int) -> Node | None:
    """Read a bare comma / "or" list (solutions), unless it is a thousands-separated number."""
    if THOUSANDS.match(s):
        return None
    explicit = False
    if level == 0:
        s_or = _OR_TIGHT.sub(", ", _OR.sub(", ", s))
        explicit = s_or != s
        parts = split_top(s_or, (",", ";"))
    else:
        parts = split_top(s, (",", ";"))
    parts = [p for p in parts if p.strip()]
    if len(parts) < 2:
        return None
    if len(parts) > MAX_ITEMS:
        raise AnswerTooComplex("too many elements")
    nodes = _dedupe([_parse(p, level + 1) for p in parts])
    # "\\boxed{4} and again \\boxed{4}" states one answer.
    if len(nodes) == 1:
        return nodes[0]
    values = all(isinstance(n, Scalar | Alt) for n in nodes)
    return Seq("ordered" if values and not explicit else "list", nodes)


def _bracketed(s: str, level: int, is_set: bool) -> Node | None:
    """Brackets enclosing the whole answer: a set, a tuple / interval, or grouping parentheses."""
    if is_set:
        builder = _set_builder(s[2:-2], level)
        if builder is not None:
            return builder
        items = split_top(s[2:-2], (",", ";"))
        if len(items) > MAX_ITEMS:
            raise AnswerTooComplex("too many elements")
        # "\\{\\}" is the empty set, so empty items are dropped rather than rejected.
        return Seq("set", _dedupe([_parse(p, level + 1) for p in items if p.strip()]))
    items = split_top(s[1:-1], (",",))
    if len(items) == 1:
        items = split_top(s[1:-1], (";",))  # (0;-2;6): semicolons as separators
    if len(items) > 1:
        if len(items) > MAX_ITEMS:
            raise AnswerTooComplex("too many elements")
        return Seq("tuple", tuple(_parse(p, level + 1) for p in items), s[0], s[-1])
    if s[0] == "(" or _MATRIX.match(s[1:-1].strip()):
        return _parse(s[1:-1], level + 1)
    return None


_BUILDER = re.compile(
    r"^\s*([A-Za-z](?:_\{?\w+\}?)?)\s*(?:\\in\s*\(-\\infty,\s*\\infty\)\s*)?(?::|\\mid|\|)\s*(.+)$",
    re.DOTALL,
)


def _set_builder(inner: str, level: int) -> SetOf | None:
    r"""Read ``\{y : y \le -1\}`` / ``\{x \mid -2 < x < 3\}`` as the values of the variable."""
    m = _BUILDER.match(inner)
    if m is None:
        return None
    try:
        cond = _parse(m.group(2), level + 1)
    except AnswerRejected:
        return None
    if isinstance(cond, Relation):
        cond = relation_as_set(cond)  # type: ignore[assignment]
    if isinstance(cond, SetOf) and re.sub(r"\s+", "", cond.var) == re.sub(r"\s+", "", m.group(1)):
        return cond
    return None


_EXCEPT = re.compile(
    r"^(?:all\s+)?(?:real\s+numbers?|reals|x)\s+(?:except(?:\s+for)?|other\s+than|but"
    r"|such\s+that\s+x\s*\\ne)\s+(.+)$",
    re.IGNORECASE,
)
_SETMINUS = re.compile(r"^\(-\\infty,\s*\\infty\)\s*(?:\\setminus|\\backslash|-)\s*\\\{(.+)\\\}$")


def _all_but(s: str, level: int) -> Node | None:
    r"""Read "all real numbers except 3" or ``\mathbb{R} \setminus \{1, 2\}`` as intervals."""
    m = _EXCEPT.match(s) or _SETMINUS.match(s)
    if m is None:
        return None
    parts = split_top(_OR.sub(", ", m.group(1)), (",",))
    points = [p.strip() for p in parts if p.strip()]
    if not points or len(points) > MAX_ITEMS or any(parse_number(p) is None for p in points):
        return None
    return all_reals_except([Scalar(p) for p in points])


def _relation_chain(s: str, level: int) -> Node | None:
    r"""Read ``a \approx b``, ``x = 5``, ``x = 5 + 5 + 1 = 11``, ``1 < x < 3``; else None."""
    # "\\frac{1}{6} \\approx 0.167": the exact form before \\approx is the answer; in
    # "x \\approx 11" the name is not, so the value after it is.
    approx = split_top(s, ("\\approx",))
    if len(approx) > 1:
        first = approx[0].strip()
        # "\\approx 5" (a box opened with the sign) states 5.
        use_last = not first or SIMPLE_VAR.match(first)
        return _parse(approx[-1] if use_last else first, level + 1)
    sides, ops = split_relation(s)
    if len(sides) == 2:
        return _relation(ops[0], sides[0], sides[1], level)
    if len(sides) > 2:
        if all(op == "=" for op in ops):
            # "x = 5 + 5 + 1 = 11": the first side that names something, and the last side,
            # which is the value.
            name = next((p for p in sides[:-1] if is_name_like(p.strip())), sides[0])
            return _relation("=", name, sides[-1], level)
        if len(sides) == 3 and is_name_like(sides[1].strip()):
            return between(sides, ops, s)
        return scalar(s)
    return None


def _plus_minus_ratio_or_leaf(s: str) -> Node:
    r"""Read ``a \pm b`` (the set of both), a ratio or time ``7:32``, else a scalar leaf."""
    # Plus-minus: a \\pm b is the set {a + b, a - b}.
    if "\\pm" in s or "\\mp" in s:
        plus = s.replace("\\pm", "+").replace("\\mp", "-")
        minus = s.replace("\\pm", "-").replace("\\mp", "+")
        return Seq("set", (scalar(plus), scalar(minus)))
    clock = clock_time(s)
    if clock is not None:
        return clock
    # A ratio or a time ("7:32", "12:00"): an ordered pair that only equals another ratio.
    ratio = split_top(s, (":",))
    if len(ratio) == 2 and all(p.strip() for p in ratio) and "\\" not in s:
        return Seq("tuple", tuple(scalar(p) for p in ratio), ":", ":")
    return leaf(s)


_MATRIX_ENV = re.compile(r"\\begin\{([pbvBV]?matrix)\}.*?\\end\{\1\}", re.DOTALL)


def _matrix_expression(s: str, level: int) -> Matrix | None:
    """Evaluate ``A + B``, ``A - B`` or ``A B`` of literal matrices into cell expressions."""
    found = list(_MATRIX_ENV.finditer(s))
    if len(found) != 2 or s[: found[0].start()].strip() or s[found[1].end() :].strip():
        return None
    op = s[found[0].end() : found[1].start()].strip()
    if op not in ("+", "-", "", "\\cdot", "\\times"):
        return None
    a, b = (_parse(m.group(0), level + 1) for m in found)
    if not (isinstance(a, Matrix) and isinstance(b, Matrix)):
        return None
    cells_a = [[c.text for c in row if isinstance(c, Scalar)] for row in a.rows]
    cells_b = [[c.text for c in row if isinstance(c, Scalar)] for row in b.rows]
    if any(len(r) != len(a.rows[0]) for r in cells_a) or any(
        len(r) != len(b.rows[0]) for r in cells_b
    ):
        return None
    if op in ("+", "-"):
        if (len(cells_a), len(cells_a[0])) != (len(cells_b), len(cells_b[0])):
            return None
        rows = tuple(
            tuple(Scalar(f"({x}){op}({y})") for x, y in zip(ra, rb))
            for ra, rb in zip(cells_a, cells_b)
        )
        return Matrix(rows)
    if len(cells_a[0]) != len(cells_b):
        return None
    rows = tuple(
        tuple(
            Scalar("+".join(f"({ra[k]})*({cells_b[k][j]})" for k in range(len(cells_b))))
            for j in range(len(cells_b[0]))
        )
        for ra in cells_a
    )
    return Matrix(rows)


_CASES = re.compile(
    r"^(?:\\begin\{[dr]?cases\}(.*)\\end\{[dr]?cases\}"
    # \left\{ \begin{array}{ll} ... \end{array} \right. (the \left/\right are cleaned away)
    r"|\\\{\s*\\begin\{array\}\{\s*[lcr]\s*\|?\s*[lcr]\s*\}(.*)\\end\{array\})$",
    re.DOTALL,
)
_CONDITION_WORDS = re.compile(r"^\s*(?:if|for|when|where|whenever)\b\s*|[\s,;.]+$", re.IGNORECASE)
_OTHERWISE = re.compile(r"^(?:otherwise|else|elsewhere|in\s+all\s+other\s+cases)$", re.IGNORECASE)


def _cases(s: str, level: int) -> Piecewise | None:
    r"""Read ``\begin{cases} v_1 & c_1 \\ v_2 & c_2 \end{cases}`` as (value, condition) pairs."""
    m = _CASES.match(s)
    if m is None:
        return None
    body = m.group(1) if m.group(1) is not None else m.group(2)
    rows = [r for r in re.split(r"\\\\", body) if r.strip()]
    if not rows or len(rows) > MAX_ITEMS:
        return None
    branches: list[tuple[Node, Node | None]] = []
    for row in rows:
        value, _, condition = row.partition("&")
        condition = _CONDITION_WORDS.sub("", condition).strip()
        cond: Node | None = None
        if condition and not _OTHERWISE.match(condition):
            cond = _parse(condition, level + 1)
        elif not condition and row is not rows[-1]:
            return None  # a case without a condition before the last one: not a function
        # "x, & x \ge 0": the comma ends the value (a common way to write cases).
        branches.append((_parse(value.strip().rstrip(",;").strip(), level + 1), cond))
    return Piecewise(tuple(branches))


_SCALED_MATRIX = re.compile(
    r"^([^\\]*?|\\frac\{[^{}]*\}\{[^{}]*\}|\\sqrt\{[^{}]*\})\s*(?:\\cdot|\\times)?\s*"
    r"(\\begin\{([pbvBV]?matrix)\}.*\\end\{\3\})$",
    re.DOTALL,
)
_IDENTITY = re.compile(r"^(.*?)\s*(?:\\cdot|\\times)?\s*I(?:_\{?(\d)\}?)?$")


def _scaled_matrix(s: str, level: int) -> Matrix | None:
    r"""Read ``2\begin{pmatrix}1\\2\end{pmatrix}`` (a scalar times a matrix) cell by cell."""
    m = _SCALED_MATRIX.match(s)
    if m is None or not m.group(1).strip():
        return None
    coef = m.group(1).strip()
    if coef in ("-", "+"):
        coef += "1"
    inner = _parse(m.group(2), level + 1)
    if not isinstance(inner, Matrix):
        return None
    cells = tuple(
        tuple(Scalar(f"({coef}) \\cdot ({c.text})") if isinstance(c, Scalar) else c for c in row)
        for row in inner.rows
    )
    return Matrix(cells)


def identity_multiple(node: Node, size: int) -> Matrix | None:
    r"""Read ``2I`` / ``3I_3`` / ``I`` as that multiple of the ``size`` x ``size`` identity."""
    if not isinstance(node, Scalar) or size > MAX_ITEMS:
        return None
    m = _IDENTITY.match(node.text)
    if m is None or (m.group(2) and int(m.group(2)) != size) or re.search(r"[A-Za-z]", m.group(1)):
        return None
    coef = m.group(1).strip() or "1"
    if coef in ("-", "+"):
        coef += "1"
    zero = Scalar("0")
    diagonal = Scalar(coef)
    return Matrix(
        tuple(tuple(diagonal if i == j else zero for j in range(size)) for i in range(size))
    )


_ASSIGN = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*=\s*([^=]+)$")


def _assignment_groups(s: str) -> Seq | None:
    """``p=5,q=2;p=7,q=2`` -> the solutions (5, 2), (7, 2): one tuple per ;-separated group."""
    groups = split_top(s, (";",))
    if len(groups) < 2 or len(groups) > MAX_ITEMS:
        return None
    tuples = []
    for group in groups:
        values = []
        for part in split_top(group, (",",)):
            m = _ASSIGN.match(part)
            if m is None:
                return None
            values.append(scalar(m.group(1)))
        if len(values) < 2:
            return None
        tuples.append(Seq("tuple", tuple(values), "(", ")"))
    return Seq("list", _dedupe(list(tuples)))


def _relation(op: str, lhs: str, rhs: str, level: int) -> Relation:
    rhs_node: Node | None = None
    if op == "=" and (
        is_name_like(lhs.strip()) or (is_constant(lhs) and is_constant(rhs) and lhs.strip())
    ):
        try:
            rhs_node = _parse(rhs, level + 1)
        except AnswerRejected:
            rhs_node = None
    return Relation(op, scalar(lhs), scalar(rhs), rhs_node)
