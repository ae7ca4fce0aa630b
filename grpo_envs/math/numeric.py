r"""The numbers stage: plain numbers read exactly (``Fraction``), and compared.

``parse_number`` reads integers, decimals, thousands separators, fractions, mixed numbers,
scientific notation and repeating decimals; ``numbers_equal`` is exact, except that a decimal with
enough digits stands for a value with no finite expansion when it is that value rounded;
``tower_log10`` sizes a power tower without computing it; ``number_from_words`` reads English
number words. No sympy: a number never leaves the caller's process.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from grpo_envs.math.latex_clean import matching_bracket

THOUSANDS = re.compile(r"^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")


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
    if THOUSANDS.match(s):
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
    if rest.startswith("{") and matching_bracket(rest, 0) == len(rest) - 1:
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


def fraction_text(x: Fraction) -> str:
    """Write ``x`` as an integer or ``a/b``, as the parser reads it back."""
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


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
