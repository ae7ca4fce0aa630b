"""Group-relative advantages and group statistics: pure functions on a (P, G) reward tensor.

``P`` prompts, ``G`` completions per prompt (the group). Every function here is checked against a
hand computation in ``tests/grpo_train/algorithm/test_advantages.py``. The choices (``Estimator``,
``ScaleRewards``) are defined in ``grpo_train.algorithm.choices``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_train.algorithm.choices import Estimator, ScaleRewards

__all__ = [
    "MIN_SCORED",
    "Estimator",
    "GroupStats",
    "ScaleRewards",
    "compute_advantages",
    "group_stats",
    "informative_groups",
    "masked_rewards",
    "scale_centred",
    "trainable_mask",
]


#: A group-relative advantage needs at least this many scored completions in a group: a lone
#: completion has nothing to be compared with. The one definition of the rule, used by the group
#: estimators (``compute_advantages``), the EMA baseline (``baselines.ema_advantages``), a step's
#: groups (``groups.Group.dropped``) and dynamic sampling (``informative_groups``).
MIN_SCORED = 2


def trainable_mask(valid: torch.Tensor) -> torch.Tensor:
    """Return the (P, G) bool mask of the valid rewards in groups with ``MIN_SCORED`` of them.

    >>> trainable_mask(torch.tensor([[True, True, False], [True, False, False]])).tolist()
    [[True, True, False], [False, False, False]]
    """
    valid = valid.bool()
    return valid & (valid.sum(dim=1, keepdim=True) >= MIN_SCORED)


def masked_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return ``rewards`` in float64 with 0 outside ``mask``; raise if a kept one is NaN or inf."""
    if mask.shape != rewards.shape:
        raise ValueError(f"valid mask {tuple(mask.shape)} != rewards {tuple(rewards.shape)}")
    r = torch.where(mask, rewards.double(), torch.zeros((), dtype=torch.float64))
    if not torch.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf; score failures must be 0 with outcome error")
    return r


def scale_centred(
    centred: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    scale: ScaleRewards | str,
    eps: float = 1e-4,
) -> torch.Tensor:
    """Divide centred (P, G) rewards by the std ``scale`` names, over the masked rewards only.

    ``group``: each group's unbiased (n - 1) std, as ``torch.std`` computes it (TRL); ``batch``:
    the std of every masked reward of the batch; ``none``: no division. ``eps`` is added to the
    std. ``rewards`` are the raw rewards, 0 outside ``mask`` (``masked_rewards``).

    >>> r = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    >>> centred = r - r.mean(dim=1, keepdim=True)
    >>> scale_centred(centred, r, torch.ones(2, 2, dtype=torch.bool), "batch", eps=0.0).tolist()
    [[1.0, -1.0], [0.0, 0.0]]
    """
    scale = ScaleRewards(scale)
    if scale is ScaleRewards.GROUP:
        w = mask.double()
        n = w.sum(dim=1, keepdim=True)
        mean = rewards.sum(dim=1, keepdim=True) / n.clamp(min=1)
        var = ((rewards - mean) * w).pow(2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
        return centred / (var.sqrt() + eps)
    if scale is ScaleRewards.BATCH:
        kept = rewards[mask]
        return centred / ((kept.std() if kept.numel() > 1 else kept.new_zeros(())) + eps)
    return centred


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
    advantage 0, and a group with fewer than ``MIN_SCORED`` valid rewards is dropped (all 0): a
    zero standing in for a failed score would otherwise shift the baseline and push the policy
    towards whatever happens not to crash the scorer.

    GRPO: ``(r - mean_g) / (std_g + eps)`` with ``std_g`` the unbiased (n - 1) standard deviation
    of the group, as TRL computes it (``torch.std``); with ``scale_rewards="batch"`` the std of all
    ``P * G`` rewards, with ``"none"`` no division (``scale_centred``). RLOO:
    ``r_i - mean_{j != i} r_j``, which equals ``n / (n - 1) * (r_i - mean_g)``, scaled the same way.

    >>> compute_advantages(torch.tensor([[1.0, 0.0]]), scale_rewards="none")
    tensor([[ 0.5000, -0.5000]])
    >>> r = torch.tensor([[1.0, 0.0, 0.0, 5.0]])
    >>> v = torch.tensor([[True, True, False, False]])
    >>> compute_advantages(r, scale_rewards="none", valid=v)
    tensor([[ 0.5000, -0.5000,  0.0000,  0.0000]])

    A step with no group (every one dropped) has no advantages, and no warning about the std of
    nothing:

    >>> compute_advantages(torch.zeros(0, 4)).shape
    torch.Size([0, 4])
    """
    if rewards.ndim != 2 or rewards.shape[1] < MIN_SCORED:
        raise ValueError(
            f"rewards must have shape (prompts, group) with group >= {MIN_SCORED}, got "
            f"{tuple(rewards.shape)}"
        )
    if rewards.shape[0] == 0:  # torch.std of an empty tensor warns "degrees of freedom <= 0"
        return torch.zeros(rewards.shape, dtype=torch.float32)
    if Estimator(estimator) is Estimator.EMA:
        raise ValueError(
            "advantage_estimator 'ema' needs the running baselines: call "
            "grpo_train.algorithm.baselines.ema_advantages"
        )
    mask = trainable_mask(torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid)
    r = masked_rewards(rewards, mask)
    w = mask.double()
    n = w.sum(dim=1, keepdim=True)
    centred = (r - r.sum(dim=1, keepdim=True) / n.clamp(min=1)) * w
    if Estimator(estimator) is Estimator.RLOO:
        centred = centred * n / (n - 1).clamp(min=1)
    scaled = scale_centred(centred, r, mask, scale_rewards, eps)
    return torch.where(mask, scaled, torch.zeros((), dtype=torch.float64)).float()


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
    return (mask.sum(dim=-1) >= MIN_SCORED) & (spread > tol)


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
