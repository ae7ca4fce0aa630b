"""The named choices of the algorithm configuration: estimator, reward scaling, loss, ratio level.

They live apart from the math that implements them (``advantages.py``, ``objective.py``, which
import torch) so that reading a configuration (the config module, ``grpo train --help``) imports
no torch; those modules re-export them. ``ObjectiveSettings`` (the objective's settings as one
value) lives here for the same reason: its defaults are the configuration's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Estimator(StrEnum):
    """How a completion's reward is turned into an advantage."""

    GRPO = "grpo"
    """``r - mean(group)`` (DeepSeekMath, arXiv:2402.03300), then scaled by ``ScaleRewards``."""
    RLOO = "rloo"
    """Leave-one-out baseline ``r_i - mean_{j != i} r_j`` (Ahmadian et al., arXiv:2402.14740)."""
    EMA = "ema"
    """``r - b`` with ``b`` a running mean of the prompt's (else the environment's) past rewards,
    kept across steps (``grpo_train.algorithm.baselines.ema_advantages``; it needs that state)."""


class ScaleRewards(StrEnum):
    """What the centred rewards are divided by."""

    GROUP = "group"
    """The group's standard deviation (original GRPO)."""
    BATCH = "batch"
    """The standard deviation of all rewards in the batch (TRL's ``scale_rewards="batch"``)."""
    NONE = "none"
    """No division: Dr. GRPO (arXiv:2503.20783) argues the std normalisation biases the update
    towards questions that are too easy or too hard."""


class LossType(StrEnum):
    """How per-token losses are aggregated into one scalar."""

    GRPO = "grpo"
    """Mean over each sequence's tokens, then mean over sequences (DeepSeekMath)."""
    DR_GRPO = "dr_grpo"
    """Sum over tokens divided by ``B * max_completion_length`` (Dr. GRPO, arXiv:2503.20783):
    no per-sequence length normalisation, so long wrong answers are not favoured."""
    DAPO = "dapo"
    """Mean over all completion tokens of the batch (DAPO token-level loss, arXiv:2503.14476)."""


class ImportanceLevel(StrEnum):
    """Where the clipped importance ratio is taken (TRL's ``importance_sampling_level``)."""

    TOKEN = "token"
    """Per token: ``exp(logp_t - old_t)`` (PPO / GRPO)."""
    SEQUENCE = "sequence"
    """Per completion: the length-normalised sequence ratio of GSPO (Group Sequence Policy
    Optimization, arXiv:2507.18071), clipped per sequence."""


@dataclass(frozen=True)
class ObjectiveSettings:
    """The settings of ``grpo_loss`` as one value; ``AlgorithmConfig`` takes its defaults here.

    ``max_completion_length``: ``dr_grpo``'s divisor (the rollout's completion limit); None for
    the other loss types.
    """

    beta: float = 0.0
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    loss_type: LossType = LossType.DAPO
    importance_sampling_level: ImportanceLevel = ImportanceLevel.TOKEN
    max_completion_length: int | None = None
