r"""Find the final answer in a model completion (or in a gold solution).

Pure Python and linear-time on purpose: this runs in the caller's process on every completion,
so it must not be able to hang. Every scan below is a single pass (``rfind``, a brace matcher or a
regex without nested quantifiers), and completions longer than ``MAX_SCAN_CHARS`` are scanned
from their tail only.

Two modes, as in lm-eval's GSM8K task (strict-match vs flexible-extract):

* strict: only the formats a prompt asks for -- ``<answer>...</answer>``, the last ``\boxed{}`` /
  ``\fbox{}`` / ``\framebox{}``, or ``#### N``.
* flexible (default): also "The (final) answer is ...", "Answer: ..." (and the same phrase in
  Spanish, French, German, Portuguese, Italian, Russian, Chinese, Japanese, Korean, Vietnamese,
  Indonesian and Turkish), a bold final answer, a short text after ``</think>``, then the *final
  stated answer* (below).

Both modes: a ``<think>`` block that is never closed has no answer (the model never got to one);
GLM's ``<|begin_of_box|>...<|end_of_box|>`` is a box; a sentence or an approximation sign inside a
box (``\boxed{\text{The answer is } 5}``, ``\boxed{\approx 5}``) is reduced to its answer.

**Loose mode's precedence** (flexible mode; the one statement of the rule). No finish reason
reaches the scorer (it gets the completion's text only), so a cut-off completion is recognised
by its text. Which statement is final:

1. *A marked answer* (box, answer tag, ``####``, "The answer is ...") is the answer, subject to
   what the text says after it (``settle_marked_answer``); without one, the *final stated
   answer* below.
2. *A correction* supersedes an earlier answer: a retraction ("oops", "I made an error", "that is
   wrong", "let me recount", "recalculating", "actually, it is") or a second thought ("wait",
   "hmm", "but", "however", "counted twice") followed by a value that concludes ("so the total
   is 11", "12 - 1 = 11"): the last stated value wins. A retraction with no new value leaves no
   answer; a second thought with none ("Wait, let me double-check: 2 + 3 = 5. Yes.") leaves the
   answer standing, unless it announces a correction it does not make ("But we must exclude the
   blocked paths"): then no answer.
3. *A supposition* is a guess at the answer or a trial value ("Suppose the answer is
   \boxed{5}", "If the answer were 5", "Let's try 7", "Assume x = 3"; not a premise such as
   "Assuming each box holds 12" nor an evaluation "If x = 3, then ..."). It is an answer only
   when the text confirms it ("which works", "checks out", a check mark) and nothing refutes it
   ("!=", "contradiction", "doesn't work", "too big", "not 12"); its working ("Then 5 x 3 =
   15") is never the answer; a later conclusion ("So the answer is 4") is. Strict mode drops
   only a box the text refutes.
4. *A check* after the answer does not replace it: a sentence that checks or illustrates
   ("Check:", "Let's verify", "double-check", "as a check", "sanity check", "Plugging back in
   ... which matches", "For a smaller case, n = 3 gives 6") opens a check block that runs to the
   next new conclusion ("So ...", "Therefore ...", "The answer is ..."); its numbers are not the
   answer. A substitution is a check only when it says so; "substituting j = 20 into e = 9j, we
   get e = 180" solves for the next unknown.
5. *A hedge* gives no single answer: a sentence offering several candidates ("10, 11, or 12",
   "either 3 or 4", "the possible values are 2 and 3", "it could be 4", "about 10 to 12",
   "between 3 and 5"), an alternative after a marked answer ("The answer is 12. Or maybe 13.")
   or boxes joined by "either ... or". A later sentence that picks one ("... so the answer is
   12") resolves it. Not hedges: one value in two forms ("0.60 or 60%") and a list that goes on
   computing ("2, or 16 * 1/2 = 8").
6. *A cut-off text* (ending in an operator or a word such as "by", "the", "and") keeps only an
   answer it named before the cut ("The answer is 8. Now the") with no second thought after
   it; a last sentence that starts a correction and states no value ("But we must exclude the
   paths through the corner, which number") leaves no answer, so the number before it (an
   intermediate) is never taken. A text may end without a full stop and still be whole ("So
   the total is 3 + 4 = 7").

*The final stated answer* (``final_statement``): the sentences are read from the end, rules 2-6
applied as they come; closing remarks ("I hope it is correct"), sentences without a value and
check blocks are skipped; a sentence that announces work it does not do ("Now we need to
multiply 4 by 3") is no answer. The first remaining sentence states the answer: the result of
its last computation (the number after its last ``=``: "9 + 6 = 15 liters out of the 24
liters" states 15), or that result restated ("= 16.75 bags, meaning 17 bags", "= 33.333%, which
rounds to 33%"), unless the computation goes on in words ("= 30 eggs, plus 2 spares": then the
last number); without a computation, its last math span or standalone number, else the last
number written in words ("twelve"; "one" alone is a pronoun). An ordinal counts only as a
computed result ("12/2 = 6th"), never as a label ("on the 13th day"). A "!" after a number is a
factorial ("5! = 120"), not the end of a sentence.

>>> final_statement("There are 5! = 120 ways. Check with 3 people: 3! = 6 ways.")
'120'
>>> final_statement("Possible values are 10, 11, or 12.") is None
True
>>> final_statement("Suppose it is 5. Then 5 * 3 = 15 != 12. So it is 4.")
'4'
>>> final_statement("The paths number 210. But we must exclude the blocked ones, which") is None
True
>>> extract_answer("The answer is 12. Hmm, but the corner was counted twice: it is 11.")
'11'

A standalone number is never cut out of an expression or a word: in ``\frac{1+\sqrt5}{2}``,
``2^{10}``, ``x_2`` or ``AZYUK2A`` there is none (a digit run touching a letter, a brace, ``^``,
``_``, ``/`` or a backslash command is part of something larger). Dates ("March 15, 2024"),
clock times ("7:30 a.m."), mixed numbers ("2 1/2") and "all real numbers except 3" are whole
tokens, taken whole or not at all; an ordinal ("the 21st term") labels something and is never
the answer. Inline spans (``$``, ``\(``) may not cross a line, display spans may; a ``$`` pair
around prose ("costs $5 and gets $") is read as two currency signs, not as math. A number its
sentence negates or brackets ("the answer cannot be 5", "between 5 and 6") is not taken. A
completion that is one bare expression (``\frac{10}{9}``, ``(1, 4.5)``, a matrix) is taken whole.

Several boxes in a row, separated only by commas, "and"/"or", spacing or a short label
(``\boxed{1}, \boxed{2}``; ``\boxed{(2, 2)} \text{ and } \boxed{(6, 2)}``) are one answer, the
list of their contents. That is also the conservative reading: a list never equals a single
gold value. ``find_last_boxed`` and ``last_standalone_number`` are the one definition of "the last
box" and "the last number" in grpo_envs (the format reward and the integer environments use
them).

Why one module over 500 lines: the extraction order (boxes, answer phrases, math spans,
standalone numbers, the final statement, listed options) is one policy, read top to bottom as
small single-pass scans.
"""

from __future__ import annotations

import itertools
import re

#: Completions longer than this are scanned from their last MAX_SCAN_CHARS characters only: a
#: final answer lives at the end, and this bounds the work a 1 MB completion can cause.
MAX_SCAN_CHARS = 100_000
#: An extracted answer longer than this is not an answer (it is a paragraph).
MAX_ANSWER_CHARS = 1_000

_BOX_COMMANDS = ("\\boxed", "\\fbox", "\\framebox")
_THINK_START = "<think>"
_BOX_TOKEN_OPEN, _BOX_TOKEN_CLOSE = "<|begin_of_box|>", "<|end_of_box|>"
_THINK_END = "</think>"
_MAX_BOX_TRIES = 3
#: Loose mode reads at most this many final sentences for the final stated answer.
_MAX_SENTENCES = 40
#: ... within at most this many final characters.
_STATEMENT_SCAN_CHARS = 4_000
_HASHES = re.compile(r"####\s*([^\n]*)")
# "The final answer is", "the answer is:", "Answer:", "Final Answer:" (case-insensitive). The
# captured tail is cut to one sentence by _trim_sentence.
# The same phrase in the languages models answer in: Spanish, French, German, Portuguese,
# Italian, Russian, Chinese, Japanese, Korean, Vietnamese, Indonesian, Turkish.
_ANSWER_WORDS = (
    r"final\s+answer|answer|(?:la\s+)?respuesta(?:\s+final)?|(?:la\s+)?r[ée]ponse(?:\s+finale)?"
    r"|(?:die\s+)?(?:endg[üu]ltige\s+)?(?:antwort|l[öo]sung)|(?:a\s+)?resposta(?:\s+final)?"
    r"|(?:la\s+)?risposta(?:\s+finale)?|(?:окончательный\s+)?ответ|(?:最终|最後の?)?答案|答え"
    r"|정답|đáp\s+án|jawaban(?:\s+akhir)?|cevap"
)
_ANSWER_COPULA = r"(?:ist|est|lautet|is|es|adalah|равен)(?![^\W\d_])|é|è|:|：|=|是|为|為|は|은|는|—"
_ANSWER_IS_PATTERN = re.compile(
    rf"(?:{_ANSWER_WORDS})\s*(?:{_ANSWER_COPULA})\s*(?:is\s*)?[:：]?\s*([^\n]*)", re.IGNORECASE
)
_ANSWER_STEMS = ("answer", "respuesta", "ponse", "antwort", "sung", "resposta", "risposta",
                 "ответ", "答案", "答え", "정답", "đáp", "jawaban", "cevap")  # fmt: skip


class _AnswerPhrase:
    """``_ANSWER_IS_PATTERN`` behind a substring check: most texts hold none of the stems, and a
    regex alternation of twelve languages is tried at every position of the text.
    """  # noqa: D205

    @staticmethod
    def _may_match(text: str) -> bool:
        lower = text.lower()
        return any(stem in lower for stem in _ANSWER_STEMS)

    def search(self, text: str) -> re.Match[str] | None:
        return _ANSWER_IS_PATTERN.search(text) if self._may_match(text) else None

    def finditer(self, text: str) -> list[re.Match[str]]:
        return list(_ANSWER_IS_PATTERN.finditer(text)) if self._may_match(text) else []


_ANSWER_IS = _AnswerPhrase()
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{([^{}]*)\}")
_BOLD = re.compile(r"\*\*([^*\n]{1,200}?)\*\*")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_HAS_DIGIT_OR_MATH = re.compile(r"\d|\\frac|\\sqrt|\\pi|^\(?[A-J]\)?$")
_LONG_WORD = re.compile(r"[A-Za-z]{4,}")
_COMMANDS = re.compile(r"\\[A-Za-z]+")


def find_last_boxed(text: str) -> str | None:
    r"""Return the content of the last complete, non-empty box, stripped, or None.

    The one definition of "the last ``\boxed{}``" in grpo_envs (the format reward and the integer
    environments use it too). A box is ``\boxed``, ``\fbox`` or ``\framebox`` (not
    ``\boxedx``) with a braced argument (nested braces kept, ``\{``/``\}`` are no braces) or one
    bare token (``\boxed 5``, as LaTeX renders it). An empty box is no box; an unclosed last box
    (a truncated completion) falls back to an earlier complete one, a few times at most.

    >>> find_last_boxed(r"so \boxed{\frac{1}{2}} and \boxed{3}")
    '3'
    >>> find_last_boxed(r"\boxed{3} then an unclosed \boxed{4") , find_last_boxed(r"\boxed{ }")
    ('3', None)
    """
    spans = _box_spans(text, limit=1)
    return spans[-1][2].strip() if spans else None


_GAP_WORD = re.compile(r"[A-Za-z]+")
_GAP_SEPARATORS = re.compile(
    r"\\text\s*\{[^{}]{0,40}\}|\\(?:quad|qquad|[,;:! ]|\(|\)|\[|\])|\$+|[\s,;&+]"
)
# Words that may sit between two boxes of one answer ("\boxed{1} papers and \boxed{2} bins").
# Anything that reads as a verdict or a sentence ("is", "so", "answer") ends the run.
_GAP_STOP = {"is", "are", "was", "were", "not", "but", "so", "thus", "hence", "therefore",
             "answer", "final", "wrong", "correct", "check", "then", "wait", "be",
             "the"}  # fmt: skip


def _box_spans(text: str, limit: int = 64) -> list[tuple[int, int, str]]:
    """Return up to ``limit`` complete boxes ``(start, end, content)``, the last ones, in order."""
    spans: list[tuple[int, int, str]] = []
    end = len(text)
    failures = 0  # an unclosed box costs a scan to the end: only a few are tried
    while len(spans) < limit and failures < _MAX_BOX_TRIES:
        best, best_cmd = -1, ""
        for cmd in _BOX_COMMANDS:
            pos = text.rfind(cmd, 0, end)
            if pos > best:
                best, best_cmd = pos, cmd
        if best < 0:
            break
        read = _read_box(text, best + len(best_cmd))
        if read is None:
            failures += 1
        elif read[0].strip() and (not spans or read[1] <= spans[0][0]):
            spans.insert(0, (best, read[1], read[0]))
        end = best
    return spans


def _joinable_gap(gap: str) -> bool:
    """Tell whether the text between two boxes only separates them (commas, "and", spacing)."""
    rest = _GAP_SEPARATORS.sub(" ", gap.rstrip("\\"))
    # "y_1 = \boxed{..} and y_2 = \boxed{..}": a variable's label before the next box.
    rest = re.sub(r"[A-Za-z](?:_\{?\w+\}?)?\s*=\s*$", " ", rest)
    words = _GAP_WORD.findall(rest)
    if re.search(r"[^A-Za-z\s()]", rest) or len(words) > 4:
        return False
    return not any(w.lower() in _GAP_STOP for w in words)


def find_boxed_answer(text: str) -> str | None:
    r"""Return the last box's content, or the comma list of a run of boxes that form one answer.

    >>> find_boxed_answer(r"so \boxed{1} and \boxed{-2}.")
    '1 and -2'
    >>> find_boxed_answer(r"\boxed{4} is wrong. The answer is \boxed{5}")
    '5'
    """
    spans = _box_spans(text)
    if not spans:
        return None
    run = [spans[-1]]
    for prev in reversed(spans[:-1]):
        if not _joinable_gap(text[prev[1] : run[0][0]]):
            break
        run.insert(0, prev)
    if len(run) == 1:
        return run[0][2]
    # Joined with "and": several boxes are a list of solutions, whose order does not matter.
    return " and ".join(c.strip() for _, _, c in run)


def _read_box(text: str, start: int) -> tuple[str, int] | None:
    """Return the box argument at ``start`` and the index just after it (None: no argument).

    The argument is the braced group after optional spaces, or one bare token.
    """
    i = start
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i >= n:
        return None
    if text[i] != "{":
        # "\boxed 5" / "\boxed5": LaTeX takes one token. "\boxedx" is not a box at all.
        m = re.match(r"\s*([^\s${}]+)", text[start : start + 200])
        if m is None or text[start : start + 1].isalpha():
            return None
        return m.group(1), start + m.end()
    depth = 0
    for j in range(i, n):
        ch = text[j]
        if ch == "{" and text[j - 1] != "\\":
            depth += 1
        elif ch == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j], j + 1
    return None


def _last_answer_tag(region: str) -> str | None:
    """Return the text inside the last ``<answer>...</answer>`` pair (case-insensitive), or None.

    Two ``rfind`` calls rather than a lazy regex: ``<answer>(.*?)</answer>`` rescans to the end
    for every unclosed ``<answer>``, which is quadratic on a hostile completion.
    """
    lower = region.lower()
    close = lower.rfind("</answer>")
    if close < 0:
        return None
    open_ = lower.rfind("<answer>", 0, close)
    if open_ < 0:
        return None
    return region[open_ + len("<answer>") : close].strip()


def _strict_in(region: str, *, strict: bool = True) -> str | None:
    """Return the answer in one of the required formats, in priority order, or None.

    With ``strict=False``, a sentence inside ``<answer>`` tags ("The answer is 2.") is reduced to
    its answer by the flexible rules.
    """
    inner = _last_answer_tag(region)
    if inner is not None:
        boxed = find_boxed_answer(inner)
        if boxed is not None:
            return boxed
        inner_hashes = _HASHES.findall(inner)
        if inner_hashes:
            return inner_hashes[-1].strip()
        if not strict and _LONG_WORD.search(_COMMANDS.sub(" ", inner)):
            return _flexible_in(inner) or _last_math(inner) or inner
        return inner
    boxed = find_boxed_answer(region)
    if boxed is not None:
        return _box_sentence(boxed)
    hashes = _HASHES.findall(region)
    if hashes:
        return hashes[-1].strip()
    return None


def _box_sentence(content: str) -> str:
    r"""Reduce a sentence inside a box (``\boxed{\text{The answer is } 5}``) to its answer."""
    plain = _TEXT_WRAPPER.sub(r" \1 ", content)
    if _ANSWER_IS.search(plain):
        found = _flexible_in(plain)
        if found:
            return found
    return content


def _trim_sentence(tail: str) -> str:
    """Cut "72 apples. So she ..." to the answer: the inline math, or up to the sentence end."""
    tail = tail.strip().lstrip(":").strip()
    tail = re.sub(r'^(?:\\?["\'])+', "", tail)  # "the answer is \"$12$ and $13$\""
    joined = _joined_spans(tail)
    if joined is not None:
        return joined
    for open_, close in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if tail.startswith(open_):
            # The first closing delimiter that is not an escaped dollar (\$).
            end = tail.find(close, len(open_))
            while end > 0 and close == "$" and tail[end - 1] == "\\":
                end = tail.find(close, end + 1)
            if end > 0:
                return tail[len(open_) : end]
    # A full stop / semicolon followed by a space or the end, but not a decimal point.
    m = re.search(r"(?<!\d)[.;](?:\s|$)|(?<=\d)[.;](?:\s|$)|,\s+(?=[A-Za-z]{2,})", tail)
    if m:
        tail = tail[: m.start()]
    return tail.strip().rstrip(".").strip()


def _joined_spans(tail: str) -> str | None:
    """Join "$12$ and $13$." into "12 and 13": spans linked only by "and", "or" or commas."""
    spans = math_spans(tail)
    if len(spans) < 2 or spans[0][0] != 0:
        return None
    parts = [spans[0][2]]
    for (_, end, _), (start, _, content) in itertools.pairwise(spans):
        link = tail[end:start].strip().strip('"\\').strip()
        if link not in ("and", "or", ",", ", and", ", or"):
            break
        parts.append(content)
    if len(parts) < 2:
        return None
    return " and ".join(p.strip() for p in parts)


_COPULA = re.compile(r"\s(?:is|are|equals|was|be|=)\s", re.IGNORECASE)


def _answer_of_sentence(sentence: str) -> str:
    """Reduce "The largest $n$ is 34" to "34"; a sentence that is already math stays whole."""
    outside = _blank_spans(sentence, math_spans(sentence))
    words = re.findall(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+(?:\s*\{[^{}]*\})?", " ", outside))
    if all(w.lower() in _UNIT_OR_LINK_WORDS for w in words):
        return sentence
    last = None
    for last in _COPULA.finditer(sentence):  # noqa: B007 - the final one
        pass
    if last is not None:
        rest = _trim_sentence(sentence[last.end() :])
        if rest and not _is_prose(rest):
            return rest
    return _last_math(sentence) or sentence


def _flexible_in(region: str) -> str | None:
    """Return the answer in a free-text format ("The answer is ...", bold), or None."""
    plain = region.replace("**", "")
    matches = list(_ANSWER_IS.finditer(plain))
    for m in reversed(matches):
        tail = m.group(1)
        # "Final Answer: The final answer is $8$." -- the label is followed by a sentence.
        for _ in range(3):
            inner = _ANSWER_IS.search(tail)
            if inner is None:
                break
            tail = inner.group(1)
        answer = _answer_of_sentence(_trim_sentence(tail))
        if answer:
            # "The answer is 4, or possibly 5": an alternative in the same sentence hedges it.
            return None if _ALTERNATIVE.search(_first_sentence(tail)) else answer
    bolds = [b.strip() for b in _BOLD.findall(region)]
    for bold in reversed(bolds):
        if _HAS_DIGIT_OR_MATH.search(bold):
            return _trim_sentence(bold)
    return None


_ALTERNATIVE = re.compile(
    r"[,;(]\s*(?:or|maybe|perhaps|possibly|alternatively)\b[^.\n]*?(?:\d|\$)"
    r"|\b(?:or\s+(?:maybe|perhaps|possibly)|either)\b",
    re.IGNORECASE,
)


def _first_sentence(tail: str) -> str:
    m = re.search(r"(?<!\d)[.;!?](?:\s|$)|(?<=\d)[.;!?](?:\s|$)|\n", tail)
    return tail[: m.start()] if m else tail


_OPENERS = re.compile(r"\$\$|\$|\\\[|\\\(")
_CLOSERS = {"$$": "$$", "$": "$", "\\[": "\\]", "\\(": "\\)"}
# Possessive quantifiers: a 100k-letter run must not make the search quadratic.
_PROSE = re.compile(r"\b[A-Za-z]{2,}+[\s,]++[A-Za-z]{2,}+[\s,]++[A-Za-z]{2,}")
_TEXT_ARG = re.compile(r"\\(?:text\w*|mbox|mathrm|operatorname)\s*\{[^{}]*\}|\\[A-Za-z]+")


def _is_prose(content: str) -> bool:
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
        if opener == "$" and (_is_prose(content) or re.match(r"\d[\d,.]*\s+[A-Za-z]", content)):
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
_WHOLE_TOKEN = re.compile(
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
_NUMBER_TOKEN = re.compile(
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
    wholes = list(_WHOLE_TOKEN.finditer(region))
    best: re.Match[str] | None = None
    w = 0  # both scans move forward only: linear time
    for m in _NUMBER_TOKEN.finditer(region):
        a = m.start()
        while w < len(wholes) and wholes[w].end() <= a:
            w += 1
        if w < len(wholes) and wholes[w].start() <= a + 1:
            best = wholes[w]  # a digit inside a date, time or mixed number: the whole token
        elif _standalone(region, m):
            best = m
    if best is None or _hedged(region, best.start()):
        return None
    return best.group(0).strip().rstrip(",")


def _standalone(region: str, m: re.Match[str]) -> bool:
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


def _hedged(region: str, pos: int) -> bool:
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


_UNIT_OR_LINK_WORDS = {"and", "or", "percent", "percentage", "pct", "cents", "cent"}


def _is_bare_expression(region: str) -> bool:
    r"""Tell whether a short text is one expression, undelimited (``\frac{10}{9}``, ``28 pct``)."""
    if len(region) > 300:
        return False
    plain = re.sub(r"\\(?:begin|end)\s*\{[^{}]*\}|\\[A-Za-z]+", " ", region)
    words = [w for w in re.findall(r"[A-Za-z]{2,}", plain) if w.lower() not in _UNIT_OR_LINK_WORDS]
    # One short word may be a product of variables ("2xy") or a unit; more is a sentence.
    return len(words) <= 1 and all(len(w) <= 3 for w in words)


def _last_math(region: str) -> str | None:
    """Return the later of the last math span and the last standalone number outside spans."""
    return _whole_text_answer(region) or _last_value(region)


def _whole_text_answer(region: str) -> str | None:
    """Return a short text that is one expression or one or two words, whole; else None."""
    if len(region) > 300 or math_spans(region):
        return None
    if _is_bare_expression(region) and re.search(r"\d|\\", region):
        return region.strip()  # the whole text is the answer ("(1,4.5)", "\\frac{10}{9}")
    if re.fullmatch(r"\s*[A-Za-z]+(?: [A-Za-z]+)?\s*\.?\s*", region):
        return region.strip().rstrip(".")  # a one- or two-word answer ("Monday", "odd")
    return None


def _last_value(region: str) -> str | None:
    """Return the later of the last math span and the last standalone number outside spans."""
    spans = math_spans(region)
    tail_from = spans[-1][1] if spans else 0
    number = last_standalone_number(_blank_spans(region, spans)[tail_from:])
    if number is not None:
        return number
    for _, _, content in reversed(spans):
        if content:
            return content.strip()
        return None  # the last span was broken
    return None


def _blank_spans(region: str, spans: list[tuple[int, int, str]]) -> str:
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


def _phrase_after_last_box(region: str) -> str | None:
    spans = _box_spans(region, limit=1)
    if not spans or "<answer>" in region.lower():
        return None
    after = region[spans[-1][1] :]
    if not _ANSWER_IS.search(after.replace("**", "")):
        return None
    answer = _flexible_in(after)
    # "\boxed{5}. The answer is correct." states no new answer.
    return answer if answer is not None and _HAS_DIGIT_OR_MATH.search(answer) else None


def extract_answer(completion: str, *, strict: bool = False) -> str | None:
    r"""Return the final answer in ``completion``, or None when there is none.

    Args:
        completion: the model's text (may contain ``<think>...</think>``).
        strict: only accept ``<answer>`` tags, the last ``\boxed{}``/``\fbox{}`` or ``#### N``.

    Text after the last ``</think>`` is searched first; flexible mode falls back to the whole text.

    >>> extract_answer("She has 3 + 4 = 7 apples.\n#### 7")
    '7'
    >>> extract_answer("The answer is $\\frac{1}{2}$.")
    '\\frac{1}{2}'
    >>> extract_answer("The answer is 12.", strict=True) is None
    True
    """
    if not isinstance(completion, str) or not completion:
        return None
    text = completion[-MAX_SCAN_CHARS:]
    if _BOX_TOKEN_OPEN in text:
        # GLM-4.1V/4.5V frame their answer in tokens instead of \boxed{}.
        text = text.replace(_BOX_TOKEN_OPEN, "\\boxed{").replace(_BOX_TOKEN_CLOSE, "}")
    think_end = text.rfind(_THINK_END)
    if text.rfind(_THINK_START) > think_end:
        return None  # a think block never closed: the model did not get to an answer
    post = text[think_end + len(_THINK_END) :] if think_end >= 0 else text
    answer = _strict_in(post, strict=strict)
    if answer is not None and strict:
        answer = settle_marked_answer(post, answer, strict=True)  # a refuted guess is dropped
    elif answer is not None:
        # "... \boxed{200} ... \boxed{255} ... The final answer is $10,455$.": a stated final
        # answer after the last box supersedes the boxes (intermediate results).
        answer = settle_marked_answer(post, _phrase_after_last_box(post) or answer)
        if answer is None:
            return None
    if answer is None and not strict:
        answer = _flexible_in(post)
        if answer is not None:
            answer = settle_marked_answer(post, answer)
            if answer is None:
                return None
        if answer is None and think_end >= 0:
            short = post.strip().strip("$").strip()
            if short and len(short) <= 100 and not _LONG_WORD.search(short.replace("\\", " \\")):
                answer = short
        if answer is None and think_end >= 0:
            answer = _strict_in(text, strict=False) or _flexible_in(text)
        if answer is None:
            answer = _whole_text_answer(post) or final_statement(post)
        if answer is None and think_end >= 0 and not re.search(r"\d", post):
            answer = final_statement(text[:think_end])  # nothing after </think> but spacing
    if answer is None:
        return None
    answer = answer.strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    return answer


def gold_answer(gold: str) -> str | None:
    r"""Return the final answer in a gold field.

    A gold field is a GSM8K solution ('... #### 72'), a MATH solution with ``\boxed{}``,
    ``<answer>`` tags, or a bare answer (returned stripped).
    """
    if not isinstance(gold, str):
        return None
    text = gold.strip()
    if not text:
        return None
    if "####" in text or "\\boxed" in text or "\\fbox" in text or "<answer>" in text.lower():
        return _strict_in(text[-MAX_SCAN_CHARS:])
    # A bare answer, maybe in math delimiters ("$x \\ge 5$", "$125$ miles", "$1$ and $2$"), is
    # taken whole; a worked solution without a box is read like a completion.
    short_text = len(text) <= 100 and "\n" not in text and not _ANSWER_IS.search(text)
    if short_text or (len(text) <= MAX_ANSWER_CHARS and not _is_prose(text)):
        return text  # "no real solutions", "$x \\ge 5$"
    found = extract_answer(text)
    return found if found is not None or len(text) > MAX_ANSWER_CHARS else text


# --- loose mode: the final stated answer ----------------------------------------------------

# A sentence that checks or illustrates a result already stated: its numbers are not the answer.
# It opens a check block (``_check_block``): the sentences after it belong to the check too,
# until a new conclusion ("So the answer is ...").
_CHECK_SENTENCE = re.compile(
    r"^\W*(?:(?:let(?:'s|\s+us|\s+me)|we\s+can|we|I\s+can|I(?:'ll|\s+will)|to|now|if\s+we"
    r"|as\s+a|and|also|but|hmm+|ok(?:ay)?|just|finally|lastly|a|one\s+more|quick(?:ly)?)[\s,]+)*"
    r"(?:(?:double|cross|sanity|quick)[- ]?)?"
    r"(?:check(?:ing|s)?\b|verif(?:y|ying|ication|ies)\b|sanity\s+check|test(?:ing)?\s+(?:it|this"
    r"|with|on|for|the\s+(?:answer|result|formula))\b"
    r"|(?:substitut(?:e|ing|ion)|plug(?:ging|s)?)\b(?=[^.\n]*?(?:\bcheck|\bverif|\bconfirm"
    r"|\bcorrect\b|\btrue\b|\bmatch|\bconsistent\b|as\s+expected|\bsatisf|✓|\bback\s*:))"
    r"|indeed\b|confirm(?:ing|s)?\b"
    r"|for\s+(?:example|instance)|e\.g\.|an\s+example|illustrate"
    r"|(?:for|in|take|try|consider|with|using|on)\s+(?:a|the|an)\s+(?:smaller|simpler|small"
    r"|simple|easier)\s+(?:case|example|instance))",
    re.IGNORECASE,
)
# The sentence that ends a check block: a new conclusion that is not itself check talk.
_NEW_CONCLUSION = re.compile(
    r"^\W*(?:so|thus|therefore|hence|in\s+(?:total|all|conclusion)|altogether|finally"
    r"|the\s+(?:final\s+)?answer)\b",
    re.IGNORECASE,
)
_CHECK_TALK = re.compile(
    r"\b(?:match(?:es|ing)?|as\s+expected|consistent|confirm\w*|checks?\s+out|correct|works"
    r"|agrees?|verified|✓)",
    re.IGNORECASE,
)
# Words that withdraw what came before: after them, only a new statement counts. A strong one
# leaves no answer when no new value follows; a weak one ("wait", "let me check") may also
# confirm the earlier answer, which then stands.
_STRONG_RETRACTION = (
    r"oops|correction|on\s+second\s+thought|scratch\s+that"
    r"|I\s+(?:made|have\s+made|'ve\s+made)\s+(?:a|an)\s+(?:\w+\s+)?(?:mistake|error)"
    r"|(?:there\s+(?:is|was)|that(?:'s|\s+is|\s+was))\s+(?:a|an)\s+(?:\w+\s+)?(?:mistake|error)"
    r"|my\s+(?:mistake|error|bad)|I\s+was\s+wrong"
    r"|(?:that|this)(?:'s|\s+is|\s+was)\s+(?:wrong|incorrect|not\s+right)"
    r"|I\s+(?:mis(?:counted|calculated|computed|read)|forgot|over[- ]?counted|double[- ]?counted)"
    r"|recalculat(?:e|ing)|recount(?:ing)?|recomput(?:e|ing)"
    r"|let\s+me\s+(?:recompute|redo|correct|fix|recount|recalculate)"
    r"|actually,?\s+(?:no\b|it(?:'s|\s+is|\s+should\s+be))"
    r"|no,?\s+wait|wait,?\s+no\b"
)
_RETRACTION = re.compile(
    rf"\b(?:(?P<strong>{_STRONG_RETRACTION})|wait|let\s+me\s+re-?check)\b",
    re.IGNORECASE,
)
# After a marked answer, these also open a second thought: "The answer is 12. Hmm, but ...". A
# concluding value after them replaces the answer; none leaves it standing (see the precedence).
_SECOND_THOUGHT = re.compile(
    rf"\b(?:(?P<strong>{_STRONG_RETRACTION})|(?P<hedge>(?:or\s+(?:maybe|perhaps|possibly)"
    r"|(?:it|that|the\s+answer)\s+(?:could|might)\s+(?:also\s+)?be)\s+[$\\(]*-?\d+)"
    r"|wait|hmm+|but|however|actually|hold\s+on|let\s+me\s+re-?(?:check|think|consider)"
    r"|(?P<no>no)(?=,\s+(?:it|the|that|this|we|I)\b)|on\s+reflection"
    r"|(?:counted|included)\s+(?:\w+\s+){0,4}?twice|(?:double|over)[- ]?count(?:ed|ing))\b",
    re.IGNORECASE,
)
# A guess the text then tests: "Suppose the answer is 5", "Let's try 7", "If the answer were 5".
# Only a guess at the answer or a trial value counts, not a premise ("Assuming each box holds 12,
# the total is 60") nor an evaluation ("If x = 3, then 2x + 1 = 7").
_GUESSED = (
    r"(?:that\s+)?(?:the\s+(?:\w+\s+){0,2}?(?:answer|result|solution|total|count|number|value)"
    r"|it)\s+(?:is|were|was|=|equals|be)\s+(?:\\boxed\s*\{|[$\\(]*-?\d)"
)
_SUPPOSITION = re.compile(
    r"\b(?:(?:(?:let(?:'s|\s+us|\s+me)\s+)?(?:suppos(?:e|ing)|assum(?:e|ing)|guess(?:ing)?)"
    rf"|let(?:'s|\s+us|\s+me)\s+say|what\s+if)\s+(?:{_GUESSED}|(?:that\s+)?[A-Za-z]\s*=\s*[$\\(]*-?\d|[$\\(]*-?\d)"
    rf"|if\s+{_GUESSED}"
    r"|let(?:'s|\s+us|\s+me)\s+(?:try|guess|test|see\s+if)\b(?!\s+to\b)"
    r"|(?<!')\btry(?:ing)?\s+(?:[$\\(]|-?\d|[A-Za-z]\s*=|\\boxed|the\s+value))",
    re.IGNORECASE,
)
# What refutes a supposition ("5 x 3 = 15 != 12, a contradiction") or affirms it ("which works").
_REFUTATION = re.compile(
    r"!=|≠|\\neq?\b|\\not=|\bcontradict\w*|\bdoes(?:n't|\s+not)\s+(?:work|hold|satisfy|match)"
    r"|\b(?:is|are)\s+not\s+(?:equal|possible|valid|an?\s+integer|right)|\bimpossible\b"
    r"|\btoo\s+(?:big|small|large|many|few|high|low|much|little)\b|\bfails?\b|\bnot\s+\$?-?\d",
    re.IGNORECASE,
)
# ... a contradiction refutes whatever it follows, a supposition or not.
_CONTRADICTION = re.compile(r"\bcontradict\w*", re.IGNORECASE)
_AFFIRMATION = re.compile(
    r"\b(?:works|checks?\s+out|satisf(?:ies|ied|y)|matches|consistent|correct|indeed|true"
    r"|confirm\w*|yes)\b|✓|\\checkmark",
    re.IGNORECASE,
)
# A sentence that offers several candidates, or none firmly: no credit.
_HEDGE_SENTENCE = re.compile(
    r"(?<![\d.,+\-*/×=$\s])\s*\$?\d+(?:\.\d+)?\s*,?\s*or\s+(?:maybe\s+|perhaps\s+|possibly\s+)?\$?"
    r"\d+(?:\.\d+)?(?![\d%]|\.\d|\s*[=+\-*/×])(?![^.\n]*=)"  # "4 or 5", not "0.60 or 60%"
    r"|\beither\s+[$\\(]*-?\d|\b(?:could|might|may)\s+be\s+(?:about\s+|around\s+)?[$\\(]*-?\d"
    r"|\b(?:maybe|perhaps|possibly|probably)\s*[$\\(]*-?\d|\bnot\s+sure\b|\bI\s+guess\b",
    re.IGNORECASE,
)
# ... and one that lists candidates: "10, 11, or 12"; "the possible values are 2 and 3"; "any of
# 4, 5"; "about 10 to 12". Tried only on a sentence holding one of ``_LIST_HEDGE_WORDS``.
_LIST_HEDGE = re.compile(
    r"(?<![\d.])\d++(?:\.\d++)?\$?(?:\s*+,\s*+\$?-?\d++(?:\.\d++)?\$?)++\s*+,?\s*+(?:or|and/or)\s+"
    r"\$?-?\d"
    r"|\b(?:possible|candidate|potential)\s+(?:\w+\s+){0,3}?(?:are|include|could\s+be)\s*:?\s*"
    r"[$\\(]*-?\d[\d.]*[$\\)]*\s*(?:,|\bor\b|\band\b)"
    r"|\b(?:any|one)\s+of\s+[$\\(]*-?\d[\d.]*[$\\)]*\s*(?:,|\bor\b|\band\b)"
    r"|\b(?:about|around|roughly|approximately|somewhere)\s+\$?-?\d+(?:\.\d+)?\s*(?:to|-|–)\s*\$?-?\d",
    re.IGNORECASE,
)
_LIST_HEDGE_WORDS = ("or", "possible", "candidate", "potential", "of", "about", "around",
                     "roughly", "approximately", "somewhere")  # fmt: skip


def _hedges(sentence: str) -> bool:
    """Tell whether ``sentence`` hedges between candidates or none (rule 5 of the precedence)."""
    if _HEDGE_SENTENCE.search(sentence):
        return True
    lower = sentence.lower()
    return any(w in lower for w in _LIST_HEDGE_WORDS) and bool(_LIST_HEDGE.search(sentence))


# A sentence without a value that opens a correction still to be made ("But we must exclude the
# paths through the corner, which number"): what was stated before it no longer stands.
_CORRECTION_WORDS = re.compile(
    r"\b(?:must|need\s+to|have\s+to|forgot|exclud\w*|subtract\w*|remov\w*|add\s+back"
    r"|account\s+for|twice|double[- ]?count\w*|over[- ]?count\w*|miss(?:ed|ing)|wrong|incorrect"
    r"|mistake|error)\b",
    re.IGNORECASE,
)
_CHECK_WORDS = re.compile(r"\b(?:check\w*|verif\w*|confirm\w*|sanity)\b", re.IGNORECASE)
_OPENER = re.compile(
    r"^\W*(?:(?:hmm+|wait|oh|ah)[\s,.]+)*(?:but|however|wait|hmm+|except|actually|oops)\b",
    re.IGNORECASE,
)


def _opens_correction(text: str) -> bool:
    """Tell whether ``text`` (no value in it) announces a correction it does not make."""
    return bool(_CORRECTION_WORDS.search(text)) and not _CHECK_WORDS.search(text)


# A last sentence that is a plan, not a result ("Now we multiply by 4"): nothing was concluded.
_PLAN_SENTENCE = re.compile(
    r"^\W*(?:now|next|then\s+we|we\s+(?:need|have)\s+to|I\s+need|to\s+find"
    r"|let(?:'s|\s+us|\s+me)(?!\s+know))\b",
    re.IGNORECASE,
)
# ... and one that announces work still to do even with numbers in it ("Let me compute 3 + 1"),
# unlike a plain "Now she has 12 apples".
_FUTURE_SENTENCE = re.compile(
    r"^\W*(?:(?:now|next|then),?\s+)?(?:we\s+(?:need|have|want|must)\s+to|I\s+(?:need|have|want)\s+to"
    r"|to\s+find|let(?:'s|\s+us|\s+me)(?!\s+know)|we\s+will|I\s+will)\b",
    re.IGNORECASE,
)
# ... unless it goes on to a result ("To find W, we divide by 6, so W = 5"; "To find the rest:
# 25 + 5 = 30 oranges").
_CONCLUSION = re.compile(r"=|\b(?:so|thus|therefore|hence|we\s+get|which\s+gives|giving)\b", re.I)
# A text cut off mid-sentence: it ends in an operator or a word that cannot end a sentence.
_TRUNCATED_END = re.compile(
    r"(?:[=+\-*/^_({\[:\\]|\b(?:by|to|the|a|an|of|and|or|so|then|is|are|was|we|get|gives|with"
    r"|from|plus|minus|into|than|that|which|multiply|divide|equals|for|at|as))\s*$",
    re.IGNORECASE,
)
_CLOSING_SENTENCE = re.compile(
    r"^\W*(?:I\s+hope|hope\s+(?:this|it)|let\s+me\s+know|feel\s+free|thanks?\b|good\s+luck)",
    re.IGNORECASE,
)
# A "!" after a number or a bracket is a factorial ("5! = 120", "3! ways") unless a new sentence
# follows it. Each branch starts with its punctuation mark: the scan skips ahead to the next one.
_SENTENCE_END = re.compile(r"[.?;](?=\s|$)|!(?:(?<![\d)}]!)(?=\s|$)|(?=\s*$|\s+[A-Z\n]))|\n+")


def _sentences(region: str, spans: list[tuple[int, int, str]]) -> list[str]:
    """Split ``region`` into sentences; a full stop inside a math span or a number is no end."""
    blanked = _blank_spans(region, spans)
    parts = []
    start = 0
    for m in _SENTENCE_END.finditer(blanked):
        parts.append(region[start : m.end()])
        start = m.end()
    parts.append(region[start:])
    return [p.strip() for p in parts if p.strip()]


def final_statement(region: str) -> str | None:
    r"""Return loose mode's *final stated answer* of a text with no answer marker, or None.

    The rule and its precedence (corrections, suppositions, checks, hedges, cut-off text) are
    stated once, in this module's docstring.

    >>> final_statement("So y = 3. Check: 3(3) - 2 = 7.")
    '3'
    >>> final_statement("The total is 10. Wait, I forgot the tax: it is 11.")
    '11'
    >>> final_statement("It could be 4 or 5.") is None
    True
    """
    stripped = region.rstrip()
    if len(stripped) > _STATEMENT_SCAN_CHARS:
        # The final statement is at the end: read the last lines only (from a line start).
        tail = stripped[-_STATEMENT_SCAN_CHARS:]
        stripped = tail[tail.find("\n") + 1 :] if "\n" in tail else tail
    spans = math_spans(stripped)
    if not stripped:
        return None
    sentences = _sentences(stripped, spans)[-_MAX_SENTENCES:]
    if _TRUNCATED_END.search(_spans_as_words(stripped, spans)[-200:]):
        return _answer_before_cut(sentences)
    return _statement_before(sentences)


def _answer_before_cut(sentences: list[str]) -> str | None:
    """Return the answer a cut-off text stated before the cut ("The answer is 8. Now the"), or None.

    Only a sentence that names the answer counts, with no second thought after it: a cut text's
    other numbers may be intermediate results.
    """
    for j in range(len(sentences) - 2, -1, -1):
        if _SECOND_THOUGHT.search(sentences[j + 1]) or _hedges(sentences[j + 1]):
            return None
        if _ANSWER_IS.search(sentences[j]):
            return _statement_before(sentences[: j + 1])
    return None


def _result_value(sentence: str) -> str | None:
    """Return the result of the sentence's last computation ("... = 15 liters out of the 24").

    The number right after the last ``=`` is what the sentence computed; numbers after it that
    are not results ("out of the 24 liters", "in 3 weeks") restate the question. None when the
    sentence computes nothing, or its last ``=`` is followed by math or an unfinished expression.
    """
    spans = math_spans(sentence)
    blanked = _blank_spans(sentence, spans)
    eq = blanked.rfind("=")
    if eq < 0 or (spans and spans[-1][0] > eq) or blanked[eq - 1 : eq] in ("<", ">", "!"):
        return None
    m = re.compile(r"\s*\$?\s*").match(blanked, eq + 1)
    start = m.end() if m else eq + 1
    whole = _WHOLE_TOKEN.match(blanked, start)
    if whole is not None:
        return whole.group(0).strip()
    number = _NUMBER_TOKEN.match(blanked, start)
    if number is None or not _standalone(blanked, number) or _hedged(blanked, start):
        return None
    # "= 16.75 bags, meaning ... 17 bags"; "= 0.60 or 60%"; "= 33.333%, which rounds to 33%":
    # the result restated (rounded, converted) after it is the final form.
    if _CONTINUED.search(blanked, number.end()):
        return None  # "= 30 eggs, plus 2 spares": the computation goes on in words
    restated = None
    for restated in _RESTATED.finditer(blanked, number.end()):  # noqa: B007 - the final one
        pass
    if restated is not None:
        return restated.group(1)
    return number.group(0).rstrip(",")


_CONTINUED = re.compile(
    r"\b(?:plus|minus|times|add(?:s|ed|ing)?|subtract\w*|extra|another|except|but|minus"
    r"|remov\w*|take\s+away|left\s+over\s+after)\b[^.=\n]{0,30}?\d|[+\-*/×]\s*\$?\d",
    re.IGNORECASE,
)
_RESTATED = re.compile(
    r"(?:\b(?:which|that)\s+(?:rounds?(?:\s+(?:up|down))?\s+to|is(?:\s+(?:about|approximately"
    r"|roughly))?|equals|means)|\bmeaning\b[^.=\n]{0,60}?|,?\s+or|\bi\.e\.,?)\s*\$?"
    r"(-?\d[\d,]*+(?:\.\d+)?+)(?![\d.]*\s*[=+*/×^-])"
    # ... but not a difference stated about it ("which is 20 more than last week").
    r"(?!%?\s*(?:[A-Za-z]+\s+)?(?:more|less|fewer|greater|times|than|higher|lower|over|under)\b)"
)


def _spans_as_words(text: str, spans: list[tuple[int, int, str]]) -> str:
    """``text`` with each math span replaced by a word: a text ending in math is complete."""
    out, prev = [], 0
    for a, b, _ in spans:
        out.append(text[prev:a] + " MATH ")
        prev = b
    out.append(text[prev:])
    return "".join(out)


def _check_block(sentences: list[str]) -> list[bool]:
    """Mark the sentences of a check: from a check sentence up to a new conclusion."""
    inside = False
    marks = []
    for sentence in sentences:
        if _CHECK_SENTENCE.match(sentence):
            inside = True
        elif inside and _NEW_CONCLUSION.match(sentence) and not _CHECK_TALK.search(sentence):
            inside = False
        marks.append(inside)
    return marks


_GUESS_WORDS = ("suppos", "assum", "guess", "what if", "try", "if ")


def _may_guess(text: str) -> bool:
    """Tell whether ``text`` may guess: a substring test that spares most texts the regex."""
    lower = text.lower()
    return any(w in lower for w in _GUESS_WORDS)


def _guess_start(sentences: list[str], k: int) -> int:
    """Return the sentence (``k`` or up to three before it) that makes a guess, or -1."""
    for j in range(k, max(-1, k - 4), -1):
        if _may_guess(sentences[j]) and _SUPPOSITION.search(sentences[j]):
            return j
    return -1


def _affirmed(after: str) -> bool:
    """Tell whether the text after a guess affirms it ("which works") and does not refute it."""
    return bool(_AFFIRMATION.search(after)) and not _REFUTATION.search(after)


def _statement_before(sentences: list[str]) -> str | None:
    """Apply ``final_statement``'s rule to ``sentences``, from the last one back."""
    in_check = _check_block(sentences)
    k = len(sentences)
    while k > 0:
        k -= 1
        sentence = sentences[k]
        retraction = None
        for retraction in _RETRACTION.finditer(sentence):  # noqa: B007 - the last one
            pass
        if retraction is not None:
            after = sentence[retraction.end() :].lstrip(" ,:;-")
            if _hedges(after):
                return None
            value = _statement_before([after, *sentences[k + 1 :]]) if after else None
            if value is not None or retraction.group("strong"):
                return value
            if not re.search(r"\d", after) and _opens_correction(after):
                return None  # "Wait, the corner was counted twice, so we subtract one"
            sentence = sentence[: retraction.start()]  # "wait, let me check": it still stands
            if not sentence.strip():
                continue
        if _CLOSING_SENTENCE.match(sentence) or in_check[k]:
            continue
        guess = _guess_start(sentences, k)
        if ("ontradict" in sentence and _CONTRADICTION.search(sentence)) or (
            guess >= 0 and _REFUTATION.search(sentence)
        ):
            # A refuted guess ("Suppose it is 5. Then 15 != 12."): neither it nor its working is
            # the answer; an earlier statement may be.
            k = guess if guess >= 0 else k
            continue
        if 0 <= guess < k and not _NEW_CONCLUSION.match(sentence):
            # The working of a guess ("Suppose it is 5. Then 5 * 3 = 15."): the guess is the
            # answer if the text confirms it, and its working never is.
            if not _affirmed(" ".join(sentences[guess + 1 :])):
                return None
            k = guess + 1
            continue
        affirmed = False
        if guess == k:
            if not _affirmed(" ".join(sentences[k + 1 :]) + _after_guess(sentence)):
                return None  # a guess never confirmed is no answer
            affirmed = True
        if not re.search(r"\d|\\[A-Za-z]", sentence) and not math_spans(sentence):
            if _OPENER.match(sentence) and _opens_correction(sentence):
                return None
            if _PLAN_SENTENCE.match(sentence):
                # "The answer is 57. Now let's": work announced after a named answer
                return _answer_before_cut(sentences[: k + 1])
            spelled = _last_number_words(sentence)
            if spelled is not None:
                return None if _hedges(sentence) else spelled
            continue
        if _hedges(sentence):
            return None
        future = _FUTURE_SENTENCE.match(sentence) and not _CONCLUSION.search(sentence)
        if future and not affirmed:
            return None
        inline_check = re.search(r"[;,(]\s*(?:check|verify|verification)\b", sentence, re.I)
        if inline_check:
            sentence = sentence[: inline_check.start()]
        if affirmed:
            sentence = _guess_value_part(sentence)
        return _result_value(sentence) or _last_value(sentence)
    return None


def _after_guess(sentence: str) -> str:
    """Return what follows the guess in its sentence ("Try 4: 4 * 3 = 12, which works")."""
    m = _SUPPOSITION.search(sentence)
    return " " + sentence[m.end() :] if m else ""


def _guess_value_part(sentence: str) -> str:
    """Return the guess of an affirmed guessing sentence ("Try 4: 4 * 3 = 12 works": "Try 4")."""
    m = re.search(r"[:;,]|\b(?:then|which|so)\b", sentence)
    return sentence[: m.start()] if m else sentence


_NUMBER_WORD = (
    r"(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen"
    r"|fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy"
    r"|eighty|ninety|hundred|thousand|million|billion)"
)
_NUMBER_WORDS = re.compile(
    rf"\b{_NUMBER_WORD}(?:(?:[\s-]+|\s+and\s+){_NUMBER_WORD})*+\b", re.IGNORECASE
)


def _last_number_words(sentence: str) -> str | None:
    """Return the last number written in words ("twelve", "twenty-one"); "one" is a pronoun."""
    last = None
    for last in _NUMBER_WORDS.finditer(sentence):  # noqa: B007 - the final one
        pass
    if last is None or last.group(0).lower() == "one":
        return None
    return last.group(0)


def _last_marker(region: str) -> int:
    """Return where the last answer marker (box, ``####``, tag, answer phrase) starts, or -1."""
    positions = [region.rfind(c) for c in (*_BOX_COMMANDS, "####")]
    positions.append(region.lower().rfind("</answer>"))
    last = None
    for last in _ANSWER_IS.finditer(region):  # noqa: B007 - the final one
        pass
    if last is not None:
        positions.append(last.start())
    return max(positions)


def _sentence_end(region: str, pos: int) -> int:
    """Return where the sentence holding ``pos`` ends (just after its full stop), or the end."""
    blanked = _blank_spans(region, math_spans(region))
    m = _SENTENCE_END.search(blanked, pos)
    # A box's own content may hold a full stop: the sentence ends after the box.
    box = _box_spans(region[pos:], limit=1)
    floor = pos + box[0][1] if box and box[0][0] == 0 else pos
    while m is not None and m.start() < floor:
        m = _SENTENCE_END.search(blanked, m.end())
    return m.end() if m else len(region)


def _sentence_start(region: str, pos: int) -> int:
    """Return where the sentence holding ``pos`` starts."""
    head = _blank_spans(region[:pos], math_spans(region[:pos]))
    start = 0
    for m in _SENTENCE_END.finditer(head):
        start = m.end()
    return start


_CONCLUDING = re.compile(
    r"\b(?:so|thus|therefore|hence|total|answer|result|gives?|giving|leaves?|leaving|get|got"
    r"|instead|should\s+be|is\s+actually|actually|correct\w*|subtract\w*|add\w*|minus|plus)\b|=",
    re.IGNORECASE,
)


def settle_marked_answer(region: str, answer: str, *, strict: bool = False) -> str | None:
    r"""Apply what the text says after its last marked answer (loose mode's precedence, 1-3).

    ``answer`` was read from the last marker of ``region`` (a box, an answer tag, ``####`` or
    an answer phrase). A guess is no answer ("Suppose the answer is \boxed{5}" then "15 != 12");
    a correction after it replaces it; a check or a weak second thought that states no new
    value leaves it standing. With ``strict``, only a refuted guess is dropped.

    >>> settle_marked_answer("The answer is 12. Hmm, but one was counted twice: 11.", "12")
    '11'
    >>> settle_marked_answer(r"Suppose it is \boxed{5}. Then 15 != 12.", "5") is None
    True
    >>> settle_marked_answer(r"\boxed{5}. Let me verify: 2 + 3 = 5.", "5")
    '5'
    """
    if strict:
        boxes = _box_spans(region, limit=1)
        if not boxes or "<answer>" in region.lower():
            return answer
        marker = boxes[-1][0]
    else:
        marker = max(_last_marker(region), 0)
    end = _sentence_end(region, marker)
    start = _sentence_start(region, marker)
    guess = _SUPPOSITION.search(region, start, end)
    if guess is not None and guess.start() < marker:
        after = region[marker:]
        refuted = bool(_REFUTATION.search(after))
        if strict:
            return None if refuted else answer
        if refuted or not _AFFIRMATION.search(after):
            # The guess is no answer; only a later conclusion is ("... So the answer is 4").
            tail = region[end:]
            last = _sentences(tail, math_spans(tail))[-1:] if tail.strip() else []
            if last and _NEW_CONCLUSION.match(last[0]):
                return final_statement(tail)
            return None
    if strict:
        return answer
    if re.search(r"\beither\b", region[start:marker], re.IGNORECASE):
        return None  # "either \boxed{3} or \boxed{4}"
    cue = _SECOND_THOUGHT.search(region, marker)
    if cue is None:
        return answer
    if cue.group("hedge"):
        return None  # "The answer is 12. Or maybe 13."
    tail = region[cue.end() :]
    marked = _strict_in(tail, strict=False) or _flexible_in(tail)
    if marked is not None:
        return marked
    strong_found = any(m.group("strong") for m in _RETRACTION.finditer(region, cue.start()))
    value = final_statement(tail.lstrip(" ,:;-"))
    if value is not None and (
        strong_found
        or cue.group("no")
        or _CONCLUDING.search(tail)
        or _CORRECTION_WORDS.search(tail)
    ):
        return value
    if strong_found or _TRUNCATED_END.search(_spans_as_words(tail, math_spans(tail))[-200:]):
        return None  # withdrawn, or cut off in the middle of the second thought
    opened = _sentences(tail, [])[:1]
    if opened and not re.search(r"\d", opened[0]) and _opens_correction(opened[0]):
        return None  # "The answer is 210. But we must exclude the paths through the corner"
    return answer


# --- multiple choice ------------------------------------------------------------------------

_OPTION_LABEL = re.compile(r"(?:(?<![A-Za-z0-9\\])\(([A-J])\)|(?m:^)[ \t]*([A-J])[.):])[ \t]*")
_OPTION_SCAN_CHARS = 20_000


def listed_options(text: str) -> dict[str, str]:
    """Return the options a text lists ("(A) 10 (B) 11 ..." or one "A. 10" a line), by letter.

    Only a run of labels A, B, C, ... in order counts (a stray "(C)" is no list); when the text
    lists the options more than once, the last listing wins. Empty when there is no such list.

    >>> listed_options("Options: (A) 10 (B) $11$ (C) 12. So (C).")
    {'A': '10', 'B': '11', 'C': '12'}
    """
    region = text[-_OPTION_SCAN_CHARS:]
    labels = list(_OPTION_LABEL.finditer(region))
    options: dict[str, str] = {}
    for k, m in enumerate(labels):
        letter = m.group(1) or m.group(2)
        end = labels[k + 1].start() if k + 1 < len(labels) else len(region)
        body = region[m.end() : end].split("\n", 1)[0]
        body = re.split(r"\.(?:\s|$)", body, maxsplit=1)[0].strip().strip("$,;").strip()
        if letter == "A":
            options = {}
        if letter == chr(ord("A") + len(options)) and body:
            options[letter] = body
    return options if len(options) >= 2 else {}
