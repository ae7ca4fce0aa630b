r"""Loose mode: the *final stated answer* of a text, and what the text says after a marked answer.

``final_statement`` reads sentences from the end (corrections, suppositions, checks, hedges and
cut-off text as the precedence says); ``settle_marked_answer`` applies the same rules after a
marked answer. The rule and its precedence are stated once, in ``extract``'s module docstring.
"""

from __future__ import annotations

import re

from grpo_envs.math.markers import ANSWER_IS, BOX_COMMANDS, box_spans, flexible_in, strict_in
from grpo_envs.math.spans import (
    NUMBER_TOKEN,
    WHOLE_TOKEN,
    blank_spans,
    hedged,
    last_value,
    math_spans,
    standalone,
)

#: Loose mode reads at most this many final sentences for the final stated answer.
_MAX_SENTENCES = 40
#: ... within at most this many final characters.
_STATEMENT_SCAN_CHARS = 4_000


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
    blanked = blank_spans(region, spans)
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
    stated once, in ``extract``'s module docstring.

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
        if ANSWER_IS.search(sentences[j]):
            return _statement_before(sentences[: j + 1])
    return None


def _result_value(sentence: str) -> str | None:
    """Return the result of the sentence's last computation ("... = 15 liters out of the 24").

    The number right after the last ``=`` is what the sentence computed; numbers after it that
    are not results ("out of the 24 liters", "in 3 weeks") restate the question. None when the
    sentence computes nothing, or its last ``=`` is followed by math or an unfinished expression.
    """
    spans = math_spans(sentence)
    blanked = blank_spans(sentence, spans)
    eq = blanked.rfind("=")
    if eq < 0 or (spans and spans[-1][0] > eq) or blanked[eq - 1 : eq] in ("<", ">", "!"):
        return None
    m = re.compile(r"\s*\$?\s*").match(blanked, eq + 1)
    start = m.end() if m else eq + 1
    whole = WHOLE_TOKEN.match(blanked, start)
    if whole is not None:
        return whole.group(0).strip()
    number = NUMBER_TOKEN.match(blanked, start)
    if number is None or not standalone(blanked, number) or hedged(blanked, start):
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
        return _result_value(sentence) or last_value(sentence)
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
    positions = [region.rfind(c) for c in (*BOX_COMMANDS, "####")]
    positions.append(region.lower().rfind("</answer>"))
    last = None
    for last in ANSWER_IS.finditer(region):  # noqa: B007 - the final one
        pass
    if last is not None:
        positions.append(last.start())
    return max(positions)


def _sentence_end(region: str, pos: int) -> int:
    """Return where the sentence holding ``pos`` ends (just after its full stop), or the end."""
    blanked = blank_spans(region, math_spans(region))
    m = _SENTENCE_END.search(blanked, pos)
    # A box's own content may hold a full stop: the sentence ends after the box.
    box = box_spans(region[pos:], limit=1)
    floor = pos + box[0][1] if box and box[0][0] == 0 else pos
    while m is not None and m.start() < floor:
        m = _SENTENCE_END.search(blanked, m.end())
    return m.end() if m else len(region)


def _sentence_start(region: str, pos: int) -> int:
    """Return where the sentence holding ``pos`` starts."""
    head = blank_spans(region[:pos], math_spans(region[:pos]))
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
        boxes = box_spans(region, limit=1)
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
    marked = strict_in(tail, strict=False) or flexible_in(tail)
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
