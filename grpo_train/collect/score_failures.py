"""What the trainer and the evaluator do with scores that failed, in one place.

Turning a broken scorer (``score_batch`` raises or miscounts, a reward None / NaN / inf) into a
typed failure ``Score.failure(Outcome.ERROR, reason)`` is the one guard of grpo-kit,
``grpo_envs.wrappers.guarded_scores``. This module decides what such an item means
(``scoring_failed``): a failed item says nothing about the completion (the scorer or its sandbox
broke, not the model), so the trainer leaves it out of its group's baseline and the loss, and both
count it (``ScoreErrors``) and warn with the first reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from grpo_envs.types import Outcome, Score

#: Outcomes that say the scoring failed, not the completion: the scorer raised / returned a
#: malformed reward (``ERROR``), or the sandbox itself broke (``SANDBOX_ERROR``).
FAILED_OUTCOMES: frozenset[Outcome] = frozenset({Outcome.ERROR, Outcome.SANDBOX_ERROR})


def scoring_failed(score: Score) -> bool:
    """Return whether ``score`` records a scoring failure rather than a judgement.

    >>> scoring_failed(Score.failure(Outcome.ERROR, "boom"))
    True
    >>> scoring_failed(Score(reward=0.0, outcome=Outcome.WRONG))
    False
    """
    return score.outcome in FAILED_OUTCOMES


@dataclass(frozen=True)
class ScoreErrors:
    """How many of a batch's scores failed, and the first failure's reason (for the warning)."""

    failed: int
    total: int
    first_reason: str

    @property
    def fraction(self) -> float:
        """Failed share of the batch (0 for an empty batch)."""
        return self.failed / self.total if self.total else 0.0

    @classmethod
    def of(cls, scores: Iterable[Score]) -> ScoreErrors:
        """Count the failures among ``scores``.

        >>> ScoreErrors.of([Score.failure(Outcome.ERROR, "x"), Score(1.0, Outcome.CORRECT)])
        ScoreErrors(failed=1, total=2, first_reason='x')
        """
        failed, total, first = 0, 0, ""
        for s in scores:
            total += 1
            if scoring_failed(s):
                failed += 1
                # A code environment's sandbox failure names its cause in its first test.
                why = s.details.get("reason") or s.details.get("first_failure")
                first = first or str(why or s.outcome.value)
        return cls(failed, total, first)

    def describe(self) -> str:
        """One line for the log: counts and the first error text."""
        return (
            f"{self.failed} of {self.total} completions failed to score "
            f"({self.fraction:.0%}); first error: {self.first_reason[:200]}"
        )
