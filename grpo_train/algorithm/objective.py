"""The clipped GRPO objective: pure tensor math over per-token tensors.

``grpo_loss`` is a pure function of per-token tensors, tested against hand computations; with it
the pieces the update weighs and selects by: each micro-batch's share of the batch loss
(``loss_share``), the truncated importance-sampling weights that correct for the gap between the
rollout engine's sampling log-probabilities and the trainer's (``truncated_is_weights``), and the
rows whose loss can have a gradient (``rows_with_gradient``). The tensors come from
``grpo_train.learner`` (micro-batches, the forward pass); the settings from ``ObjectiveSettings``,
built once from a run's configuration where the run is assembled.
"""

from __future__ import annotations

import torch

from grpo_train.algorithm.choices import ImportanceLevel, LossType, ObjectiveSettings


def importance_log_ratio(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    level: ImportanceLevel | str = ImportanceLevel.TOKEN,
) -> torch.Tensor:
    """Return the (B, T) log importance ratio the clipped objective uses, per token.

    ``token``: ``logp_t - old_t``. ``sequence`` (GSPO, arXiv:2507.18071, eq. 7 and its
    GSPO-token form, eq. 13): with ``l_i = mean over the completion's masked-in tokens of
    (logp_t - old_t)``, the sequence ratio is ``s_i = exp(l_i)`` (the geometric mean of the token
    ratios: ``(pi(y|x) / pi_old(y|x)) ** (1 / |y|)``), and every token gets

        log s_{i,t} = sg[l_i] + logp_t - sg[logp_t]

    whose value is ``l_i`` for every token and whose gradient is ``grad logp_t``: the token form
    the paper gives, through which ``s_{i,t} * A`` has the gradient ``s_i * A * grad logp_t``.
    Averaged over the sequence's tokens (``loss_type: grpo``) that is exactly GSPO's
    ``A * grad s_i``. Tokens outside ``mask`` (padding, a tool's output inside a multi-turn
    completion) count neither in ``|y|`` nor in the mean; a row with no masked-in token gets
    ratio 1. The clip of ``s_{i,t}`` then acts per sequence, since all its tokens share the value.

    >>> lp, old = torch.tensor([[-1.0, -2.0, -9.0]]), torch.tensor([[-1.5, -1.5, 0.0]])
    >>> importance_log_ratio(lp, old, torch.tensor([[1.0, 1.0, 0.0]]), "sequence")
    tensor([[0., 0., 0.]])
    """
    log_ratio = logprobs - old_logprobs
    if ImportanceLevel(level) is ImportanceLevel.TOKEN:
        return log_ratio
    weight = mask.to(log_ratio.dtype)
    seq = (log_ratio * weight).sum(dim=1, keepdim=True) / weight.sum(dim=1, keepdim=True).clamp(
        min=1
    )  # (B, 1)
    return seq.detach() + logprobs - logprobs.detach()


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = mask.sum()
    return float((values * mask).sum() / count) if count > 0 else 0.0


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = ObjectiveSettings.beta,
    epsilon_low: float = ObjectiveSettings.epsilon_low,
    epsilon_high: float = ObjectiveSettings.epsilon_high,
    loss_type: LossType | str = ObjectiveSettings.loss_type,
    max_completion_length: int | None = None,
    importance_weights: torch.Tensor | None = None,
    importance_sampling_level: ImportanceLevel | str = ObjectiveSettings.importance_sampling_level,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Compute the clipped GRPO policy-gradient loss, with optional k3 KL to a reference policy.

    Shapes: ``logprobs``, ``old_logprobs``, ``ref_logprobs``, ``mask``, ``importance_weights``
    are (B, T) per completion token; ``advantages`` is (B,). Per token, with
    ``ratio = exp(logprobs - old_logprobs)`` (``importance_sampling_level="token"``) or GSPO's
    length-normalised sequence ratio in its token form (``"sequence"``, see
    ``importance_log_ratio``: the same value on every token of a completion, clipped per
    sequence)::

        pg  = -min(ratio * A, clip(ratio, 1 - epsilon_low, 1 + epsilon_high) * A)
        kl  = exp(ref - logprobs) - (ref - logprobs) - 1        # k3 estimator (Schulman, 2020)
        per_token = importance_weight * pg + beta * kl

    then aggregated by ``loss_type`` (see ``LossType``). ``epsilon_high > epsilon_low`` is DAPO's
    clip-higher. The defaults are ``ObjectiveSettings``' (the configuration's).
    ``importance_weights`` (default 1) is the truncated IS correction from
    ``truncated_is_weights``.

    With ``beta = 0`` and one update per batch (mu = 1) the ratio is exactly 1 and the loss value
    is ``-mean(A)`` weighted by token counts, which is 0 when advantages are centred per group: the
    gradient is not 0 (see grpo_train/README.md, "Why is the loss 0?").

    Returns the scalar loss and float metrics: ``clip_frac_low`` (tokens with A < 0 whose ratio fell
    below ``1 - epsilon_low``), ``clip_frac_high`` (A > 0, ratio above ``1 + epsilon_high``),
    ``clip_frac`` (either), ``ratio_mean/min/max`` and ``kl`` (mean k3 over tokens; 0 without a
    reference).
    """
    kind = LossType(loss_type)
    _check_loss_inputs(logprobs, old_logprobs, advantages, mask, kind, max_completion_length)
    if beta > 0 and ref_logprobs is None:
        raise ValueError(
            "beta > 0 needs ref_logprobs (log-probabilities under the reference model)"
        )
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)  # (B, 1)
    ratio = torch.exp(importance_log_ratio(logprobs, old_logprobs, mask, importance_sampling_level))
    per_token = _clipped_surrogate(ratio, adv, epsilon_low, epsilon_high)  # (B, T)
    if importance_weights is not None:
        per_token = per_token * importance_weights.detach()
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None and beta > 0:
        kl = _k3_kl(ref_logprobs, logprobs)
        per_token = per_token + beta * kl
    loss = _aggregate(per_token, mask, kind, max_completion_length)
    return loss, _loss_metrics(ratio, adv, mask, kl, epsilon_low, epsilon_high)


def _check_loss_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kind: LossType,
    max_completion_length: int | None,
) -> None:
    """Raise ``ValueError`` naming the argument when shapes or the loss settings do not fit."""
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have the same (B, T) shape"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must have shape (B,) = {tuple(logprobs.shape[:1])}")
    if kind is LossType.DR_GRPO and not max_completion_length:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length (the token sum divisor)")


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> torch.Tensor:
    """Per-token PPO clipped objective, negated: ``-min(r A, clip(r, 1 - e_low, 1 + e_high) A)``.

    >>> _clipped_surrogate(torch.tensor([[1.5, 0.5]]), torch.tensor([[1.0]]), 0.2, 0.28)
    tensor([[-1.2800, -0.5000]])
    """
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.min(ratio * adv, clipped * adv)


def _k3_kl(ref_logprobs: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): ``exp(d) - d - 1``, ``d = ref - logp``.

    Unbiased and never negative (John Schulman, "Approximating KL Divergence", 2020).
    """
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def _aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, kind: LossType, max_completion_length: int | None
) -> torch.Tensor:
    """Reduce (B, T) per-token losses to the scalar loss by ``kind``'s unit (see ``LossType``)."""
    token_sum = (per_token * mask).sum(dim=1)  # (B,)
    if kind is LossType.GRPO:
        return (token_sum / mask.sum(dim=1).clamp(min=1)).mean()
    if kind is LossType.DR_GRPO:
        return token_sum.sum() / (per_token.shape[0] * float(max_completion_length or 1))
    return token_sum.sum() / mask.sum().clamp(min=1)


@torch.no_grad()
def _loss_metrics(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    kl: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> dict[str, float]:
    """Clip fractions, ratio statistics and mean KL over the trained tokens (``grpo_loss``)."""
    low = ((ratio < 1 - epsilon_low) & (adv < 0)).to(mask.dtype)
    high = ((ratio > 1 + epsilon_high) & (adv > 0)).to(mask.dtype)
    on = mask > 0
    return {
        "clip_frac_low": _masked_mean(low, mask),
        "clip_frac_high": _masked_mean(high, mask),
        "clip_frac": _masked_mean(low + high, mask),
        "ratio_mean": _masked_mean(ratio, mask),
        "ratio_min": float(ratio[on].min()) if on.any() else 1.0,
        "ratio_max": float(ratio[on].max()) if on.any() else 1.0,
        "kl": _masked_mean(kl, mask),
    }


def loss_share(
    loss_type: LossType | str, mask: torch.Tensor, total_tokens: int, total_seqs: int
) -> float:
    """Return the weight of one micro-batch's ``grpo_loss`` in the loss of the whole batch.

    Each aggregation is a mean over a unit (tokens for ``dapo``, sequences for ``grpo`` and
    ``dr_grpo``), so summing ``share * micro_loss`` over micro-batches gives exactly the full-batch
    loss, whatever the micro-batch split.
    """
    if LossType(loss_type) is LossType.DAPO:
        return float(mask.sum()) / max(total_tokens, 1)
    return mask.shape[0] / max(total_seqs, 1)


def truncated_is_weights(
    old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token truncated importance weights ``min(exp(old - sampling), cap)``; (B, T) each.

    The rollout engine samples with its own kernels (and precision), so its token log-probs differ
    from the trainer's: the batch is slightly off-policy. Truncated importance sampling (Yao et al.,
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", 2025; TRL's
    ``vllm_importance_sampling_cap``, verl's ``rollout_is``) reweights each token by the ratio of
    the trainer's probability to the sampler's, capped so rare tokens cannot blow up the gradient.
    Metrics: ``is_ratio_mean/min/max`` (before the cap) and ``is_capped_frac``.
    """
    ratio = torch.exp((old_logprobs - sampling_logprobs).detach())
    on = mask > 0
    metrics = {
        "is_ratio_mean": _masked_mean(ratio, mask.to(ratio.dtype)),
        "is_ratio_min": float(ratio[on].min()) if on.any() else 1.0,
        "is_ratio_max": float(ratio[on].max()) if on.any() else 1.0,
        "is_capped_frac": _masked_mean((ratio > cap).to(ratio.dtype), mask.to(ratio.dtype)),
    }
    return ratio.clamp(max=cap), metrics


def rows_with_gradient(advantages: torch.Tensor, weights: torch.Tensor, beta: float) -> list[int]:
    """Return the rows whose loss can have a non-zero gradient: the only ones worth a forward pass.

    A row's per-token loss is ``w * -min(r * A, clip(r) * A) + beta * kl`` on its masked tokens.
    With ``beta == 0`` and ``A == 0`` it is exactly 0 whatever the ratio ``r``, and so is its
    gradient; a row with loss weight 0 (``weights``: 0 for masked truncations and padding groups)
    has no unmasked token at all. Skipping them changes nothing but time, provided the loss
    normalisers (``loss_share``'s token and sequence totals) still count every row. Groups whose
    rewards all agree are common (every sample wrong early in training), and each is
    ``num_generations`` rows. At least one row is kept, so that every rank runs a backward pass
    (DDP's collectives) and every parameter gets a gradient (0) for the optimizer step.

    >>> rows_with_gradient(torch.tensor([0.5, 0.0, -0.5, 0.2]), torch.tensor([1, 1, 1, 0]), 0.0)
    [0, 2]
    >>> rows_with_gradient(torch.tensor([0.0, 0.0]), torch.ones(2), beta=0.0)
    [0]
    """
    return live_rows(advantages, weights, beta) or list(range(min(1, advantages.shape[0])))


def live_rows(advantages: torch.Tensor, weights: torch.Tensor, beta: float) -> list[int]:
    """Return the rows whose loss can have a non-zero gradient (possibly none).

    >>> live_rows(torch.tensor([0.0, 0.3]), torch.tensor([1, 1]), beta=0.0)
    [1]
    """
    live = weights != 0
    if beta == 0:
        live = live & (advantages != 0)
    return [int(i) for i in live.nonzero().flatten()]
