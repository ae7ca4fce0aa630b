"""What a run trains on: the prompt order and each environment's current curriculum stage.

``PromptSampler`` is the resumable prompt order (``grpo_envs.mixture.WeightedOrder``, the stream
``MixtureEnv`` materialises too, with its counters in a checkpoint's ``SamplerState``);
``TrainingPrompts`` draws a step's prompts from it and keeps the curriculum and the online filter
(``grpo_train.collect.curriculum``) consistent with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from grpo_envs.mixture import WeightedOrder
from grpo_envs.types import Sample
from grpo_train.collect.curriculum import (
    AccuracyCurriculum,
    CurriculumState,
    PassRateFilter,
    PromptKey,
)
from grpo_train.run.checkpoint import SamplerState

if TYPE_CHECKING:
    from grpo_envs.base import Environment
    from grpo_train.collect.groups import Group


@dataclass(frozen=True)
class PromptSettings:
    """What the prompt draw reads of the run's configuration (``setup.settings`` builds it).

    The defaults are the configuration's.
    """

    train_split: str = "train"
    """The split training prompts are drawn from."""
    curriculum_threshold: float = 0.6
    """Training accuracy at which an environment moves to its next stage."""
    curriculum_window: int = 3
    """Steps of training accuracy averaged for ``curriculum_threshold``."""
    online_filtering: bool = False
    """Skip prompts whose pass rate was 0 or 1 on their last visit."""
    filter_retry_after: int = 2
    """Skips in a row before a filtered prompt is drawn again."""


class PromptSampler(WeightedOrder):
    """The run's prompt order (``WeightedOrder``), saved and restored as a ``SamplerState``.

    A resumed run draws the prompts the uninterrupted one would have drawn.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Sequence[float],
        seed: int,
        state: SamplerState | None = None,
    ) -> None:
        """Draw from environments of ``sizes`` rows by ``weights``; resume at ``state``."""
        if state is None:
            super().__init__(sizes, weights, seed)
        else:
            super().__init__(sizes, weights, seed, state.draws, state.positions)

    def next_row(self) -> tuple[int, int]:
        """Return the next (environment index, row index) and advance."""
        env, row, _epoch = self.next()
        return env, row

    def state(self) -> SamplerState:
        """Return the counters to save in a checkpoint."""
        return SamplerState(self.draws, tuple(self.positions))


#: Online filtering skips at most this many prompts per prompt kept in one draw, so that a
#: dataset the policy has fully solved (or fully failed) cannot stall the draw.
MAX_FILTERED_PER_PROMPT = 8


class TrainingPrompts:
    """What training draws and scores: each environment's current curriculum stage.

    Owns the prompt order (``PromptSampler``), the curriculum and the online filter, and keeps
    them consistent: a stage change swaps the environment's rows and restarts its order. The
    environments as configured (``stage_envs[i][-1]``) are what evaluation measures.

    ``draw`` gives the step's prompts; ``record`` takes the step's scored groups (every rank's,
    so that every rank decides the same) and returns the step's metrics; ``ease`` sends the
    environments that have easier versions to their easiest (the automatic curriculum);
    ``state`` is the checkpoint's ``SamplerState``.
    """

    def __init__(
        self,
        stage_envs: Sequence[Sequence[Environment]],
        starts: Sequence[int],
        names: Sequence[str],
        weights: Sequence[float],
        settings: PromptSettings,
        seed: int,
        saved: SamplerState | None = None,
    ) -> None:
        self.stage_envs = [list(stages) for stages in stage_envs]
        self.names, self.settings = list(names), settings
        initial = CurriculumState(tuple(starts), tuple(() for _ in starts))
        resumed = (
            CurriculumState.from_json(saved.curriculum) if saved and saved.curriculum else None
        )
        self.curriculum = AccuracyCurriculum(
            [len(s) for s in self.stage_envs],
            settings.curriculum_threshold,
            settings.curriculum_window,
            resumed or initial,
        )
        self.filter = PassRateFilter(settings.filter_retry_after)
        if saved is not None:
            self.filter.load_json(saved.filter_memory)
        self.envs = [s[self.curriculum.stage(i)] for i, s in enumerate(self.stage_envs)]
        self.rows = [env.dataset(settings.train_split) for env in self.envs]
        self.sampler = PromptSampler([len(r) for r in self.rows], weights, seed, saved)
        self._filtered = self._drawn = 0

    def draw(self, n_prompts: int) -> list[tuple[Sample, int]]:
        """Return the next ``n_prompts`` (sample, environment index) pairs, filter applied."""
        drawn: list[tuple[Sample, int]] = []
        skipped = 0
        while len(drawn) < n_prompts:
            env_index, row = self.sampler.next_row()
            sample = self._named_for_stage(env_index, Sample.from_row(self.rows[env_index][row]))
            if (
                self.settings.online_filtering
                and skipped < MAX_FILTERED_PER_PROMPT * n_prompts
                and self.filter.skip(self._key(env_index, sample))
            ):
                skipped += 1
                continue
            drawn.append((sample, env_index))
        self._filtered += skipped
        self._drawn += skipped + n_prompts
        return drawn

    def record(self, groups: Sequence[Group]) -> tuple[dict[str, float], list[str]]:
        """Feed a step's pass rates to the filter and accuracies to the curriculum.

        Returns the step's metrics (stage per environment with stages, filtered share) and a
        description of each stage change.
        """
        correct, scored = [0] * len(self.envs), [0] * len(self.envs)
        for g in groups:
            hits = [s.correct for s, ok in zip(g.scores, g.trainable) if ok]
            correct[g.env_index] += sum(hits)
            scored[g.env_index] += len(hits)
            if hits and self.settings.online_filtering:
                self.filter.record(self._key(g.env_index, g.sample), sum(hits) / len(hits))
        accuracies = [c / n if n else None for c, n in zip(correct, scored)]
        moved = [self._enter_stage(i) for i in self.curriculum.record(accuracies)]
        metrics = self.stage_metrics()
        if self.settings.online_filtering:
            metrics["curriculum/filtered_share"] = self._filtered / max(self._drawn, 1)
        self._filtered = self._drawn = 0
        return metrics, moved

    def stage_metrics(self) -> dict[str, float]:
        """Return ``curriculum/stage/<name>`` (1-based) of each environment with stages."""
        return {
            f"curriculum/stage/{name}": float(self.curriculum.stage(i) + 1)
            for i, name in enumerate(self.names)
            if len(self.stage_envs[i]) > 1
        }

    def describe_stage(self, name: str) -> str:
        """Return 'name stage k/n' of the environment called ``name``."""
        i = self.names.index(name)
        return f"{name} stage {self.curriculum.stage(i) + 1}/{len(self.stage_envs[i])}"

    def ease(self) -> list[str]:
        """Send every environment at its last stage that has easier versions to its easiest."""
        eased = []
        for i, stages in enumerate(self.stage_envs):
            if len(stages) > 1 and self.curriculum.is_final(i):
                self.curriculum.restart(i)
                eased.append(self._enter_stage(i))
        return eased

    def state(self) -> SamplerState:
        """Return the checkpoint's data state: sampler counters, curriculum, filter memory."""
        return replace(
            self.sampler.state(),
            curriculum=self.curriculum.state().to_json(),
            filter_memory=tuple(tuple(row) for row in self.filter.to_json()),
        )

    def _enter_stage(self, env_index: int) -> str:
        """Draw environment ``env_index`` from its current stage; return 'name stage k/n'."""
        stage = self.curriculum.stage(env_index)
        env = self.envs[env_index] = self.stage_envs[env_index][stage]
        self.rows[env_index] = env.dataset(self.settings.train_split)
        self.sampler.restart(env_index, len(self.rows[env_index]))
        return f"{self.names[env_index]} stage {stage + 1}/{len(self.stage_envs[env_index])}"

    def _named_for_stage(self, env_index: int, sample: Sample) -> Sample:
        """Give an easier stage's sample an id of its own (``stage-1/train-7``).

        Row ``train-7`` of an easier stage is another question than row ``train-7`` of the task:
        per-prompt state keyed by sample id (EMA baselines, logs) must not mix them.
        """
        if self.curriculum.is_final(env_index):
            return sample
        return replace(sample, id=f"stage-{self.curriculum.stage(env_index) + 1}/{sample.id}")

    def _key(self, env_index: int, sample: Sample) -> PromptKey:
        return (env_index, self.curriculum.stage(env_index), sample.id)
