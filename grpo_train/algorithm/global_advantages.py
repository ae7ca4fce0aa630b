"""Advantages over the whole step's batch when it is spread over data-parallel ranks.

Each rank generates and scores its own share of the step's groups; the advantage estimators
(``compute_advantages``, ``ema_advantages``) gather every rank's rewards (``gather_step_rewards``,
the one gather of every estimator), compute on the whole (P, G) batch as one process would
(batch-level reward scaling and the logged statistics then equal a single-process run), and each
rank keeps its own rows. At world size 1 nothing is communicated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from grpo_train.algorithm.advantages import Estimator, ScaleRewards, compute_advantages
from grpo_train.algorithm.baselines import EmaBaselines, GroupKey, ema_advantages
from grpo_train.parallel import distributed


@dataclass(frozen=True)
class StepRewards:
    """The whole step's (P, G) rewards, gathered from every rank, and where this rank's rows are.

    The one gather behind every advantage estimator (``global_advantages``,
    ``global_ema_advantages``): each computes on the whole batch, as one process would, and each
    rank keeps ``local`` of the result.
    """

    rewards: torch.Tensor
    """(P, G) rewards of all ranks, in rank order."""
    valid: torch.Tensor | None
    """(P, G) bool mask of the scored rewards of all ranks; None: all of them."""
    offset: int
    """Row of this rank's first group in ``rewards``."""
    rows: int
    """Number of this rank's groups."""

    def local(self, values: torch.Tensor) -> torch.Tensor:
        """Return this rank's rows of a (P, ...) tensor computed on the whole step."""
        return values[self.offset : self.offset + self.rows]


def gather_step_rewards(
    local_rewards: torch.Tensor, local_valid: torch.Tensor | None = None
) -> StepRewards:
    """Gather every rank's (P_rank, G) rewards (and validity mask) in rank order (collective).

    World size 1: the local tensors as they are, nothing communicated.
    """
    if local_rewards.ndim != 2:
        raise ValueError(
            f"rewards must have shape (prompts, group), got {tuple(local_rewards.shape)}"
        )
    rows = int(local_rewards.shape[0])
    if not distributed.multi_rank():
        return StepRewards(local_rewards, local_valid, 0, rows)
    rewards = distributed.gather_rows(local_rewards)
    counts = distributed.gather_rows(torch.tensor([rows], device=local_rewards.device))
    offset = int(counts[: dist.get_rank()].sum())
    valid = None
    if local_valid is not None:
        valid = distributed.gather_rows(local_valid.to(local_rewards.dtype)) > 0.5
    return StepRewards(rewards, valid, offset, rows)


@dataclass(frozen=True)
class GlobalAdvantages:
    """Advantages computed on the whole step's batch, and this rank's slice of them."""

    local: torch.Tensor
    """(P_rank, G) advantages of this rank's groups."""
    rewards: torch.Tensor
    """(P, G) rewards of all ranks (for logging ``group_stats`` once, on the main rank)."""
    offset: int
    """Row of this rank's first group in ``rewards``."""


def global_advantages(
    local_rewards: torch.Tensor,
    estimator: Estimator | str = Estimator.GRPO,
    scale_rewards: ScaleRewards | str = ScaleRewards.GROUP,
    eps: float = 1e-4,
    local_valid: torch.Tensor | None = None,
) -> GlobalAdvantages:
    """Gather rewards, compute advantages over all ranks' groups, keep this rank's rows.

    ``local_valid``: (P_rank, G) bool mask of the rewards that were scored (see
    ``compute_advantages``' ``valid``); None: all of them.

    With whole groups per rank the per-group estimators give the same numbers locally, but
    ``scale_rewards="batch"`` divides by the std of *all* rewards of the step, which only the
    gathered tensor has; computing everything globally keeps a multi-rank run identical to a
    single-process one whatever the options.
    """
    step = gather_step_rewards(local_rewards, local_valid)
    advantages = compute_advantages(step.rewards, estimator, scale_rewards, eps, valid=step.valid)
    return GlobalAdvantages(local=step.local(advantages), rewards=step.rewards, offset=step.offset)


def global_ema_advantages(
    local_rewards: torch.Tensor,
    keys: Sequence[GroupKey],
    baselines: EmaBaselines,
    alpha: float,
    scale_rewards: ScaleRewards | str,
    local_valid: torch.Tensor,
) -> tuple[torch.Tensor, EmaBaselines]:
    """Return this rank's rows of the EMA advantages over every rank's groups, and the baselines.

    ``baselines.ema_advantages`` on the gathered batch (collective). Every rank computes from
    the same gathered rewards and keys, in rank order, so every rank's baselines stay identical
    (each saves and restores the same state).
    """
    step = gather_step_rewards(local_rewards, local_valid)
    assert step.valid is not None  # given above
    every_key = distributed.gather_objects(list(keys))
    advantages, new = ema_advantages(
        step.rewards, every_key, baselines, alpha, scale_rewards, valid=step.valid
    )
    return step.local(advantages), new
