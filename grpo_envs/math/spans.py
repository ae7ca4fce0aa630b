r"""Math spans and standalone numbers: the unmarked places an answer can stand.

``math_spans`` finds ``$..$``, ``\(..\)``, ``$$..$$`` and ``\[..\]`` (currency dollars are not
math); ``last_standalone_number`` is the one definition of "the last number" in grpo_envs: a digit
run that is part of a larger expression or word is none, and dates, clock times and mixed numbers
are whole tokens. ``last_math`` takes the later of the two, or a short text that is one
expression.
"""

from __future__ import annotations

import re

_OPENERS = re.compile(r"\$\$|\$|\\\[|\\\(")
_CLOSERS = {"$$": "$$", "$": "$", "\\[": "\\]", "\\(": "\\)"}
# Possessive quantifiers: a 100k-letter run must not make the search quadratic.
_PROSE = re.compile(r"\b[A-Za-z]{2,}+[\s,]++[A-Za-z]{2,}+[\s,]++[A-Za-z]{2,}")
_TEXT_ARG = re.compile(r"\\(?:text\w*|mbox|mathrm|operatorname)\s*\{[^{}]*\}|\\[A-Za-z]+")


def is_prose(content: str) -> bool:
    r"""Three words in a row outside ``\text{}``: a sentence caught between two dollar signs."""
    return bool(_PROSE.search(_TEXT_ARG.sub(" ", content)))


def math_spans(text: str) -> list[tuple[int, int, str]]:
    r"""Return the complete math spans of ``text`` as ``(start, end, content)``, in order.

    ``$..$`` and ``\(..\)`` may not cross a line; ``$$..$$`` and ``\[..\]`` may. ``\$`` is an
    escaped dollar, not a delimiter. A ``$`` pair whose content is prose, or a number followed by
    words ("$5 and gets $"), is two currency signs. Linear time: each closer search either ends
    a span or proves that no later opener of that kind can close.

    >>> [c for _, _, c in math_spans(r"so $x=1$ and \(y\) cost $5 and $6.")]
    ['x=1', 'y']
    """
    spans: list[tuple[int, int, str]] = []
    no_closer: set[str] = set()
    next_closer: dict[str, int] = {}
    i = 0
    n = len(text)
    while i < n:
        m = _OPENERS.search(text, i)
        if m is None:
            break
        opener = m.group(0)
        start = m.start()
        if opener.startswith("$") and start > 0 and text[start - 1] == "\\":
            i = start + 1  # \$ is a literal dollar
            continue
        if opener in no_closer:
            i = m.end()
            continue
        closer = _CLOSERS[opener]
        q = next_closer.get(opener, -1)
        if q < m.end():
            q = _find_closer(text, closer, m.end())
            if q < 0:
                no_closer.add(opener)
                i = m.end()
                continue
            next_closer[opener] = q
        content = text[m.end() : q]
        inline = opener in ("$", "\\(")
        if inline and "\n" in content:
            # Not math (an inline span cannot cross a line), and not prose either: its content
            # is no answer, so it is kept out of the number search too (an empty span).
            spans.append((start, q + len(closer), ""))
            i = q + len(closer)
            continue
        if opener == "$" and (is_prose(content) or re.match(r"\d[\d,.]*\s+[A-Za-z]", content)):
            i = q  # currency: the closing dollar may open the next span
            continue
        if content.strip():
            spans.append((start, q + len(closer), content))
        i = q + len(closer)
    return spans


def _find_closer(text: str, closer: str, start: int) -> int:
    r"""Return the next ``closer`` at or after ``start`` that is not an escaped ``\$``."""
    q = text.find(closer, start)
    while q > 0 and closer.startswith("$") and text[q - 1] == "\\":
        q = text.find(closer, q + 1)
    if closer == "$" and q >= 0 and text.startswith("$$", q):
        return q  # "$x$$y$": the first dollar closes
    return q


_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
# The unit pairs of one quantity: "3 hours 30 minutes", "5 feet 3 inches", "2 dollars and 50
# cents" (big unit first).
_UNIT_PAIRS = (
    (r"hours?|hrs?", r"minutes?|mins?"),
    (r"minutes?|mins?", r"seconds?|secs?"),
    (r"feet|foot|ft", r"inch(?:es)?|in"),
    (r"dollars?", r"cents?"),
    (r"pounds?|lbs?", r"ounces?|oz"),
    (r"meters?", r"centimeters?|cm"),
    (r"years?", r"months?"),
    (r"weeks?", r"days?"),
)
_UNIT_PAIR = (
    "(?:"
    + "|".join(
        rf"(?:{big})\s*,?\s*(?:and\s*)?\d+(?:\.\d+)?\s*(?:{small})\b" for big, small in _UNIT_PAIRS
    )
    + ")"
)
# Whole tokens that hold digits but are no plain number: a part of one is never the answer.
# Dates ("March 15, 2024", "15 March 2024", "2024-03-15", "3/15/2024"), clock times ("7:30 a.m.",
# "19:45") and mixed numbers ("2 1/2").
WHOLE_TOKEN = re.compile(
    rf"\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?\b"
    r"|\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?(?!\d)(?:\s*[AaPp]\.?\s?[Mm]\b\.?)?"
    r"|\b\d{1,2}\s*[AaPp]\.?\s?[Mm]\.?(?![A-Za-z])"
    r"|-?\b\d+\s+\d+\s*/\s*[1-9]\d*\b(?!\s*[/.,]\d)"
    # "3 hours and 30 minutes", "5 feet 3 inches", "2 dollars and 50 cents": one quantity.
    rf"|\b\d+(?:\.\d+)?\s*{_UNIT_PAIR}"
    # A point or tuple of numbers: "(3, 4)", "[1, 2]".
    r"|[(\[]\s*-?\d+(?:\.\d+)?(?:\s*,\s*-?\d+(?:\.\d+)?)+\s*[)\]]"
    # "all real numbers except 3 and 5": the numbers are the holes of the answer, not it.
    r"|\ball\s+real\s+numbers?\s+(?:except(?:\s+for)?|other\s+than|but)\s+-?\d+(?:\.\d+)?"
    r"(?:\s*(?:,\s*and|,|and|or)\s*-?\d+(?:\.\d+)?)*",
    re.IGNORECASE,
)
_ORDINAL_TOKEN = re.compile(r"\d(?:st|nd|rd|th)\b", re.IGNORECASE)
# A number token: thousands groups, a decimal point or a decimal comma ("2,74", "1000,99").
NUMBER_TOKEN = re.compile(
    r"-?(?:\d+\s*/\s*[1-9]\d*(?!\d|[.,]\d)|\d{1,3}(?:,\d{3})+(?:\.\d+)?"
    r"|\d{1,3}(?:[ \u2009\u202f]\d{3})+(?!\d|[.,]\d)|\d+(?:[.,]\d+)?|\.\d+)"
)
_GLUED_UNITS = {"", "cm", "mm", "km", "m", "kg", "g", "mg", "ml", "l", "s", "h", "ft", "in", "mi",
                "m²", "cm²", "m³", "cm³", "km²", "€", "£", "$", "%", "°"}  # fmt: skip
_EXPR_BEFORE = set("^_{/\\+*×·÷=<>|.,-") | set("0123456789")
_OPERATORS = set("+*×·÷/^")
_EXPR_AFTER = set("^_{}/\\*×·÷+=<>|")


def last_standalone_number(region: str) -> str | None:
    r"""Return the last number that stands alone in ``region``, or None.

    A digit run glued to a letter (``AZYUK2A``, ``x2``), inside braces or a fraction
    (``\frac{1+\sqrt5}{2}``), an exponent or subscript (``2^{10}``, ``a_3``), or joined to an
    operator (``3+4``) is part of a larger expression, not an answer. Glued units ("5cm",
    "1,000.99m²", "12€") are allowed. Dates, clock times and mixed numbers are whole tokens,
    returned whole ("at 7:30 a.m.", "2 1/2 liters"); an ordinal ("the 21st term") labels
    something and is not an answer at all.

    This is the one definition of "the last number" in grpo_envs: the integer environments'
    loose extraction uses it too.

    >>> last_standalone_number("it is 1,000.99m² today")
    '1,000.99'
    >>> last_standalone_number(r"$2^{10}$ and AZYUK2A") is None
    True
    >>> last_standalone_number("she pours 2 1/2 liters at 7:30 a.m.")
    '7:30 a.m.'
    """
    wholes = list(WHOLE_TOKEN.finditer(region))
    best: re.Match[str] | None = None
    w = 0  # both scans move forward only: linear time
    for m in NUMBER_TOKEN.finditer(region):
        a = m.start()
        while w < len(wholes) and wholes[w].end() <= a:
            w += 1
        if w < len(wholes) and wholes[w].start() <= a + 1:
            best = wholes[w]  # a digit inside a date, time or mixed number: the whole token
        elif standalone(region, m):
            best = m
    if best is None or hedged(region, best.start()):
        return None
    return best.group(0).strip().rstrip(",")


def standalone(region: str, m: re.Match[str]) -> bool:
    """Tell whether the number token ``m`` stands alone (see ``last_standalone_number``)."""
    a, b = m.start(), m.end()
    before = region[a - 1] if a > 0 else " "
    if before.isalpha() or (before in _EXPR_BEFORE and before not in "=-"):
        return False
    if before == "-" and (a < 2 or not region[a - 2].isspace()):
        return False
    if before == " " and region[max(0, a - 8) : a].rstrip()[-1:] in _OPERATORS:
        return False  # "3 + 4": an operand, not a result
    if _ORDINAL_TOKEN.match(region, b - 1) and region[max(0, a - 8) : a].rstrip()[-1:] != "=":
        return False  # "the 21st term" labels; "12/2 = 6th" computes the answer
    j = b
    while j < len(region) and (region[j].isalpha() or region[j] in "²³€£$%°"):
        j += 1
    if region[b:j].lower() not in _GLUED_UNITS and not _ORDINAL_TOKEN.match(region, b - 1):
        return False
    k = j
    while k < len(region) and region[k] == " ":
        k += 1
    after = region[k] if k < len(region) else " "
    if after in _EXPR_AFTER or (after == "-" and region[k + 1 : k + 2].isdigit()):
        return False
    return not (region[b:j] == "" and after == "!" and region[k + 1 : k + 2] not in ("", " ", "\n"))


_HEDGE = re.compile(
    r"\b(?:not|cannot|can't|isn't|is\s+not|never|no|neither|nor|except|without|between|"
    r"unless|wrong|incorrect|instead\s+of|rather\s+than)\b",
    re.IGNORECASE,
)


def hedged(region: str, pos: int) -> bool:
    """Tell whether the sentence holding ``pos`` negates or brackets its number.

    "The answer cannot be 5", "it is not 5", "between 5 and 6": the number there is not stated
    as the answer, so the fallback takes none rather than pay for a guess.
    """
    start = max(region.rfind(". ", 0, pos), region.rfind("\n", 0, pos), region.rfind("? ", 0, pos))
    hedges = list(_HEDGE.finditer(region, start + 1, pos))
    if not hedges:
        return False
    last = hedges[-1]
    if last.group(0).lower() == "between":
        return True
    # "not 10, which is 1,000.99": the negation belongs to an earlier number or clause.
    between = region[last.end() : pos]
    return not re.search(r"\d|[,;]|\b(?:which|but|it's|it\s+is|so|instead|rather)\b", between)


UNIT_OR_LINK_WORDS = {"and", "or", "percent", "percentage", "pct", "cents", "cent"}


def _is_bare_expression(region: str) -> bool:
    r"""Tell whether a short text is one expression, undelimited (``\frac{10}{9}``, ``28 pct``)."""
    if len(region) > 300:
        return False
    plain = re.sub(r"\\(?:begin|end)\s*\{[^{}]*\}|\\[A-Za-z]+", " ", region)
    words = [w for w in re.findall(r"[A-Za-z]{2,}", plain) if w.lower() not in UNIT_OR_LINK_WORDS]
    # One short word may be a product of variables ("2xy") or a unit; more is a sentence.
    return len(words) <= 1 and all(len(w) <= 3 for w in words)


def last_math(region: str) -> str | None:
    """Return the later of the last math span and the last standalone number outside spans."""
    return whole_text_answer(region) or last_value(region)


def whole_text_answer(region: str) -> str | None:
    """Return a short text that is one expression or one or two words, whole; else None."""
    if len(region) > 300 or math_spans(region):
        return None
    if _is_bare_expression(region) and re.search(r"\d|\\", region):
        return region.strip()  # the whole text is the answer ("(1,4.5)", "\\frac{10}{9}")
    if re.fullmatch(r"\s*[A-Za-z]+(?: [A-Za-z]+)?\s*\.?\s*", region):
        return region.strip().rstrip(".")  # a one- or two-word answer ("Monday", "odd")
    return None


def last_value(region: str) -> str | None:
    """Return the later of the last math span and the last standalone number outside spans."""
    spans = math_spans(region)
    tail_from = spans[-1][1] if spans else 0
    number = last_standalone_number(blank_spans(region, spans)[tail_from:])
    if number is not None:
        return number
    for _, _, content in reversed(spans):
        if content:
            return content.strip()
        return None  # the last span was broken
    return None


def blank_spans(region: str, spans: list[tuple[int, int, str]]) -> str:
    """``region`` with every math span replaced by spaces (offsets kept)."""
    if not spans:
        return region
    parts = []
    prev = 0
    for a, b, _ in spans:
        parts.append(region[prev:a])
        parts.append(" " * (b - a))
        prev = b
    parts.append(region[prev:])
    return "".join(parts)
