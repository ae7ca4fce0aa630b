"""A prompt group: one prompt and its scored completions, the record a step collects and logs.

The trainer generates a ``Group`` of completions per prompt and scores them (a scorer failure
becomes a typed zero-reward ``Score``, ``grpo_train.collect.score_failures``). Failed items
are left out of their group (``Group.scored``); a group with fewer than ``MIN_SCORED`` scored
items is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from grpo_envs.types import Sample, Score
from grpo_train.algorithm.advantages import MIN_SCORED, informative_groups
from grpo_train.collect.score_failures import scoring_failed
from grpo_train.rollout.base import Completion

if TYPE_CHECKING:
    from grpo_train.episodes.driver import EpisodeRollout


@dataclass(frozen=True)
class Group:
    """One prompt and its scored completions: the record a step logs (texts, scores)."""

    sample: Sample
    env_index: int
    prompt_ids: list[int]
    completions: list[Completion] = field(default_factory=list)
    scores: list[Score] = field(default_factory=list)
    episodes: tuple[EpisodeRollout, ...] = ()
    """Multi-turn steps: the episode behind each completion (its ``completions`` are the
    episodes' rows: ids after the prompt, sampled and inserted); empty for single-turn."""

    @property
    def sampled_lengths(self) -> list[int]:
        """Per completion: the ids the engine sampled.

        An episode's turns only: the environment's inserted replies are not sampled (their
        share is ``episodes/environment_token_share``).
        """
        if self.episodes:
            return [r.sampled_tokens for r in self.episodes]
        return [len(c.token_ids) for c in self.completions]

    @property
    def rewards(self) -> list[float]:
        """Return the reward of each completion (a failed score's is 0)."""
        return [s.reward for s in self.scores]

    @property
    def scored(self) -> list[bool]:
        """Per completion: False where scoring failed (no reward to learn from)."""
        return [not scoring_failed(s) for s in self.scores]

    @property
    def dropped(self) -> bool:
        """True when fewer than ``MIN_SCORED`` completions were scored: no baseline to compare."""
        return sum(self.scored) < MIN_SCORED

    @property
    def trainable(self) -> list[bool]:
        """Per completion: whether it enters the baseline and the loss."""
        return [ok and not self.dropped for ok in self.scored]

    @property
    def informative(self) -> bool:
        """Return whether the trainable rewards differ (``advantages.informative_groups``)."""
        rewards = torch.tensor([self.rewards], dtype=torch.float64)
        return bool(informative_groups(rewards, torch.tensor([self.trainable]))[0])
