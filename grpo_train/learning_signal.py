"""The learning-signal guard: notice a run whose groups keep having equal rewards (no gradient).

"Signal" here is the learning signal (reward differences within a group), not an OS signal
(Ctrl-C, SIGTERM: ``grpo_train.stop``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_train.config import TrainConfig


@dataclass
class SignalGuard:
    """Notice a run that is not learning because its groups' rewards all agree.

    A group whose completions all get the same reward has zero advantage: no gradient. When at
    least ``threshold`` of the groups are like that for ``patience`` steps in a row, ``update``
    returns True, once (``rearm`` watches again); ``advice`` is the line to print. ``eased``:
    the run already answered a stall with an easier curriculum stage, which it does only once.

    >>> guard = SignalGuard(threshold=0.75, patience=2)
    >>> [guard.update(f) for f in (0.9, 0.5, 0.8, 1.0, 1.0)]
    [False, False, False, True, False]
    """

    # 0.9, not "most": the embedded default run starts with 3 of 4 groups all wrong (its sampled
    # accuracy is 3% at step 1) and learns fast; the guard is for runs where nearly nothing does.
    threshold: float = 0.9
    patience: int = 3
    streak: int = 0
    fired: bool = False
    eased: bool = False

    def update(self, frac_zero_std: float) -> bool:
        """Record one step's share of equal-reward groups; True when the guard fires."""
        self.streak = self.streak + 1 if frac_zero_std >= self.threshold else 0
        if self.fired or self.streak < self.patience:
            return False
        self.fired = True
        return True

    def rearm(self) -> None:
        """Watch again from a fresh streak, after the curriculum eased the task (``eased``)."""
        self.streak, self.fired, self.eased = 0, False, True

    def advice(
        self,
        step: int,
        config: TrainConfig,
        dynamic_sampling_now_on: bool,
        easier_now: Sequence[str] = (),
    ) -> str:
        """One line: what happened and what to try, with this run's numbers.

        ``easier_now``: the environments that the automatic curriculum just sent to their easiest
        version.
        """
        r = config.rollout
        tries = [
            "dynamic_sampling=true (drop equal-reward groups, draw more prompts)"
            if not dynamic_sampling_now_on
            else "more dynamic_sampling_rounds",
            f"a higher temperature (now {r.temperature:g})",
            f"larger groups (num_generations, now {r.num_generations})",
            "a reward with partial credit (e.g. step_credit for arithmetic chains)",
        ]
        if not easier_now:
            tries.append("an easier curriculum (a lower difficulty first; env stages)")
        now = (
            "; dynamic_sampling=auto is now on for the rest of the run"
            if dynamic_sampling_now_on
            else ""
        )
        if easier_now:
            now += (
                f"; curriculum=auto: {', '.join(easier_now)} now trains on its easiest version "
                "first and moves up as its training accuracy reaches curriculum_threshold="
                f"{config.data.curriculum_threshold:g} (evaluation stays on the task as "
                "configured)"
            )
        return (
            f"learning signal: at step {step}, >= {self.threshold:.0%} of groups had equal "
            f"rewards (no gradient) for {self.patience} steps in a row{now}. Try: "
            + "; ".join(tries)
        )
