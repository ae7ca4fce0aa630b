r"""Find the final answer in a model completion (or in a gold solution).

Pure Python and linear-time on purpose: this runs in the caller's process on every completion,
so it must not be able to hang. Every scan below is a single pass (``rfind``, a brace matcher or a
regex without nested quantifiers), and completions longer than ``MAX_SCAN_CHARS`` are scanned
from their tail only.

Two modes, as in lm-eval's GSM8K task (strict-match vs flexible-extract):

* strict: only the formats a prompt asks for -- ``<answer>...</answer>``, the last ``\boxed{}`` /
  ``\fbox{}``, or ``#### N``.
* flexible (default): also "The (final) answer is ...", "Answer: ...", a bold final answer, a short
  text after ``</think>``, and finally the last number in the text.
"""

from __future__ import annotations

import re

#: Completions longer than this are scanned from their last MAX_SCAN_CHARS characters only: a
#: final answer lives at the end, and this bounds the work a 1 MB completion can cause.
MAX_SCAN_CHARS = 100_000
#: An extracted answer longer than this is not an answer (it is a paragraph).
MAX_ANSWER_CHARS = 1_000

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_THINK_END = "</think>"
_MAX_BOX_TRIES = 3
_HASHES = re.compile(r"####\s*([^\n]*)")
# "The final answer is", "the answer is:", "Answer:", "Final Answer:" (case-insensitive). The
# captured tail is cut to one sentence by _trim_sentence.
_ANSWER_IS = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is|:|=)\s*(?:is\s*)?:?\s*([^\n]*)", re.IGNORECASE
)
_BOLD = re.compile(r"\*\*([^*\n]{1,200}?)\*\*")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_HAS_DIGIT_OR_MATH = re.compile(r"\d|\\frac|\\sqrt|\\pi|^\(?[A-J]\)?$")
_LONG_WORD = re.compile(r"[A-Za-z]{4,}")
_COMMANDS = re.compile(r"\\[A-Za-z]+")


def find_last_boxed(text: str) -> str | None:
    r"""Return the content of the last ``\boxed{...}``/``\fbox{...}`` (nested braces kept) or None.

    ``\boxed 5`` (no braces, one token) is accepted too, as LaTeX renders it.

    >>> find_last_boxed(r"so \boxed{\frac{1}{2}} and \boxed{3}")
    '3'
    """
    best = -1
    best_cmd = ""
    for cmd in _BOX_COMMANDS:
        pos = text.rfind(cmd)
        if pos > best:
            best, best_cmd = pos, cmd
    # An unclosed last box (a truncated completion) falls back to an earlier, complete one; but
    # only a few times, since each try scans to the end (10^4 unclosed boxes would be quadratic).
    for _ in range(_MAX_BOX_TRIES):
        if best < 0:
            break
        content = _read_box_argument(text, best + len(best_cmd))
        if content is not None:
            return content
        prev = -1
        for cmd in _BOX_COMMANDS:
            pos = text.rfind(cmd, 0, best)
            if pos > prev:
                prev, best_cmd = pos, cmd
        best = prev
    return None


def _read_box_argument(text: str, start: int) -> str | None:
    """Return the braced argument at ``start`` (after optional spaces), or one bare token."""
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
        return m.group(1)
    depth = 0
    for j in range(i, n):
        ch = text[j]
        if ch == "\\":
            continue
        if ch == "{" and text[j - 1] != "\\":
            depth += 1
        elif ch == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
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
        boxed = find_last_boxed(inner)
        if boxed is not None:
            return boxed
        inner_hashes = _HASHES.findall(inner)
        if inner_hashes:
            return inner_hashes[-1].strip()
        if not strict and _LONG_WORD.search(_COMMANDS.sub(" ", inner)):
            return _flexible_in(inner) or _last_number(inner) or inner
        return inner
    boxed = find_last_boxed(region)
    if boxed is not None:
        return boxed
    hashes = _HASHES.findall(region)
    if hashes:
        return hashes[-1].strip()
    return None


def _trim_sentence(tail: str) -> str:
    """Cut "72 apples. So she ..." to the answer: the inline math, or up to the sentence end."""
    tail = tail.strip().lstrip(":").strip()
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
        answer = _trim_sentence(tail)
        if answer:
            return answer
    bolds = [b.strip() for b in _BOLD.findall(region)]
    for bold in reversed(bolds):
        if _HAS_DIGIT_OR_MATH.search(bold):
            return _trim_sentence(bold)
    return None


def _last_number(region: str) -> str | None:
    """Return the last number in the text, thousands separators kept for the comparator."""
    last = None
    for last in _NUMBER.finditer(region):  # noqa: B007 - we want the final match
        pass
    if last is None:
        return None
    return last.group(0).rstrip(",")


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
    think_end = text.rfind(_THINK_END)
    post = text[think_end + len(_THINK_END) :] if think_end >= 0 else text
    answer = _strict_in(post, strict=strict)
    if answer is None and not strict:
        answer = _flexible_in(post)
        if answer is None and think_end >= 0:
            short = post.strip().strip("$").strip()
            if short and len(short) <= 100 and not _LONG_WORD.search(short.replace("\\", " \\")):
                answer = short
        if answer is None and think_end >= 0:
            answer = _strict_in(text, strict=False) or _flexible_in(text)
        if answer is None:
            answer = _last_number(post) or _last_number(text)
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
    return text if len(text) <= MAX_ANSWER_CHARS else None
