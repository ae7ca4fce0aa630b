r"""Benchmark metrics as papers report them: avg@k with its standard error, maj@k, macro averages.

Every function here is pure: it takes per-problem verdicts (and, for majority voting, the
extracted answers and an equivalence test) and returns numbers.

- **avg@k** (also written mean@k, or "pass@1 averaged over k samples"): the mean over problems of
  the fraction of a problem's ``k`` samples that are correct. It equals the unbiased pass@1
  (``passk.pass_at_k(k, c, 1) == c / k``); DeepSeek-R1 reports AIME "pass@1" this way with
  k = 64, DAPO and Skywork-OR1 as avg@32.
- **Its standard error** is taken *across problems*: the sample standard deviation (ddof 1) of
  the per-problem accuracies divided by sqrt(number of problems). It treats the benchmark as a
  sample of problems (the clustered standard error of Miller 2024, "Adding Error Bars to Evals",
  arXiv 2411.00640, with problems as clusters), so it is the error bar to put next to a score
  when comparing models. ``se_sampling`` is the part due to drawing only ``k`` completions per
  problem, problems held fixed: sqrt(sum_i p_i (1 - p_i) / (k - 1)) / m, which uses the unbiased
  estimate p (1 - p) k / (k - 1) of each problem's Bernoulli variance. When it is a large share of
  ``se``, more samples per problem would tighten the score; otherwise only more problems would.
- **maj@k** (cons@k): the answer most of ``k`` samples give is the model's answer. Answers are
  clustered with an equivalence test (for math, the verifier's: ``\frac12`` and ``0.5`` vote
  together), unparsable samples do not vote, and a problem whose samples all lack an answer scores
  0. A cluster's verdict is that of its first member (the representative every other member was
  found equivalent to). Ties between clusters of the same size are split: the problem scores the
  fraction of tied clusters that are correct (the expected score of picking one at random), so the
  result does not depend on the order of the samples. ``TieRule.FIRST`` instead takes the cluster
  whose first member came first (``collections.Counter.most_common``'s order, as lighteval does).
  With ``n`` samples and ``k < n``, maj@k is averaged over the ``n // k`` disjoint consecutive
  blocks of ``k`` samples of each problem (so maj@1 equals avg@n).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

Equivalence = Callable[[str, str], bool]
"""``equivalent(representative, candidate)``: whether two extracted answers are the same answer."""


@dataclass(frozen=True)
class AvgAtK:
    """avg@k over a set of problems, with its standard errors."""

    k: int
    num_problems: int
    value: float
    """Mean over problems of the per-problem fraction correct."""
    se: float | None
    """Standard error across problems (None with a single problem)."""
    se_sampling: float | None
    """The part of the error due to the finite ``k`` samples per problem (None when k = 1)."""


def avg_at_k(correct: Sequence[Sequence[bool]]) -> AvgAtK:
    """avg@k of problems given as their ``k`` verdicts each (every problem has the same ``k``).

    Three problems with 2, 1 and 0 of 2 samples correct: per-problem accuracies 1, 0.5, 0; mean
    0.5; sample std 0.5, so se = 0.5 / sqrt(3); se_sampling = sqrt(0.25 / 1) / 3.

    >>> r = avg_at_k([[True, True], [True, False], [False, False]])
    >>> r.value, round(r.se, 6), round(r.se_sampling, 6)
    (0.5, 0.288675, 0.166667)
    """
    if not correct:
        raise ValueError("avg@k needs at least one problem")
    sizes = {len(c) for c in correct}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(
            f"avg@k needs the same number (>= 1) of samples for every problem, got sizes "
            f"{sorted(sizes)}"
        )
    (k,) = sizes
    m = len(correct)
    rates = [sum(c) / k for c in correct]
    mean = sum(rates) / m
    se = None
    if m > 1:
        variance = sum((r - mean) ** 2 for r in rates) / (m - 1)
        se = math.sqrt(variance / m)
    se_sampling = None
    if k > 1:
        se_sampling = math.sqrt(sum(r * (1 - r) / (k - 1) for r in rates)) / m
    return AvgAtK(k=k, num_problems=m, value=mean, se=se, se_sampling=se_sampling)


class TieRule(StrEnum):
    """How maj@k breaks a tie between answer clusters of the same size."""

    SPLIT = "split"
    """Score the fraction of tied clusters that are correct (order-independent; the default)."""
    FIRST = "first"
    """Take the tied cluster whose first member came first."""


def cluster_answers(answers: Sequence[str | None], equivalent: Equivalence) -> list[list[int]]:
    """Group the indices of ``answers`` into clusters of equivalent answers, in first-seen order.

    ``None`` (no answer) joins no cluster. Identical strings (after stripping) share a cluster
    without calling ``equivalent``; otherwise an answer joins the first cluster whose
    representative (first member) it is equivalent to.

    >>> cluster_answers(["1/2", None, "0.5", "3", "1/2"], lambda a, b: eval(a) == eval(b))
    [[0, 2, 4], [3]]
    """
    clusters: list[list[int]] = []
    reps: list[str] = []
    by_text: dict[str, int] = {}
    for i, answer in enumerate(answers):
        if answer is None or not answer.strip():
            continue
        text = answer.strip()
        slot = by_text.get(text)
        if slot is None:
            slot = next((j for j, rep in enumerate(reps) if equivalent(rep, text)), None)
            if slot is None:
                slot = len(clusters)
                clusters.append([])
                reps.append(text)
            by_text[text] = slot
        clusters[slot].append(i)
    return clusters


def majority_correct(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    equivalent: Equivalence,
    tie: TieRule = TieRule.SPLIT,
) -> float:
    """Score of the majority answer of one problem's samples: 1, 0, or a split tie's fraction.

    >>> same = lambda a, b: a == b
    >>> majority_correct(["7", "7", "9"], [True, True, False], same)
    1.0
    >>> majority_correct(["7", "9"], [True, False], same)
    0.5
    >>> majority_correct(["7", "9"], [True, False], same, TieRule.FIRST)
    1.0
    >>> majority_correct([None, None], [False, False], same)
    0.0
    """
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} verdicts")
    clusters = cluster_answers(answers, equivalent)
    if not clusters:
        return 0.0
    top = max(len(c) for c in clusters)
    tied = [c for c in clusters if len(c) == top]
    if tie is TieRule.FIRST:
        return float(correct[min(tied, key=lambda c: c[0])[0]])
    return sum(correct[c[0]] for c in tied) / len(tied)


def maj_at_k(
    problems: Sequence[Sequence[tuple[str | None, bool]]],
    k: int,
    equivalent: Equivalence,
    tie: TieRule = TieRule.SPLIT,
) -> float:
    """maj@k over problems, each given as its ``(extracted answer, correct)`` samples in order.

    Each problem needs at least ``k`` samples; its score is the mean over its ``n // k`` disjoint
    consecutive blocks of ``k`` samples (samples past the last full block are left out).

    >>> same = lambda a, b: a == b
    >>> maj_at_k([[("1", True), ("1", True), ("2", False), ("2", False)]], 2, same)
    0.5
    """
    if not problems:
        raise ValueError("maj@k needs at least one problem")
    if k < 1:
        raise ValueError(f"maj@k needs k >= 1, got {k}")
    total = 0.0
    for samples in problems:
        if len(samples) < k:
            raise ValueError(f"maj@{k} needs at least {k} samples per problem, got {len(samples)}")
        blocks = [samples[lo : lo + k] for lo in range(0, len(samples) - k + 1, k)]
        total += sum(
            majority_correct([a for a, _ in b], [c for _, c in b], equivalent, tie) for b in blocks
        ) / len(blocks)
    return total / len(problems)


def math_equivalence(representative: str, candidate: str) -> bool:
    r"""Whether two extracted math answers are equal, by the math verifier.

    The representative plays the gold answer and the candidate the boxed prediction (the verifier
    is asymmetric: a gold ``\{1, 2\}`` accepts ``1, 2``); a comparison that times out is "not
    equal", so the answers vote apart.

    >>> math_equivalence("\\frac{1}{2}", "0.5")
    True
    >>> math_equivalence("3", "4")
    False
    """
    if representative.strip() == candidate.strip():
        return True
    from grpo_envs.math import verify

    # 2 s, not the graders' 5: a vote compares many pairs, and a pair that needs that long is
    # better counted apart than waited for.
    return verify(representative, f"\\boxed{{{candidate}}}", timeout_s=2.0, strict=True).correct


def exact_equivalence(representative: str, candidate: str) -> bool:
    """Whether two answers are the same text, ignoring case and surrounding space (letters).

    >>> exact_equivalence("b", " B ")
    True
    """
    return representative.strip().casefold() == candidate.strip().casefold()


@dataclass(frozen=True)
class MacroAverage:
    """The unweighted mean of per-suite scores (each suite counts once, as a paper's "Avg")."""

    value: float
    se: float | None
    """sqrt(sum se_i^2) / S, suites taken as independent; None if any suite lacks an se."""
    num_suites: int


def macro_average(scores: Sequence[tuple[float, float | None]]) -> MacroAverage:
    """Macro average of ``(score, se)`` pairs.

    >>> m = macro_average([(0.5, 0.3), (0.7, 0.4)])
    >>> round(m.value, 6), round(m.se, 6)
    (0.6, 0.25)
    """
    if not scores:
        raise ValueError("a macro average needs at least one suite")
    s = len(scores)
    value = sum(v for v, _ in scores) / s
    ses = [e for _, e in scores]
    se = None if any(e is None for e in ses) else math.sqrt(sum((e or 0.0) ** 2 for e in ses)) / s
    return MacroAverage(value=value, se=se, num_suites=s)
