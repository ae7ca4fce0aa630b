"""Group-relative advantages and group statistics: pure functions on a (P, G) reward tensor.

``P`` prompts, ``G`` completions per prompt (the group). Every function here is checked against a
hand computation in ``tests/grpo_train/test_advantages.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch


class Estimator(StrEnum):
    """How a completion's reward is turned into an advantage."""

    GRPO = "grpo"
    """``r - mean(group)`` (DeepSeekMath, arXiv:2402.03300), then scaled by ``ScaleRewards``."""
    RLOO = "rloo"
    """Leave-one-out baseline ``r_i - mean_{j != i} r_j`` (Ahmadian et al., arXiv:2402.14740)."""
    EMA = "ema"
    """``r - b`` with ``b`` a running mean of the prompt's (else the environment's) past rewards,
    kept across steps (``grpo_train.baselines.ema_advantages``; it needs that state)."""


class ScaleRewards(StrEnum):
    """What the centred rewards are divided by."""

    GROUP = "group"
    """The group's standard deviation (original GRPO)."""
    BATCH = "batch"
    """The standard deviation of all rewards in the batch (TRL's ``scale_rewards="batch"``)."""
    NONE = "none"
    """No division: Dr. GRPO (arXiv:2503.20783) argues the std normalisation biases the update
    towards questions that are too easy or too hard."""


def compute_advantages(
    rewards: torch.Tensor,
    estimator: Estimator | str = Estimator.GRPO,
    scale_rewards: ScaleRewards | str = ScaleRewards.GROUP,
    eps: float = 1e-4,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Compute advantages for a (P, G) reward tensor; returns (P, G).

    ``valid``: a (P, G) bool mask of the rewards to use (False: the scoring failed). Statistics
    (mean, std, leave-one-out) are taken over each group's valid rewards only, invalid items get
    advantage 0, and a group with fewer than two valid rewards is dropped (all 0): a zero standing
    in for a failed score would otherwise shift the baseline and push the policy towards whatever
    happens not to crash the scorer.

    GRPO: ``(r - mean_g) / (std_g + eps)`` with ``std_g`` the unbiased (n - 1) standard deviation
    of the group, as TRL computes it (``torch.std``); with ``scale_rewards="batch"`` the std of all
    ``P * G`` rewards, with ``"none"`` no division. RLOO: ``r_i - mean_{j != i} r_j``, which equals
    ``G / (G - 1) * (r_i - mean_g)``, scaled the same way.

    >>> compute_advantages(torch.tensor([[1.0, 0.0]]), scale_rewards="none")
    tensor([[ 0.5000, -0.5000]])

    A step with no group (every one dropped) has no advantages, and no warning about the std of
    nothing:

    >>> compute_advantages(torch.zeros(0, 4)).shape
    torch.Size([0, 4])
    """
    if rewards.ndim != 2 or rewards.shape[1] < 2:
        raise ValueError(
            f"rewards must have shape (prompts, group) with group >= 2, got {tuple(rewards.shape)}"
        )
    if rewards.shape[0] == 0:  # torch.std of an empty tensor warns "degrees of freedom <= 0"
        return torch.zeros(rewards.shape, dtype=torch.float32)
    if Estimator(estimator) is Estimator.EMA:
        raise ValueError(
            "advantage_estimator 'ema' needs the running baselines: call "
            "grpo_train.baselines.ema_advantages"
        )
    if valid is not None and not bool(valid.all()):
        return _masked_advantages(
            rewards, valid, Estimator(estimator), ScaleRewards(scale_rewards), eps
        )
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; score failures must be 0 with outcome error")
    rewards = rewards.double()
    group = rewards.shape[1]
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if Estimator(estimator) is Estimator.RLOO:
        centred = centred * group / (group - 1)
    scale = ScaleRewards(scale_rewards)
    if scale is ScaleRewards.GROUP:
        centred = centred / (rewards.std(dim=1, keepdim=True) + eps)
    elif scale is ScaleRewards.BATCH:
        centred = centred / (rewards.std() + eps)
    return centred.float()


def _masked_advantages(
    rewards: torch.Tensor,
    valid: torch.Tensor,
    estimator: Estimator,
    scale: ScaleRewards,
    eps: float,
) -> torch.Tensor:
    """``compute_advantages`` over the valid entries only (see its ``valid`` argument).

    >>> r = torch.tensor([[1.0, 0.0, 0.0, 5.0]])
    >>> v = torch.tensor([[True, True, False, False]])
    >>> _masked_advantages(r, v, Estimator.GRPO, ScaleRewards.NONE, 1e-4)
    tensor([[ 0.5000, -0.5000,  0.0000,  0.0000]])
    """
    if valid.shape != rewards.shape:
        raise ValueError(f"valid mask {tuple(valid.shape)} != rewards {tuple(rewards.shape)}")
    mask = valid.bool() & (valid.bool().sum(dim=1, keepdim=True) >= 2)  # drop thin groups
    w = mask.double()
    r = torch.where(mask, rewards.double(), torch.zeros((), dtype=torch.float64))
    if not torch.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf; score failures must be 0 with outcome error")
    n = w.sum(dim=1, keepdim=True)
    mean = r.sum(dim=1, keepdim=True) / n.clamp(min=1)
    centred = (r - mean) * w
    if estimator is Estimator.RLOO:
        centred = centred * n / (n - 1).clamp(min=1)
    if scale is ScaleRewards.GROUP:
        var = ((r - mean) * w).pow(2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
        std = var.sqrt()
        centred = centred / (std + eps)
    elif scale is ScaleRewards.BATCH:
        kept = r[mask]
        centred = centred / ((kept.std() if kept.numel() > 1 else kept.new_zeros(())) + eps)
    return torch.where(mask, centred, torch.zeros((), dtype=torch.float64)).float()


def informative_groups(
    rewards: torch.Tensor, mask: torch.Tensor | None = None, tol: float = 1e-6
) -> torch.Tensor:
    """Return a (P,) bool mask of the groups whose rewards do not all agree.

    The one definition of an informative group, used by dynamic sampling (``Group.informative``)
    and the logged share of equal-reward groups (``group_stats``). Only the rewards where
    ``mask`` is True count (the trainable ones: failed scores say nothing); rewards within
    ``tol`` of each other agree. A group where every counted reward agrees (or fewer than two
    count) has zero advantage everywhere and gives no gradient; DAPO's dynamic sampling
    (arXiv:2503.14476, section 3.2) drops such groups and refills the batch from further prompts.

    >>> r = torch.tensor([[1.0, 0.0], [1.0, 1.0 + 1e-9], [1.0, 0.0]])
    >>> informative_groups(r).tolist()
    [True, False, True]
    >>> informative_groups(r, torch.tensor([[True, True], [True, True], [True, False]])).tolist()
    [True, False, False]
    """
    r = rewards.double()
    if mask is None:
        mask = torch.ones_like(r, dtype=torch.bool)
    if r.shape[-1] == 0:
        return torch.zeros(r.shape[:-1], dtype=torch.bool)
    inf = torch.tensor(float("inf"), dtype=torch.float64)
    spread = (
        torch.where(mask, r, -inf).max(dim=-1).values - torch.where(mask, r, inf).min(dim=-1).values
    )
    return (mask.sum(dim=-1) > 1) & (spread > tol)


@dataclass(frozen=True)
class GroupStats:
    """Summary statistics of a (P, G) reward tensor, for logging."""

    reward_mean: float
    reward_std: float
    """Standard deviation over all rewards in the batch."""
    group_std_mean: float
    """Mean over groups of the in-group standard deviation."""
    frac_zero_std: float
    """Fraction of groups whose rewards all agree (no learning signal)."""


def group_stats(rewards: torch.Tensor) -> GroupStats:
    """Compute batch and in-group reward statistics of a (P, G) reward tensor."""
    flat = rewards.double().flatten()
    return GroupStats(
        reward_mean=float(flat.mean()),
        reward_std=float(flat.std()) if flat.numel() > 1 else 0.0,
        group_std_mean=float(rewards.double().std(dim=1).mean()),
        frac_zero_std=float((~informative_groups(rewards)).double().mean()),
    )
