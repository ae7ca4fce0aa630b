r"""Marked answers: boxes, ``<answer>`` tags, ``#### N`` and answer phrases, read where they stand.

``find_last_boxed`` is the one definition of "the last box" in grpo_envs; ``find_boxed_answer``
joins a run of boxes that form one answer. ``strict_in`` reads the formats a prompt asks for,
``flexible_in`` the free-text ones ("The answer is ...", a bold answer), each reduced to the
answer itself (``_trim_sentence``). The precedence between them is ``extract``'s (its docstring).
"""

from __future__ import annotations

import itertools
import re

from grpo_envs.math.spans import UNIT_OR_LINK_WORDS, blank_spans, is_prose, last_math, math_spans

BOX_COMMANDS = ("\\boxed", "\\fbox", "\\framebox")


_MAX_BOX_TRIES = 3


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


ANSWER_IS = _AnswerPhrase()
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{([^{}]*)\}")
_BOLD = re.compile(r"\*\*([^*\n]{1,200}?)\*\*")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_HAS_DIGIT_OR_MATH = re.compile(r"\d|\\frac|\\sqrt|\\pi|^\(?[A-J]\)?$")
LONG_WORD = re.compile(r"[A-Za-z]{4,}")
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
    spans = box_spans(text, limit=1)
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


def box_spans(text: str, limit: int = 64) -> list[tuple[int, int, str]]:
    """Return up to ``limit`` complete boxes ``(start, end, content)``, the last ones, in order."""
    spans: list[tuple[int, int, str]] = []
    end = len(text)
    failures = 0  # an unclosed box costs a scan to the end: only a few are tried
    while len(spans) < limit and failures < _MAX_BOX_TRIES:
        best, best_cmd = -1, ""
        for cmd in BOX_COMMANDS:
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
    spans = box_spans(text)
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


def strict_in(region: str, *, strict: bool = True) -> str | None:
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
        if not strict and LONG_WORD.search(_COMMANDS.sub(" ", inner)):
            return flexible_in(inner) or last_math(inner) or inner
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
    if ANSWER_IS.search(plain):
        found = flexible_in(plain)
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
    outside = blank_spans(sentence, math_spans(sentence))
    words = re.findall(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+(?:\s*\{[^{}]*\})?", " ", outside))
    if all(w.lower() in UNIT_OR_LINK_WORDS for w in words):
        return sentence
    last = None
    for last in _COPULA.finditer(sentence):  # noqa: B007 - the final one
        pass
    if last is not None:
        rest = _trim_sentence(sentence[last.end() :])
        if rest and not is_prose(rest):
            return rest
    return last_math(sentence) or sentence


def flexible_in(region: str) -> str | None:
    """Return the answer in a free-text format ("The answer is ...", bold), or None."""
    plain = region.replace("**", "")
    matches = list(ANSWER_IS.finditer(plain))
    for m in reversed(matches):
        tail = m.group(1)
        # "Final Answer: The final answer is $8$." -- the label is followed by a sentence.
        for _ in range(3):
            inner = ANSWER_IS.search(tail)
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


def phrase_after_last_box(region: str) -> str | None:
    """Return the answer a phrase after the last box states ("The final answer is ..."), or None."""
    spans = box_spans(region, limit=1)
    if not spans or "<answer>" in region.lower():
        return None
    after = region[spans[-1][1] :]
    if not ANSWER_IS.search(after.replace("**", "")):
        return None
    answer = flexible_in(after)
    # "\boxed{5}. The answer is correct." states no new answer.
    return answer if answer is not None and _HAS_DIGIT_OR_MATH.search(answer) else None
