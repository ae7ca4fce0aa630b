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

The stages live in their own modules, in the order they are tried: ``markers`` (boxes, tags,
``####``, answer phrases), ``spans`` (math spans, standalone numbers) and ``statements`` (the final
stated answer, and what follows a marked answer). This module holds the policy that orders them
(``extract_answer``, ``gold_answer``) and the multiple-choice options (``listed_options``); the
names other modules use are importable from here.
"""

from __future__ import annotations

import re

from grpo_envs.math.markers import (
    ANSWER_IS,
    LONG_WORD,
    find_boxed_answer,
    find_last_boxed,
    flexible_in,
    phrase_after_last_box,
    strict_in,
)
from grpo_envs.math.spans import is_prose, last_standalone_number, math_spans, whole_text_answer
from grpo_envs.math.statements import final_statement, settle_marked_answer

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_SCAN_CHARS",
    "extract_answer",
    "final_statement",
    "find_boxed_answer",
    "find_last_boxed",
    "gold_answer",
    "last_standalone_number",
    "listed_options",
    "math_spans",
    "settle_marked_answer",
]

#: Completions longer than this are scanned from their last MAX_SCAN_CHARS characters only: a
#: final answer lives at the end, and this bounds the work a 1 MB completion can cause.
MAX_SCAN_CHARS = 100_000
#: An extracted answer longer than this is not an answer (it is a paragraph).
MAX_ANSWER_CHARS = 1_000

_THINK_START = "<think>"
_BOX_TOKEN_OPEN, _BOX_TOKEN_CLOSE = "<|begin_of_box|>", "<|end_of_box|>"
_THINK_END = "</think>"


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
    answer = strict_in(post, strict=strict)
    if answer is not None and strict:
        answer = settle_marked_answer(post, answer, strict=True)  # a refuted guess is dropped
    elif answer is not None:
        # "... \boxed{200} ... \boxed{255} ... The final answer is $10,455$.": a stated final
        # answer after the last box supersedes the boxes (intermediate results).
        answer = settle_marked_answer(post, phrase_after_last_box(post) or answer)
        if answer is None:
            return None
    if answer is None and not strict:
        answer = flexible_in(post)
        if answer is not None:
            answer = settle_marked_answer(post, answer)
            if answer is None:
                return None
        if answer is None and think_end >= 0:
            short = post.strip().strip("$").strip()
            if short and len(short) <= 100 and not LONG_WORD.search(short.replace("\\", " \\")):
                answer = short
        if answer is None and think_end >= 0:
            answer = strict_in(text, strict=False) or flexible_in(text)
        if answer is None:
            answer = whole_text_answer(post) or final_statement(post)
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
        return strict_in(text[-MAX_SCAN_CHARS:])
    # A bare answer, maybe in math delimiters ("$x \\ge 5$", "$125$ miles", "$1$ and $2$"), is
    # taken whole; a worked solution without a box is read like a completion.
    short_text = len(text) <= 100 and "\n" not in text and not ANSWER_IS.search(text)
    if short_text or (len(text) <= MAX_ANSWER_CHARS and not is_prose(text)):
        return text  # "no real solutions", "$x \\ge 5$"
    found = extract_answer(text)
    return found if found is not None or len(text) > MAX_ANSWER_CHARS else text


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
