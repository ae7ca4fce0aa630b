r"""Turn an extracted answer string into a small typed tree the comparator can walk.

Pure Python (no sympy) so it runs in the caller's process: the structure of an answer -- a set, a
tuple, an interval, a matrix, an equation, a multiple-choice letter -- is decided here from the
brackets, and only the scalar leaves go to sympy. Deciding structure ourselves (instead of trusting
latex2sympy's guess) is what keeps ``(2,1)`` a tuple: latex2sympy reads it as the open interval
(2, 1), which is empty, and every empty interval equals every other one -- a false positive.

Every function here is linear in the input, and inputs are capped (``MAX_ANSWER_CHARS`` in
``extract``, ``MAX_DEPTH`` and ``MAX_ITEMS`` below).

Why one module over 500 lines: one recursive parser decides every answer class (sets, tuples,
intervals, relations, matrices, numbers, units), and each class's rule needs the node types and
cleaners defined here.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from fractions import Fraction

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


# --- tree -----------------------------------------------------------------------------------


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


# --- string clean-up ------------------------------------------------------------------------

_UNICODE = {
    "−": "-",
    "–": "-",
    "×": "\\times ",
    "·": "\\cdot ",
    "÷": "\\div ",
    "π": "\\pi ",
    "∞": "\\infty ",
    "√": "\\sqrt",
    "≤": "\\le ",
    "≥": "\\ge ",
    "≠": "\\ne ",
    "±": "\\pm ",
    "°": "^\\circ",
    "∪": "\\cup ",
    "\u00a0": " ",
}
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\quad|\\qquad|\\displaystyle|\\limits|~")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)\s*(?=[()\[\]|.]|\\[{}|])")
_LEFT_RIGHT_DOT = re.compile(r"\\(?:left|right)\.")
_FRAC_VARIANTS = re.compile(r"\\[dtc]frac")
_TEXT_CMD = re.compile(
    r"\\(?:text|textbf|textit|textnormal|textrm|textsf|texttt|mathrm|mathbf|mathsf|mathtt|mbox"
    r"|operatorname|mathit|rm|bf|boldsymbol)\s*\{"
)
# "\\frac" in a string that was escaped twice: a LaTeX line break cannot precede a letter.
_DOUBLE_BACKSLASH_CMD = re.compile(r"(?<!\\)\\\\(?=[A-Za-z])")
_REL_WORDS = (
    (re.compile(r"\\lt(?![A-Za-z])"), "<"),
    (re.compile(r"\\gt(?![A-Za-z])"), ">"),
    (re.compile(r"\\(?:leqslant|leqq|le)(?![A-Za-z])"), "\\le "),
    (re.compile(r"\\(?:geqslant|geqq|ge)(?![A-Za-z])"), "\\ge "),
    (re.compile(r"\\mathbb\s*\{?\s*R\s*\}?"), "(-\\infty, \\infty)"),
    (re.compile(r"\\(?:dots|ldots|cdots)(?![A-Za-z])"), "\\ldots"),
    (re.compile(r"\\langle(?![A-Za-z])"), "("),  # <1, 2, 3>: a vector, written as a tuple
    (re.compile(r"\\rangle(?![A-Za-z])"), ")"),
    (re.compile(r"\\(?:emptyset|varnothing)(?![A-Za-z])"), "\\{\\}"),
)
_ORDINAL = re.compile(r"\^\s*\{\s*(?:st|nd|rd|th)\s*\}")
_PERCENT_WORD = re.compile(r"\s*(?:percentage|percent|pct)\b\.?", re.IGNORECASE)
# "16,\\!386" / "16{,}\\!386": a comma joined to the next group by a negative space is a
# thousands separator, even with a space after it ("11,\\! 111").
_NEG_SPACE_GROUP = re.compile(r"(?:\{,\}|,)\s*\\!\s*(?=\d{3}(?!\d))")
_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree")
_DOLLAR = re.compile(r"\\\$|\$|[€£¥₹]|\\(?:euro|pounds|yen|textdollar)(?![A-Za-z])")
_THOUSANDS = re.compile(r"^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")
_ASCII_FUNCS = re.compile(r"(?<![\\A-Za-z])(sqrt|pi|sin|cos|tan|log|ln|exp|infty|cdot)(?![A-Za-z])")
_CHOICE = re.compile(r"^\(?\s*([A-J])\s*\)?(?:\s*[).:]\s*.*|\s+.*)?$", re.DOTALL)
_WORDS_ONLY = re.compile(r"^[A-Za-z][A-Za-z' -]*$")
_SPACED_DIGITS = re.compile(r"(?<=\d)(?:\\,|\{,\}|\s)(?=\d{3}(?!\d))")
_KNOWN_UNITS = {
    "cm", "m", "km", "mm", "kg", "g", "mg", "lb", "lbs", "oz", "ft", "in", "inch", "inches",
    "feet", "foot", "yd", "yards", "mi", "miles", "mile", "meters", "meter", "s", "sec",
    "seconds", "second", "min", "minutes", "minute", "h", "hr", "hrs", "hours", "hour", "days",
    "day", "weeks", "week", "years", "year", "months", "month", "dollars", "dollar", "cents",
    "cent", "units", "unit", "degrees", "degree", "mph", "l", "ml", "liters", "litres", "sq",
    "square", "cubic", "percent", "points", "pounds", "people", "students", "apples",
    "euros", "euro", "yen", "rupees", "usd", "eur", "gbp",
}  # fmt: skip


def _unwrap_text_commands(s: str) -> str:
    r"""``\text{ cm}`` -> `` cm ``: keep the content, drop the command and its braces."""
    for _ in range(8):  # bounded: each pass removes at least one command
        m = _TEXT_CMD.search(s)
        if m is None:
            break
        start, depth, j = m.end(), 1, m.end()
        while j < len(s) and depth:
            if s[j] == "{":
                depth += 1
            elif s[j] == "}":
                depth -= 1
            j += 1
        inner = s[start : j - 1] if depth == 0 else s[start:]
        s = s[: m.start()] + " " + inner + " " + s[j:]
    return s


def clean(answer: str) -> str:
    r"""Normalize LaTeX spelling without changing meaning.

    Drops ``$``/``\(``/``\[`` delimiters, ``\left``/``\right``, spacing commands, ``\text{}``
    wrappers, dollar signs and a final full stop; marks degrees as ``°``; ``\dfrac`` ->
    ``\frac``; ascii ``sqrt(2)``/``pi`` -> LaTeX.

    >>> clean(r"$\dfrac{1}{2}\text{ cm}$.")
    '\\frac{1}{2} cm'
    """
    s = answer.strip()
    for src, dst in _UNICODE.items():
        s = s.replace(src, dst)
    s = _DOUBLE_BACKSLASH_CMD.sub(r"\\", s)
    s = _NEG_SPACE_GROUP.sub(",", s)
    s = s.replace("\\!", "")
    for pattern, repl in _REL_WORDS:
        s = pattern.sub(lambda _m, r=repl: r, s)  # type: ignore[misc]
    for open_, close in (("\\[", "\\]"), ("\\(", "\\)")):
        s = s.replace(open_, " ").replace(close, " ")
    s = _SPACED_DIGITS.sub("", s)  # 1\,000 / 1{,}000 / "1 000" -> 1000
    s = s.replace("{,}", ",")
    s = _LEFT_RIGHT_DOT.sub("", s)
    s = _LEFT_RIGHT.sub("", s)
    s = _SPACING.sub(" ", s)
    s = _FRAC_VARIANTS.sub(r"\\frac", s)
    s = _DEGREE.sub("°", s)
    s = _DOLLAR.sub("", s)
    s = _unwrap_text_commands(s)
    s = s.replace("\\%", "%")
    s = _PERCENT_WORD.sub("%", s)
    s = _ORDINAL.sub("", s)
    s = _ASCII_FUNCS.sub(r"\\\1", s)
    s = _fix_sqrt_parens(s)
    s = " ".join(s.split())
    s = s.rstrip(".").strip()
    while s.startswith("{") and _matching(s, 0) == len(s) - 1:
        s = s[1:-1].strip()
    return s


def _fix_sqrt_parens(s: str) -> str:
    r"""``\sqrt(2)`` -> ``\sqrt{2}``: latex2sympy cannot read the former (Math-Verify's
    ``4\sqrt(2) == 4`` false positive comes from mis-reading it).
    """  # noqa: D205
    out = []
    i = 0
    while True:
        k = s.find("\\sqrt", i)
        if k < 0:
            out.append(s[i:])
            break
        j = k + 5
        while j < len(s) and s[j] == " ":
            j += 1
        if j < len(s) and s[j] == "(":
            end = _matching(s, j)
            if end > 0:
                out.append(s[i:k] + "\\sqrt{" + s[j + 1 : end] + "}")
                i = end + 1
                continue
        out.append(s[i:j])
        i = j
    return "".join(out)


_UNIT_WORD = re.compile(r"\s+([A-Za-z]+\.?)\s*(?:\^\s*\{?\d\}?)?$")
# Multi-letter units only: "4h" or "3s" may well be an expression in the height h or side s.
_GLUED_UNIT = re.compile(r"(?<=\d)(cm|mm|km|kg|mg|ft|min|hr|hrs|sec|mph)(?:\^\s*\{?\d\}?)?$")


def strip_units(s: str) -> str:
    r"""Drop trailing unit words ("12 dollars", "5 cm^2", "6\pi square units", "5cm").

    Only when what remains still looks like math (has a digit or a LaTeX command), so a text
    answer such as "no solution" is left alone. A single letter is a unit only if it is a known
    one ("5 m"), since "2 x" is more likely a product.
    """
    for _ in range(4):
        m = _UNIT_WORD.search(s)
        if m is None:
            break
        word = m.group(1).rstrip(".").lower()
        head = s[: m.start()].rstrip()
        # An unknown short word after a number is more likely variables ("5 xy") than a unit.
        if len(word) < 3 and word not in _KNOWN_UNITS:
            break
        if not re.search(r"\d|\\[A-Za-z]", head) or head.endswith(("\\", "^", "_")):
            break
        s = head
    m = _GLUED_UNIT.search(s)
    if m and re.fullmatch(r"[-+]?[\d.,]+", s[: m.start()]):
        s = s[: m.start()]
    return s


def _matching(s: str, i: int) -> int:
    """Return the index of the bracket closing the one at ``i`` (any of )]} closes any of ([{)."""
    depth = 0
    for j in range(i, len(s)):
        ch = s[j]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return j
    return -1


def max_depth(s: str) -> int:
    """Return the deepest bracket nesting in ``s``."""
    depth = best = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            best = max(best, depth)
        elif ch in ")]}":
            depth -= 1
    return best


def split_top(s: str, seps: tuple[str, ...]) -> list[str]:
    r"""Split ``s`` on any of ``seps`` at bracket depth 0 (``\{`` counts as a bracket)."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(s)
    while i < n:
        ch = s[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            for sep in seps:
                if s.startswith(sep, i):
                    # "\le" must not match inside "\left": a command needs a non-letter next.
                    nxt = s[i + len(sep) : i + len(sep) + 1]
                    if sep[-1].isalpha() and nxt.isalpha():
                        continue
                    parts.append(s[start:i])
                    i += len(sep)
                    start = i
                    break
            else:
                i += 1
                continue
            continue
        i += 1
    parts.append(s[start:])
    return parts


# --- numbers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """An exactly parsed number. ``decimal``: written with a decimal point (maybe rounded)."""

    value: Fraction
    decimal: bool
    #: Digits after the decimal point as written (0 for integers and fractions).
    places: int = 0


#: A decimal written with at least this many significant digits matches a value with no finite
#: decimal expansion when it is that value correctly rounded (2.6667 for 8/3). Fewer digits
#: (0.33, 1.41, 3.14) are an approximation, not the answer.
MIN_ROUNDED_DIGITS = 5

_INT_OR_DEC = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$")
_SLASH = re.compile(r"^([+-]?)\s*(\d+)\s*/\s*(\d+)$")
_FRAC = re.compile(
    r"^([+-]?)\s*\\frac\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))$"
)
_MIXED = re.compile(
    r"^([+-]?)\s*(\d+)\s*(?:\\frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}|\s(\d+)\s*/\s*(\d+))$"
)
_REPEATING = re.compile(r"^([+-]?)(\d*)\.(\d*)\s*\\overline\s*\{\s*(\d{1,12})\s*\}$")
_E_NOTATION = re.compile(r"^([+-]?\d+(?:\.\d+)?)[eE]([+-]?\d{1,3})$")
_SCI = re.compile(
    r"^([+-]?\d+(?:\.\d+)?)\s*(?:\\times|\\cdot|\*)\s*10\s*\^\s*\{?\s*([+-]?\d{1,3})\s*\}?$"
)


def parse_number(s: str) -> Number | None:
    r"""Parse a plain number exactly, or return None (then the caller asks sympy).

    Handles integers, decimals, thousands separators, ``a/b``, ``\frac{a}{b}``, ``\frac12``,
    mixed numbers (``3\frac{1}{2}``, ``3 1/2``) and ``1.5\times 10^{3}``. Never evaluates anything
    unbounded (the exponent of 10 is at most three digits).

    >>> parse_number("1,234.5").value
    Fraction(2469, 2)
    >>> parse_number(r"2\frac{1}{4}").value
    Fraction(9, 4)
    """
    s = s.strip()
    if not s or len(s) > 200:
        return None
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    if _INT_OR_DEC.match(s):
        places = len(s.split(".", 1)[1]) if "." in s else 0
        return Number(Fraction(s), "." in s, places)
    m = _SLASH.match(s)
    if m:
        den = int(m.group(3))
        if den == 0:
            return None
        v = Fraction(int(m.group(2)), den)
        return Number(-v if m.group(1) == "-" else v, False)
    m = _FRAC.match(s)
    if m:
        num = int(m.group(2) or m.group(3))
        den = int(m.group(4) or m.group(5))
        if den == 0:
            return None
        v = Fraction(num, den)
        return Number(-v if m.group(1) == "-" else v, False)
    m = _MIXED.match(s)
    if m:
        whole = int(m.group(2))
        num = int(m.group(3) or m.group(5))
        den = int(m.group(4) or m.group(6))
        if den == 0 or num >= den:
            return None  # "3 5/2" is not a mixed number; let sympy read it as a product
        v = whole + Fraction(num, den)
        return Number(-v if m.group(1) == "-" else v, False)
    m = _SCI.match(s)
    if m:
        mant = Fraction(m.group(1))
        return Number(mant * Fraction(10) ** int(m.group(2)), "." in m.group(1))
    m = _E_NOTATION.match(s)
    if m:  # 1.5e3, as calculators and programs print it
        mant = Fraction(m.group(1))
        return Number(mant * Fraction(10) ** int(m.group(2)), "." in m.group(1))
    m = _REPEATING.match(s)
    if m:
        # 0.1\overline{6} = 0.1666...: exact, not a rounded decimal.
        sign, int_part, fixed, period = m.groups()
        value = Fraction(int(int_part or "0")) + (
            Fraction(int(fixed), 10 ** len(fixed)) if fixed else Fraction(0)
        )
        value += Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
        return Number(-value if sign == "-" else value, False)
    return None


_TOWER_BASE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*")


def tower_log10(s: str) -> float | None:
    """log10 of a literal power tower such as ``9^{9^{9^9}}`` without evaluating it, else None.

    Used to reject, in microseconds, a plain-number gold against an expression too large to
    compute (sympy would try to build the exact integer). Returns ``inf`` when even the
    logarithm overflows a float.
    """
    s = s.strip()
    m = _TOWER_BASE.match(s)
    if m is None or m.end() == len(s) or s[m.end()] != "^":
        return None
    base = float(m.group(1))
    rest = s[m.end() + 1 :].strip()
    if rest.startswith("{") and _matching(rest, 0) == len(rest) - 1:
        rest = rest[1:-1]
    if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", rest):
        exponent_log10 = math.log10(float(rest)) if float(rest) > 0 else -math.inf
    elif re.fullmatch(r"\d", rest[:1] or "x"):
        inner = tower_log10(rest)
        if inner is None:
            return None
        exponent_log10 = inner
    else:
        return None
    if base <= 1:
        return None  # 1^x and 0^x are small; let sympy handle them
    # log10(base^e) = e * log10(base) = 10^exponent_log10 * log10(base)
    if exponent_log10 > 300:
        return math.inf
    return (10.0**exponent_log10) * math.log10(base)


def terminates(x: Fraction) -> bool:
    """Tell whether ``x`` has a finite decimal expansion (denominator of 2s and 5s only)."""
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def numbers_equal(a: Number, b: Number) -> bool:
    """Exact equality; a decimal may stand for a non-terminating value only as its rounding.

    The tolerance is scaled to the digits given: a decimal with at least ``MIN_ROUNDED_DIGITS``
    significant digits equals a value with no finite decimal expansion when it is that value
    rounded or truncated to the decimal's own places (``0.33333`` and ``0.3333333`` for 1/3, not
    ``0.33`` or ``0.3333334``). Two values with finite expansions must match exactly
    (1000001.0 is not 1000000), and so must integers and fractions, however large.

    >>> numbers_equal(parse_number("2.6667"), parse_number("8/3"))
    True
    >>> numbers_equal(parse_number("2.6668"), parse_number("8/3"))
    False
    """
    if a.value == b.value:
        return True
    for dec, other in ((a, b), (b, a)):
        if dec.decimal and not terminates(other.value):
            scaled = dec.value * 10**dec.places
            if scaled.denominator != 1 or len(str(abs(scaled.numerator))) < MIN_ROUNDED_DIGITS:
                return False
            if (scaled < 0) != (other.value < 0):
                return False
            target = abs(other.value) * 10**dec.places
            return abs(scaled.numerator) in (
                math.floor(target),
                math.floor(target + Fraction(1, 2)),
            )
    return False


# --- structure ------------------------------------------------------------------------------

_MATRIX = re.compile(r"^\\begin\{([pbvBV]?matrix|array)\}(?:\{[^}]*\})?(.*)\\end\{\1\}$", re.DOTALL)
_REL_OPS = ("\\leq", "\\geq", "\\neq", "\\le", "\\ge", "\\ne", "<=", ">=", "!=", "=", "<", ">")
_REL_CANON = {"\\leq": "<=", "\\le": "<=", "\\geq": ">=", "\\ge": ">=", "\\neq": "!=", "\\ne": "!="}
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


_UNIT_VECTOR = re.compile(
    r"\\(?:hat|mathbf|vec|boldsymbol|bm)\s*\{?\s*(?:\\)?([ijk])(?:math)?\s*\}?(?![A-Za-z])"
)


def unit_vectors_as_tuple(raw: str) -> str:
    r"""Write ``3\mathbf{i} - \hat{j} + 2\hat{k}`` as the tuple ``(3, -1, 2)``; else ``raw``.

    Only unit vectors marked as such (``\hat``, ``\mathbf``, ``\vec``): a bare ``i`` is the
    imaginary unit. Without a k-component the vector is planar, ``(a, b)``.

    >>> unit_vectors_as_tuple(r"3\mathbf{i} - \hat{j}")
    '(3, -1)'
    """
    if not _UNIT_VECTOR.search(raw) or len(raw) > 500:
        return raw
    text = raw.strip().strip("$").strip()
    coefficients: dict[str, str] = {}
    pos = 0
    for m in _UNIT_VECTOR.finditer(text):
        coef = text[pos : m.start()].strip()
        axis = m.group(1)
        if axis in coefficients:
            return raw
        sign = "-" if coef.startswith("-") else ""
        coef = coef.lstrip("+-").strip().removesuffix("\\cdot").removesuffix("\\times").strip()
        if re.search(r"(?<!^)[+-]", coef) or (
            pos and text[pos : m.start()].strip()[:1] not in ("+", "-")
        ):
            return raw  # a term is a sum itself, or two terms without a sign between them
        coefficients[axis] = f"{sign}{coef or '1'}"
        pos = m.end()
    if text[pos:].strip():
        return raw
    axes = "ijk" if "k" in coefficients else "ij"
    return "(" + ", ".join(coefficients.get(a, "0") for a in axes) + ")"


def gold_choice(raw: str) -> str | None:
    """Return the letter when a gold answer is a bare option ("B", "(B)", "B)"), else None."""
    s = clean(raw)
    m = re.match(r"^\(?\s*([A-J])\s*\)?$", s)
    return m.group(1) if m else None


_DECIMAL_COMMA = re.compile(r"^(-?\d+),(\d+)$")
_IN_SET = re.compile(r"^([A-Za-z](?:_\{?\w+\}?)?)\s*\\in\s*(.+)$", re.DOTALL)
_OR_TIGHT = re.compile(r"(?<=[)\]}])\s*(?:or|and)\s*(?=[(\[{\\])")
_SIMPLE_VAR = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?$")
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


def _is_constant(text: str) -> bool:
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
    if (_SIMPLE_VAR.match(rhs) and _is_constant(lhs)) or _ABS_LINEAR.match(rhs):
        lhs, rhs = rhs, lhs
        op = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}[op]
    absolute = _ABS_LINEAR.match(lhs)
    if absolute is not None:
        return _absolute_bound(absolute, op, rhs)
    if not (_SIMPLE_VAR.match(lhs) and _is_constant(rhs)):
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
        Scalar(_fraction_text(center - radius.value)),
        Scalar(_fraction_text(center + radius.value)),
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


def _fraction_text(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


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


def _split_relation(s: str) -> tuple[list[str], list[str]]:
    """Split ``s`` on its top-level relation signs: the sides and the (canonical) operators."""
    sides = split_top(s, _REL_OPS)
    ops = []
    pos = 0
    for side in sides[:-1]:
        pos = s.index(side, pos) + len(side) if side else pos
        ops.append(_relation_op(s[pos:], ""))
        for op in _REL_OPS:
            if s.startswith(op, pos):
                pos += len(op)
                break
    return sides, ops


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
        _spelled_number,
        _compound_quantity,
        _date,
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
    is_set = s.startswith("\\{") and s.endswith("\\}") and _matching(s, 1) == len(s) - 1
    bracketed = is_set or (s[0] in "([" and _matching(s, 0) == len(s) - 1)
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
    if not m or _THOUSANDS.match(s):
        return None
    whole, frac = m.group(1), m.group(2)
    as_list = Seq("ordered", (_scalar(whole), _scalar(frac)))
    # Decimal comma (1000,99; 0,111; 2,74) where a list of two integers is unlikely: see the
    # module docstring of ``equivalence`` for the convention.
    if whole.lstrip("-") == "0" or len(frac) == 2 or len(frac) >= 4:
        return Alt((as_list, _scalar(f"{whole}.{frac}")))
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
    if _THOUSANDS.match(s):
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
        use_last = not first or _SIMPLE_VAR.match(first)
        return _parse(approx[-1] if use_last else first, level + 1)
    sides, ops = _split_relation(s)
    if len(sides) == 2:
        return _relation(ops[0], sides[0], sides[1], level)
    if len(sides) > 2:
        if all(op == "=" for op in ops):
            # "x = 5 + 5 + 1 = 11": the first side that names something, and the last side,
            # which is the value.
            name = next((p for p in sides[:-1] if is_name_like(p.strip())), sides[0])
            return _relation("=", name, sides[-1], level)
        if len(sides) == 3 and is_name_like(sides[1].strip()):
            return _between(sides, ops, s)
        return _scalar(s)
    return None


def _plus_minus_ratio_or_leaf(s: str) -> Node:
    r"""Read ``a \pm b`` (the set of both), a ratio or time ``7:32``, else a scalar leaf."""
    # Plus-minus: a \\pm b is the set {a + b, a - b}.
    if "\\pm" in s or "\\mp" in s:
        plus = s.replace("\\pm", "+").replace("\\mp", "-")
        minus = s.replace("\\pm", "-").replace("\\mp", "+")
        return Seq("set", (_scalar(plus), _scalar(minus)))
    clock = _clock_time(s)
    if clock is not None:
        return clock
    # A ratio or a time ("7:32", "12:00"): an ordered pair that only equals another ratio.
    ratio = split_top(s, (":",))
    if len(ratio) == 2 and all(p.strip() for p in ratio) and "\\" not in s:
        return Seq("tuple", tuple(_scalar(p) for p in ratio), ":", ":")
    return _leaf(s)


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


# Quantities written in two units (big unit, small unit, small units per big one).
_COMPOUND_UNITS = (
    (r"hours?|hrs?|h", r"minutes?|mins?|m", 60),
    (r"minutes?|mins?|m", r"seconds?|secs?|s", 60),
    (r"feet|foot|ft", r"inch(?:es)?|in", 12),
    (r"dollars?", r"cents?", 100),
    (r"pounds?|lbs?", r"ounces?|oz", 16),
    (r"meters?|m", r"centimeters?|cm", 100),
    (r"years?", r"months?", 12),
    (r"weeks?", r"days?", 7),
)
_COMPOUND = [
    re.compile(
        rf"^(\d+(?:\.\d+)?)\s*(?:{big})\s*,?\s*(?:and\s*)?(\d+(?:\.\d+)?)\s*(?:{small})$",
        re.IGNORECASE,
    )
    for big, small, _ in _COMPOUND_UNITS
]


def _compound_quantity(s: str, level: int) -> Alt | None:
    """Read "1 hour 30 minutes" as 1.5 (hours) or 90 (minutes), "5 feet 3 inches" as 5.25 or 63.

    One quantity in two units equals its value in either unit, never one of its two numbers.
    """
    for pattern, (_, _, factor) in zip(_COMPOUND, _COMPOUND_UNITS):
        m = pattern.match(s)
        if m is not None:
            big, small = Fraction(m.group(1)), Fraction(m.group(2))
            in_big = big + small / factor
            in_small = big * factor + small
            return Alt((Scalar(_fraction_text(in_big)), Scalar(_fraction_text(in_small))))
    return None


_MONTH_NAMES = ("january", "february", "march", "april", "may", "june", "july", "august",
                "september", "october", "november", "december")  # fmt: skip
_MONTH_NAME = r"([A-Za-z]{3,9})\.?"
_DATES = (
    # (pattern, order of the groups: m = month name, M = month number, d = day, y = year)
    (re.compile(rf"^{_MONTH_NAME}\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(\d{{4}}))?$"), "mdy"),
    (
        re.compile(rf"^(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH_NAME}(?:,?\s+(\d{{4}}))?$"),
        "dmy",
    ),
    (re.compile(r"^(\d{4})-(\d{1,2})-(\d{1,2})$"), "yMd"),
    (re.compile(r"^(\d{1,2})/(\d{1,2})/(\d{4})$"), "Mdy"),
)


def _date(s: str, level: int) -> Seq | None:
    """Read a date ("March 15, 2024", "15 March 2024", "2024-03-15", "3/15/2024") as
    (month, day[, year]): equal to the same date in any of these forms, never to a number.
    """  # noqa: D205
    for pattern, order in _DATES:
        m = pattern.match(s.strip())
        if m is None:
            continue
        parts = dict(zip(order.lower(), m.groups()))
        if order.count("m"):
            word = parts["m"].lower()
            full = [k for k, name in enumerate(_MONTH_NAMES) if name.startswith(word)]
            if len(full) != 1:
                return None  # "Mayday" or "Ju" is no month
            month = full[0] + 1
        else:
            month = int(parts["m"])
        day = int(parts["d"])
        if not (1 <= month <= 12 and 1 <= day <= 31):
            return None
        items = [Scalar(str(month)), Scalar(str(day))]
        if parts.get("y"):
            items.append(Scalar(str(int(parts["y"]))))
        return Seq("tuple", tuple(items), "date", "date")
    return None


def _spelled_number(s: str, level: int) -> Scalar | None:
    """Read "two thousand and five" as 2005 (before "and" could split it into a list)."""
    value = number_from_words(s)
    return None if value is None else Scalar(str(value))


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
            values.append(_scalar(m.group(1)))
        if len(values) < 2:
            return None
        tuples.append(Seq("tuple", tuple(values), "(", ")"))
    return Seq("list", _dedupe(list(tuples)))


def _relation(op: str, lhs: str, rhs: str, level: int) -> Relation:
    rhs_node: Node | None = None
    if op == "=" and (
        is_name_like(lhs.strip()) or (_is_constant(lhs) and _is_constant(rhs) and lhs.strip())
    ):
        try:
            rhs_node = _parse(rhs, level + 1)
        except AnswerRejected:
            rhs_node = None
    return Relation(op, _scalar(lhs), _scalar(rhs), rhs_node)


def _between(sides: list[str], ops: list[str], s: str) -> Node:
    """Read ``a < x <= b`` as the values of x, (a, b]; other chains stay text."""
    lo, var, hi = (p.strip() for p in sides)
    if ops[0] in ("<", "<=") and ops[1] in ("<", "<="):
        pass
    elif ops[0] in (">", ">=") and ops[1] in (">", ">="):
        lo, hi = hi, lo
        ops = [{">": "<", ">=": "<="}[ops[1]], {">": "<", ">=": "<="}[ops[0]]]
    else:
        return _scalar(s)
    if not (_is_constant(lo) and _is_constant(hi)):
        return _scalar(s)
    left = "(" if ops[0] == "<" else "["
    right = ")" if ops[1] == "<" else "]"
    interval = Seq("tuple", (_scalar(lo), _scalar(hi)), left, right)
    m = re.fullmatch(r"\|\s*([A-Za-z])\s*\|", var)
    low = parse_number(lo)
    if m and low is not None and low.value >= 0:
        # a <= |z| <= b with a >= 0: z in [-b, -a] u [a, b].
        mirror = {"(": ")", "[": "]", ")": "(", "]": "["}
        negative = Seq(
            "tuple", (_scalar(f"-({hi})"), _scalar(f"-({lo})")), mirror[right], mirror[left]
        )
        return SetOf(m.group(1), Union((negative, interval)))
    return SetOf(var, interval)


def _relation_op(s: str, lhs: str) -> str:
    rest = s[len(lhs) :]
    for op in _REL_OPS:
        if rest.startswith(op):
            return _REL_CANON.get(op, op)
    return "="


def _scalar(s: str) -> Scalar:
    s = s.strip()
    if not s or s in ("+", "-"):
        raise MalformedAnswer("an empty expression")
    percent = s.endswith("%")
    if percent:
        s = s[:-1].strip()
    if _TRIG.search(s):
        # sin 30°: the degrees are the argument's unit, converted to radians where they stand.
        s = _DEGREE_NUMBER.sub(lambda m: f"({m.group(1)}\\pi/180)", s)
    degrees = "°" in s
    s = s.replace("°", " ").strip()
    s = strip_units(s)
    s = re.sub(r"^\+\s*", "", s).replace("+-", "-").replace("--", "+")
    s = re.sub(r"^-\s+", "-", s)  # "- 2" (from \pm expansion) -> "-2", so the fast path reads it
    if not s:
        raise MalformedAnswer("an empty expression")
    if _SPACED_NUMBERS.match(s):
        # "1 2 3" is neither a number nor a product anyone writes as an answer; sympy would
        # read it as 1*2*3 = 6.
        raise MalformedAnswer("numbers separated only by spaces")
    return Scalar(s, percent, degrees)


_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![A-Za-z])")
_DEGREE_NUMBER = re.compile(r"(\d+(?:\.\d+)?)\s*°")
_SPACED_NUMBERS = re.compile(r"^-?\d+(?:\.\d+)?(?:\s+-?\d+(?:\.\d+)?)+$")


_SCALE_WORD = re.compile(r"^(.*?\d.*?)\s*(thousand|million|billion|trillion)s?$", re.IGNORECASE)
_SCALES = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12}


_CLOCK = re.compile(r"^(\d{1,2})(?::(\d{2}))?(?::\d{2})?\s*([AaPp])\.?\s?[Mm]\.?$")
_ORDINAL_NUMBER = re.compile(r"^(-?\d+)\s*(?:st|nd|rd|th)$", re.IGNORECASE)
_CENTS = re.compile(r"^(-?\d[\d,]*(?:\.\d+)?)\s*(?:cents?|¢)$", re.IGNORECASE)


def _clock_time(s: str) -> Node | None:
    """Read a 12-hour clock time ("7:30 p.m.", "12:05 AM", "7 pm") as the 24-hour pair (h, m).

    It equals the same time written on a 24-hour clock ("19:30"). An hour alone ("7 pm") also
    equals the bare hour ("7"), the way a question "at what hour" is answered.
    """
    m = _CLOCK.match(s)
    if m is None:
        return None
    hour, minutes = int(m.group(1)), m.group(2)
    if not 1 <= hour <= 12 or (minutes is not None and int(minutes) > 59):
        return None
    hour = hour % 12 + (12 if m.group(3).lower() == "p" else 0)
    pair = Seq("tuple", (Scalar(str(hour)), Scalar(minutes or "00")), ":", ":")
    return pair if minutes is not None else Alt((pair, Scalar(m.group(1))))


def _leaf(s: str) -> Node:
    """Read a leaf: a scalar, or "3 million" as 3000000 or (the question's unit) 3.

    "21st" is the number 21 (an ordinal stated as the answer); "350 cents" is 3.50 (dollars) or
    350 (the question's unit).
    """
    s = s.strip()
    m = _ORDINAL_NUMBER.match(s)
    if m is not None:
        return _scalar(m.group(1))
    spelled = number_from_words(s)
    if spelled is not None:
        return _scalar(str(spelled))
    m = _CENTS.match(s)
    if m is not None:
        cents = m.group(1).replace(",", "")
        return Alt((_scalar(str(Fraction(cents) / 100)), _scalar(cents)))
    m = _SCALE_WORD.match(s.strip())
    if m is None:
        return _scalar(s)
    exponent = _SCALES[m.group(2).lower()]
    return Alt((_scalar(f"({m.group(1)})\\times 10^{{{exponent}}}"), _scalar(m.group(1))))


_UNIT_NAMES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
)  # fmt: skip
_TENS_NAMES = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_UNITS_WORDS = {w: i for i, w in enumerate(_UNIT_NAMES)}
_TENS_WORDS = {w: 10 * i for i, w in enumerate(_TENS_NAMES, 2)}
_SCALE_WORDS = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}


def number_from_words(s: str) -> int | None:
    """Read a number written in English words ("twenty-one", "one hundred and five"), or None.

    >>> number_from_words("Two hundred and thirty-four"), number_from_words("five apples")
    (234, None)
    """
    words = re.split(r"[\s-]+", s.strip().lower().rstrip("."))
    if not words or len(words) > 12:
        return None
    negative = words[0] in ("minus", "negative")
    total = current = 0
    last = ""  # the kind of the previous word: a grammar, so "one two three" is not 6
    follows = {
        "unit": ("", "tens", "hundred", "scale", "and"),
        "teen": ("", "hundred", "scale", "and"),
        "tens": ("", "hundred", "scale", "and"),
        "hundred": ("unit", "teen"),
        "scale": ("unit", "teen", "tens", "hundred"),
        "and": ("hundred", "scale"),
    }
    for word in words[1:] if negative else words:
        if word in _UNITS_WORDS:
            kind, value = ("unit" if _UNITS_WORDS[word] < 10 else "teen"), _UNITS_WORDS[word]
        elif word in _TENS_WORDS:
            kind, value = "tens", _TENS_WORDS[word]
        elif word == "hundred":
            kind, value = "hundred", 0
        elif word in _SCALE_WORDS:
            kind, value = "scale", 0
        elif word == "and":
            kind, value = "and", 0
        else:
            return None
        if last not in follows[kind]:
            return None
        if kind == "hundred":
            current *= 100
        elif kind == "scale":
            total += current * _SCALE_WORDS[word]
            current = 0
        else:
            current += value
        last = kind
    if last in ("", "and"):
        return None
    value = total + current
    return -value if negative else value


def is_words(s: str) -> bool:
    """Tell whether ``s`` is a text answer ("Monday", "no solution"): letters only, 2+ of them.

    Two letters already count as text: read as a product, "no" would equal "on".
    """
    return bool(_WORDS_ONLY.match(s)) and bool(re.search(r"[A-Za-z]{2,}", s))


def normalize_text(s: str) -> str:
    """Return the case- and spacing-insensitive form of a text answer ("Monday", "no solution").

    Hyphens are dropped only between letters ("well-defined"): a minus sign is never spacing.

    >>> normalize_text("Non-Negative  Reals.")
    'nonnegativereals'
    """
    return re.sub(r"[\s'.]+|(?<=[A-Za-z])-(?=[A-Za-z])", "", s).lower()


def latex_text_key(s: str) -> str:
    r"""Return the comparison key of an answer no parser reads (a piecewise function, prose).

    Only spacing is dropped; signs, case, digits and operators stay, so ``-x`` never equals ``x``.

    >>> latex_text_key(r"x & x > 0 \\ -x & x \le 0") == latex_text_key(r"x&x>0\\ x&x\le0")
    False
    """
    return re.sub(r"\s+", "", s)
