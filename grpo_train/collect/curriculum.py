"""Spend rollouts where they teach: accuracy-driven curricula and online difficulty filtering.

A group whose completions all get the same reward has zero advantage, so it costs a generation
and teaches nothing. Two mechanisms keep groups informative:

- ``AccuracyCurriculum``: an environment trains through easier stages first (e.g. one-digit
  operands before two-digit ones) and moves to the next stage when its running training accuracy
  crosses a threshold; the last stage is the environment as configured, which is also what the
  held-out evaluation measures throughout. Curriculum learning: Bengio et al., "Curriculum
  Learning" (ICML 2009); accuracy-gated stages as in "Kimi k1.5" (arXiv:2501.12599, 2.3.4).
- ``PassRateFilter``: skips a prompt whose pass rate on its last visit was 0 or 1, as in "Online
  Difficulty Filtering for Reasoning Oriented Reinforcement Learning" (arXiv:2504.03380). A
  skipped prompt is retried after ``retry_after`` skips, so a prompt the policy could not solve
  at first is not lost for good. It acts when prompts repeat (several epochs over a dataset);
  DAPO's dynamic sampling (``dynamic_sampling``) is the same idea within one step.

Both are pure state machines here; ``grpo_train.collect.training_prompts.TrainingPrompts``
feeds them each step's scored groups (every rank's, so every rank decides the same) and saves
their state in checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CurriculumState:
    """Where each environment's curriculum stands: saved in checkpoints, restored on resume."""

    stages: tuple[int, ...] = ()
    """Current stage per environment (0 = easiest; an environment without stages stays at 0)."""
    recent: tuple[tuple[float, ...], ...] = ()
    """Training accuracies of the last steps at the current stage, per environment."""

    def to_json(self) -> dict[str, list[int] | list[list[float]]]:
        """Return a JSON-ready form (``from_json`` reads it back)."""
        return {"stages": list(self.stages), "recent": [list(r) for r in self.recent]}

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> CurriculumState:
        """Read ``to_json``'s form; ValueError names what is malformed."""
        stages, recent = raw.get("stages"), raw.get("recent")
        if not isinstance(stages, list) or not isinstance(recent, list):
            raise ValueError(f"curriculum state needs lists 'stages' and 'recent', got {raw!r}")
        return cls(tuple(int(s) for s in stages), tuple(tuple(map(float, r)) for r in recent))


class AccuracyCurriculum:
    """Move each environment to its next stage when its running training accuracy is high enough.

    ``stage_counts[i]`` is the number of stages of environment ``i`` (1: no curriculum). After
    each step ``record`` gets the step's training accuracy per environment (None where the step
    drew none of its prompts). When the mean of the last ``window`` accuracies at the current
    stage reaches ``threshold``, the environment moves up one stage and its history restarts.

    >>> c = AccuracyCurriculum([3, 1], threshold=0.5, window=2)
    >>> [c.record([acc, 0.0]) for acc in (0.2, 0.6, 0.3, 0.9, 0.9, 1.0)]
    [[], [], [], [0], [], [0]]
    >>> c.stage(0), c.stage(1), c.is_final(0)
    (2, 0, True)
    """

    def __init__(
        self,
        stage_counts: Sequence[int],
        threshold: float,
        window: int,
        state: CurriculumState | None = None,
    ) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"curriculum threshold must be in (0, 1], got {threshold}")
        if window < 1:
            raise ValueError(f"curriculum window must be >= 1, got {window}")
        if any(n < 1 for n in stage_counts):
            raise ValueError(f"every environment needs at least one stage, got {stage_counts}")
        self.stage_counts, self.threshold, self.window = list(stage_counts), threshold, window
        n = len(self.stage_counts)
        state = state or CurriculumState((0,) * n, ((),) * n)
        if len(state.stages) != n or len(state.recent) != n:
            raise ValueError(
                f"curriculum state is for {len(state.stages)} environment(s), this run has {n}"
            )
        for i, (stage, count) in enumerate(zip(state.stages, self.stage_counts)):
            if not 0 <= stage < count:
                raise ValueError(f"environment {i}: saved stage {stage}, it has {count} stage(s)")
        self.stages = list(state.stages)
        self.recent = [list(r) for r in state.recent]

    def stage(self, env_index: int) -> int:
        """Return the current stage of environment ``env_index`` (0 = easiest)."""
        return self.stages[env_index]

    def is_final(self, env_index: int) -> bool:
        """Whether the environment trains on its configured (last) stage."""
        return self.stages[env_index] == self.stage_counts[env_index] - 1

    def restart(self, env_index: int) -> None:
        """Send environment ``env_index`` back to its easiest stage, with a fresh history."""
        self.stages[env_index] = 0
        self.recent[env_index] = []

    def record(self, accuracies: Sequence[float | None]) -> list[int]:
        """Add one step's training accuracy per environment; return the ones that moved up."""
        moved = []
        for i, acc in enumerate(accuracies):
            if acc is None or self.is_final(i):
                continue
            history = (self.recent[i] + [acc])[-self.window :]
            self.recent[i] = history
            if len(history) == self.window and sum(history) / self.window >= self.threshold:
                self.stages[i] += 1
                self.recent[i] = []
                moved.append(i)
        return moved

    def state(self) -> CurriculumState:
        """Return the state to save in a checkpoint."""
        return CurriculumState(tuple(self.stages), tuple(tuple(r) for r in self.recent))


#: A prompt's identity for the filter: (environment index, curriculum stage, sample id).
PromptKey = tuple[int, int, str]


@dataclass
class PassRateFilter:
    """Skip prompts whose pass rate on their last visit was 0 or 1 (no advantage either way).

    ``record`` stores a visited prompt's pass rate; ``skip`` says whether to skip it on the next
    draw. A prompt is skipped at most ``retry_after`` times in a row, then drawn again: the policy
    changes, and a prompt it failed may be within reach now.

    >>> f = PassRateFilter(retry_after=2)
    >>> f.record((0, 0, "train-7"), 1.0)
    >>> [f.skip((0, 0, "train-7")) for _ in range(4)]
    [True, True, False, True]
    >>> f.record((0, 0, "train-7"), 0.5)
    >>> f.skip((0, 0, "train-7"))
    False
    """

    retry_after: int = 2
    last_rate: dict[PromptKey, float] = field(default_factory=dict)
    skips: dict[PromptKey, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.retry_after < 1:
            raise ValueError(f"retry_after must be >= 1, got {self.retry_after}")

    def record(self, key: PromptKey, pass_rate: float) -> None:
        """Store the pass rate of a visit to ``key`` (share of correct completions)."""
        self.last_rate[key] = pass_rate

    def skip(self, key: PromptKey) -> bool:
        """Return True to skip ``key`` now; counts the skip, and lets it through after enough."""
        rate = self.last_rate.get(key)
        if rate is None or 0.0 < rate < 1.0:
            return False
        count = self.skips.get(key, 0)
        if count >= self.retry_after:
            self.skips[key] = 0
            return False
        self.skips[key] = count + 1
        return True

    def to_json(self) -> list[list[str | int | float]]:
        """Return the filter's memory as JSON rows ``[env, stage, sample id, rate, skips]``."""
        return [[*key, rate, self.skips.get(key, 0)] for key, rate in self.last_rate.items()]

    def load_json(self, rows: Sequence[Sequence[object]]) -> None:
        """Restore ``to_json``'s rows; ValueError names a malformed row."""
        for row in rows:
            if len(row) != 5:
                raise ValueError(
                    f"pass-rate filter row {row!r}: expected [env, stage, sample id, rate, skips]"
                )
            env, stage, sample_id, rate, skips = row
            key = (int(str(env)), int(str(stage)), str(sample_id))
            self.last_rate[key] = float(str(rate))
            self.skips[key] = int(str(skips))
