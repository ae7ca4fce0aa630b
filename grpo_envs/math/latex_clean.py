r"""The clean-up stage: LaTeX and plain-text spellings of one answer brought to one form.

``clean`` drops what does not change the meaning (delimiters, ``\left``/``\right``, spacing,
``\text{}`` wrappers, currency signs) and rewrites equivalent spellings (``\dfrac``, ascii
``sqrt(2)``, unicode symbols); ``strip_units`` drops trailing unit words. The bracket scanners
(``matching_bracket``, ``max_depth``, ``split_top``) are the structure parser's primitives; the
text keys (``normalize_text``, ``latex_text_key``) compare answers no parser reads.

Every function here is linear in its input.
"""

from __future__ import annotations

import re

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


_ASCII_FUNCS = re.compile(r"(?<![\\A-Za-z])(sqrt|pi|sin|cos|tan|log|ln|exp|infty|cdot)(?![A-Za-z])")


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
    while s.startswith("{") and matching_bracket(s, 0) == len(s) - 1:
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
            end = matching_bracket(s, j)
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


def matching_bracket(s: str, i: int) -> int:
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
