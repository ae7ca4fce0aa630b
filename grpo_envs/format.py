r"""Format rewards: R1-style tags, boxed answers, DAPO's overlong penalty; plus the tag extractors.

Each reward is a plain function ``str -> float`` (easy to test) with a ``*_component`` factory that
wraps it as a weighted ``RewardComponent``. The tag checks count tags: a duplicated or mismatched
tag earns nothing, a known way format rewards get gamed (verifiers' XML format reward gives partial
credit for stray tags). Every reward here is 0 or 1 for any text, in time linear in its length
(substring counts and ``rfind``; the one regex runs only once each tag occurs exactly once): model
text never makes one raise.

Example:
    >>> think_answer_strict("<think>2+2</think><answer>4</answer>")
    1.0
    >>> think_answer_soft("<think>a</think><answer>4</answer><answer>5</answer>")
    0.0
    >>> boxed_present(r"so \boxed{\frac{1}{2}}"), boxed_present(r"\boxed{}")
    (1.0, 0.0)
"""

from __future__ import annotations

import re
from collections.abc import Callable

from grpo_envs.math.markers import find_last_boxed
from grpo_envs.rubric import RewardComponent, ScoringContext

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")

# The strict R1 template (DeepSeek-R1 paper, sec. 2.2.1): optional whitespace, a think block, then
# an answer block and nothing else. DOTALL so the blocks may span lines.
_STRICT = re.compile(r"\A\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*\Z", re.DOTALL)


def _tag_counts(text: str) -> dict[str, int]:
    return {tag: text.count(tag) for tag in _TAGS}


def think_answer_strict(completion: str) -> float:
    """1.0 iff the completion is exactly ``<think>…</think><answer>…</answer>`` (whitespace around).

    Each tag must occur exactly once and the answer must be non-blank.
    """
    if any(n != 1 for n in _tag_counts(completion).values()):
        return 0.0
    match = _STRICT.match(completion)
    return 1.0 if match is not None and match.group(2).strip() else 0.0


def think_answer_soft(completion: str) -> float:
    """1.0 iff each of the four tags occurs exactly once, in order, with a non-blank answer.

    Unlike the strict form, text before, between or after the blocks is allowed.
    """
    if any(n != 1 for n in _tag_counts(completion).values()):
        return 0.0
    positions = [completion.index(tag) for tag in _TAGS]
    if positions != sorted(positions):
        return 0.0
    answer = completion[positions[2] + len("<answer>") : positions[3]]
    return 1.0 if answer.strip() else 0.0


def answer_tag(completion: str) -> str | None:
    """Return the stripped content of the last ``<answer>…</answer>`` block, or None."""
    # rfind, not a lazy regex: a regex is quadratic on junk with many unclosed "<answer>" tags.
    close = completion.rfind("</answer>")
    if close == -1:
        return None
    open_ = completion.rfind("<answer>", 0, close)
    if open_ == -1:
        return None
    content = completion[open_ + len("<answer>") : close].strip()
    return content or None


def last_boxed(completion: str) -> str | None:
    r"""Return the content of the last complete, non-empty ``\boxed{…}``/``\fbox{…}``, or None.

    The rule is ``grpo_envs.math.markers.find_last_boxed``'s (defined once, there).
    """
    return find_last_boxed(completion)


def boxed_present(completion: str) -> float:
    r"""1.0 iff the completion holds a non-empty ``\boxed{…}`` with balanced braces."""
    return 1.0 if last_boxed(completion) is not None else 0.0


def overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", arXiv:2503.14476, eq. 13).

    0 up to ``max_length - buffer``; then falls linearly to -1 at ``max_length``; -1 beyond it.
    ``length`` is in whatever unit ``max_length`` is (tokens in the paper).
    """
    if buffer <= 0 or buffer > max_length:
        raise ValueError(f"need 0 < buffer <= max_length, got buffer={buffer}, max={max_length}")
    expected = max_length - buffer
    if length <= expected:
        return 0.0
    if length <= max_length:
        return (expected - length) / buffer
    return -1.0


# --- components -------------------------------------------------------------------------------


def think_answer_strict_component(weight: float = 1.0) -> RewardComponent:
    """``think_answer_strict`` as a component named ``format_strict``."""
    return RewardComponent(
        "format_strict", weight, lambda ctx: think_answer_strict(ctx.completion), bounded=True
    )


def think_answer_soft_component(weight: float = 1.0) -> RewardComponent:
    """``think_answer_soft`` as a component named ``format_soft``."""
    return RewardComponent(
        "format_soft", weight, lambda ctx: think_answer_soft(ctx.completion), bounded=True
    )


def boxed_component(weight: float = 1.0) -> RewardComponent:
    """``boxed_present`` as a component named ``boxed``."""
    return RewardComponent("boxed", weight, lambda ctx: boxed_present(ctx.completion), bounded=True)


def overlong_component(
    max_length: int,
    buffer: int,
    weight: float = 1.0,
    length_fn: Callable[[str], int] = len,
) -> RewardComponent:
    """``overlong_penalty`` as a component named ``overlong``.

    ``length_fn`` measures a completion; the default counts characters. Pass a tokenizer's counter
    (``lambda s: len(tok(s).input_ids)``) to penalise in tokens as DAPO does.
    """
    overlong_penalty(0, max_length, buffer)  # validate the arguments now, not at scoring time

    def fn(ctx: ScoringContext) -> float:
        return overlong_penalty(length_fn(ctx.completion), max_length, buffer)

    return RewardComponent("overlong", weight, fn)


#: Names accepted by ``format_components`` (used by environments' ``format=`` option).
FORMATS = ("none", "think_answer", "boxed")


def format_components(style: str, weight: float) -> list[RewardComponent]:
    """Return the format components of a style.

    ``think_answer``: strict (weighted) and soft (logged, weight 0); ``boxed``; ``none``.
    """
    if style == "none":
        return []
    if style == "think_answer":
        return [think_answer_strict_component(weight), think_answer_soft_component(0.0)]
    if style == "boxed":
        return [boxed_component(weight)]
    raise ValueError(f"unknown format style {style!r}; choose one of {FORMATS}")
