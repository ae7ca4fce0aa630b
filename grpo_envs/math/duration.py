r"""Durations: the same length of time written in other units or on a clock face.

``1.5`` hours, ``90`` minutes, "1 hour 30 minutes", ``1:30`` hours and ``1:30`` are one duration.
The verifier does not see the question, so the gold answer gives the context: only a gold with an
explicit unit of time (``1.5 \text{ hours}``, "90 minutes", "2 hours 15 minutes") is a duration.
Against such a gold:

* an answer with an explicit unit of time is compared as a duration, exactly in seconds, so "90
  minutes" equals "1.5 hours" and "90 hours" does not equal "90 minutes";
* a bare clock-style answer ``h:mm`` (``h:mm:ss``) is hours and minutes (and seconds), unless
  the completion states it as a time of day ("at 1:30", "by 1:30", or with a.m./p.m., which is
  no bare clock form);
* anything else (a bare number, prose) is compared as usual (a dropped unit: ``1.5`` answers
  "1.5 hours").

A clock form is never read as minutes and seconds (``4:05`` is 4 hours 5 minutes), and months and
years, which have no fixed length, are no unit of time here. Exact arithmetic throughout:
``1:30`` is not 1.3 hours, ``1:50`` is not 1.5 hours, 20 minutes is not 0.33 hours.
"""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_envs.math.latex_clean import clean

#: Units of time with a fixed length, in seconds. "m" and "s" alone are left out: "5 m" is more
#: often metres than minutes, and a bare "s" follows plurals in prose.
_UNIT_SECONDS = (
    (r"weeks?|wks?", 604_800),
    (r"days?", 86_400),
    (r"hours?|hrs?|h", 3_600),
    (r"minutes?|mins?", 60),
    (r"seconds?|secs?", 1),
)
_NUMBER = r"(\d+(?:\.\d+)?|\d+/\d+)"
_TERM = re.compile(
    rf"{_NUMBER}\s*({'|'.join(f'(?:{u})' for u, _ in _UNIT_SECONDS)})\.?(?![A-Za-z])",
    re.IGNORECASE,
)
_JOINER = re.compile(r"^\s*(?:,|and|,\s*and)?\s*$", re.IGNORECASE)
_CLOCK_FORM = re.compile(r"^(\d{1,3}):([0-5]\d)(?::([0-5]\d))?$")
_CLOCK_WITH_UNIT = re.compile(r"^(\d{1,3}):([0-5]\d)(?::([0-5]\d))?\s*([A-Za-z]+)\.?$")
#: The word before a clock form that makes it a time of day, not a length of time.
_TIME_OF_DAY = r"\b(?:at|by|until|till|from|before|after|since|around)(?:\s|[$(\[{]|\\[A-Za-z]*)*"


def _unit_seconds(word: str) -> int | None:
    for pattern, seconds in _UNIT_SECONDS:
        if re.fullmatch(pattern, word, re.IGNORECASE):
            return seconds
    return None


def duration_seconds(answer: str) -> Fraction | None:
    r"""Read an answer with an explicit unit of time as its length in seconds (else None).

    >>> duration_seconds(r"1.5 \text{ hours}"), duration_seconds("2 hours and 15 minutes")
    (Fraction(5400, 1), Fraction(8100, 1))
    >>> duration_seconds("1:30 h"), duration_seconds("1:30"), duration_seconds("5 m")
    (Fraction(5400, 1), None, None)
    """
    s = clean(answer)
    clock = _CLOCK_WITH_UNIT.match(s)
    if clock is not None:
        unit = _unit_seconds(clock.group(4))
        if unit is None or unit < 60:
            return None  # "1:30 s" is no clock form
        # h:mm in hours, m:ss in minutes: the unit names the first field.
        return _clock_fields(clock.groups()[:3]) * Fraction(unit, 3_600)
    total, last_unit, at = Fraction(0), None, 0
    for term in _TERM.finditer(s):
        if not _JOINER.match(s[at : term.start()]):
            return None
        unit = _unit_seconds(term.group(2))
        if unit is None or (last_unit is not None and unit >= last_unit):
            return None  # "30 minutes 1 hour": no one duration
        total += Fraction(term.group(1)) * unit
        last_unit, at = unit, term.end()
    return total if last_unit is not None and not s[at:].strip() else None


def clock_duration(answer: str, completion: str) -> Fraction | None:
    """Read a bare ``h:mm`` or ``h:mm:ss`` as a length of time in seconds (else None).

    None when the completion writes it as a time of day ("at 1:30").

    >>> clock_duration("1:30", "It takes 1:30."), clock_duration("1:30", "We meet at 1:30.")
    (Fraction(5400, 1), None)
    """
    s = clean(answer)
    m = _CLOCK_FORM.match(s)
    if m is None or re.search(_TIME_OF_DAY + re.escape(s), completion, re.IGNORECASE):
        return None
    return _clock_fields(m.groups())


def _clock_fields(fields: tuple[str | None, ...]) -> Fraction:
    hours, minutes, seconds = (int(f) if f else 0 for f in fields)
    return Fraction(hours * 3_600 + minutes * 60 + seconds)


def same_duration(gold: str, answer: str, completion: str) -> bool | None:
    r"""Decide a duration gold against an answer: True/False, or None when it is no duration.

    >>> same_duration("90 minutes", r"1.5 \text{ hours}", "")
    True
    >>> same_duration("1.5 hours", "1:30", "It takes 1:30."), same_duration("1:30", "1.5 h", "")
    (True, None)
    >>> same_duration("1.5 hours", "1:50", ""), same_duration("90 minutes", "90 hours", "")
    (False, False)
    >>> same_duration("1.5", "1:30", "") is None, same_duration("1.5 hours", "1.5", "") is None
    (True, True)
    """
    gold_seconds = duration_seconds(gold)
    if gold_seconds is None:
        return None
    seconds = duration_seconds(answer)
    if seconds is None:
        seconds = clock_duration(answer, completion)
    return None if seconds is None else seconds == gold_seconds
