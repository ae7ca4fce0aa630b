r"""The leaves of the answer tree: one value each, with its unit, sign and scale read.

``scalar`` makes a leaf (percent and degree signs noted, units stripped, ``+-`` signs folded);
``leaf`` also reads ordinals ("21st"), number words, cents and scale words ("3 million"). The
everyday quantities here (a clock time, a date, one quantity in two units) are whole values too:
each is read as one tuple or as its readings (``Alt``), never split into its numbers.
"""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_envs.math.answer_tree import Alt, MalformedAnswer, Node, Scalar, Seq
from grpo_envs.math.latex_clean import strip_units
from grpo_envs.math.numeric import fraction_text, number_from_words

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


def compound_quantity(s: str, level: int) -> Alt | None:
    """Read "1 hour 30 minutes" as 1.5 (hours) or 90 (minutes), "5 feet 3 inches" as 5.25 or 63.

    One quantity in two units equals its value in either unit, never one of its two numbers.
    """
    for pattern, (_, _, factor) in zip(_COMPOUND, _COMPOUND_UNITS):
        m = pattern.match(s)
        if m is not None:
            big, small = Fraction(m.group(1)), Fraction(m.group(2))
            in_big = big + small / factor
            in_small = big * factor + small
            return Alt((Scalar(fraction_text(in_big)), Scalar(fraction_text(in_small))))
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


def date(s: str, level: int) -> Seq | None:
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


def spelled_number(s: str, level: int) -> Scalar | None:
    """Read "two thousand and five" as 2005 (before "and" could split it into a list)."""
    value = number_from_words(s)
    return None if value is None else Scalar(str(value))


def scalar(s: str) -> Scalar:
    """Make a leaf of ``s``: a percent sign, a degree sign and trailing units noted or dropped.

    Raises:
        MalformedAnswer: nothing is left, or only numbers separated by spaces ("1 2 3").
    """
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


def clock_time(s: str) -> Node | None:
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


def leaf(s: str) -> Node:
    """Read a leaf: a scalar, or "3 million" as 3000000 or (the question's unit) 3.

    "21st" is the number 21 (an ordinal stated as the answer); "350 cents" is 3.50 (dollars) or
    350 (the question's unit).
    """
    s = s.strip()
    m = _ORDINAL_NUMBER.match(s)
    if m is not None:
        return scalar(m.group(1))
    spelled = number_from_words(s)
    if spelled is not None:
        return scalar(str(spelled))
    m = _CENTS.match(s)
    if m is not None:
        cents = m.group(1).replace(",", "")
        return Alt((scalar(str(Fraction(cents) / 100)), scalar(cents)))
    m = _SCALE_WORD.match(s.strip())
    if m is None:
        return scalar(s)
    exponent = _SCALES[m.group(2).lower()]
    return Alt((scalar(f"({m.group(1)})\\times 10^{{{exponent}}}"), scalar(m.group(1))))
