"""The clipped GRPO objective and the per-token tensors it needs.

``grpo_loss`` is a pure function of per-token tensors, tested against hand computations. The rest of
the module builds those tensors: token-budget micro-batches of (prompt, completion) pairs, the
policy's per-token log-probabilities and entropies, and the truncated importance-sampling weights
that correct for the gap between the rollout engine's sampling log-probabilities and the trainer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from grpo_train.algorithm.choices import ImportanceLevel, LossType
from grpo_train.config import AlgorithmConfig
from grpo_train.learner.logprobs import (
    DEFAULT_HEAD,
    HeadChoice,
    chunked_logprobs,
    fused_logprobs,
    plain_logprobs,
)


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
    beta: float = AlgorithmConfig.beta,
    epsilon_low: float = AlgorithmConfig.epsilon_low,
    epsilon_high: float = AlgorithmConfig.epsilon_high,
    loss_type: LossType | str = AlgorithmConfig.loss_type,
    max_completion_length: int | None = None,
    importance_weights: torch.Tensor | None = None,
    importance_sampling_level: ImportanceLevel | str = AlgorithmConfig.importance_sampling_level,
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
    clip-higher. The defaults are the configuration's (``config.AlgorithmConfig``).
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


@dataclass(frozen=True)
class MicroBatch:
    """Padded (prompt, completion) pairs for one forward pass.

    Prompts are left-padded and completions right-padded, so every completion starts at column
    ``P`` and the last ``C + 1`` logits cover all completion tokens.
    """

    rows: tuple[int, ...]
    """Indices of these pairs in the full batch."""
    input_ids: torch.Tensor  # (B, P + C)
    attention_mask: torch.Tensor  # (B, P + C)
    position_ids: torch.Tensor  # (B, P + C)
    completion_ids: torch.Tensor  # (B, C)
    completion_mask: torch.Tensor  # (B, C): 1 on real completion tokens
    targets: torch.Tensor | None = None
    """Packed (``make_micro_batches(packed=True)``): the rows are one (1, N) sequence, each
    row's ``position_ids`` restarting at 0, and ``targets`` (T,) are the columns whose logits
    predict the T real completion tokens (row by row, the order of ``completion_mask``'s ones).
    The model then runs without an attention mask (see ``token_logprobs``). None: padded."""

    def to(self, device: str) -> MicroBatch:
        """Return this micro-batch with its tensors on ``device`` (they are built on the CPU)."""
        if device == "cpu":
            return self
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            completion_ids=self.completion_ids.to(device),
            completion_mask=self.completion_mask.to(device),
            targets=self.targets.to(device) if self.targets is not None else None,
        )


def make_micro_batches(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    token_budget: int,
    pad_id: int,
    select: Sequence[int] | None = None,
    group_prompts: bool = False,
    packed: bool = False,
) -> list[MicroBatch]:
    """Split pairs into micro-batches whose padded size (rows x longest row) fits ``token_budget``.

    Pairs are sorted by length first so that similar lengths share a micro-batch (less padding);
    a pair longer than the budget gets a micro-batch of its own. ``select``: only these pairs
    (e.g. ``rows_with_gradient``); ``MicroBatch.rows`` still index the full lists.
    ``group_prompts``: sort by prompt instead (length, then tokens), so that the completions of
    one prompt share micro-batches and ``token_logprobs(share_prompts=True)`` runs the prompt once.
    ``packed``: no padding at all; each micro-batch is its pairs end to end in one sequence
    (``MicroBatch.targets``) of at most ``token_budget`` real tokens (a longer pair alone).
    """
    chosen = range(len(prompts)) if select is None else select
    if packed:
        return _pack_groups(prompts, completions, chosen, token_budget, pad_id)
    groups = _padded_groups(prompts, completions, chosen, token_budget, group_prompts)
    return [
        _pad([prompts[i] for i in g], [completions[i] for i in g], tuple(g), pad_id) for g in groups
    ]


def _padded_groups(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    chosen: Sequence[int] | range,
    token_budget: int,
    group_prompts: bool,
) -> list[list[int]]:
    """Return the rows of each padded micro-batch (``make_micro_batches`` without ``packed``)."""

    def total(i: int) -> int:
        return len(prompts[i]) + len(completions[i])

    if group_prompts:
        order = sorted(chosen, key=lambda i: (len(prompts[i]), tuple(prompts[i]), total(i)))
    else:
        order = sorted(chosen, key=total)
    groups: list[list[int]] = []
    longest = 0
    for i in order:
        if groups and (len(groups[-1]) + 1) * max(longest, total(i)) <= token_budget:
            groups[-1].append(i)
            longest = max(longest, total(i))
        else:
            groups.append([i])
            longest = total(i)
    return groups


#: Attention implementations that take a custom (B, 1, Q, K) mask, which the completion bins
#: need (a bin's completions attend to the cached prompt and each to itself): transformers
#: passes a 4-D mask through unchanged to these two; flash-attention kernels take no mask.
_MASKED_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class ForwardCost:
    """What a forward costs, in token positions: for ``packing_pays``.

    A token position costs its share of every layer's projections and MLP and of the vocabulary
    head; a query-key pair of attention costs ``pair_weight`` of that. ``varlen``: packed rows
    attend only within themselves (flash-attention's varlen kernels); otherwise attention runs
    over the whole pack under a block-diagonal mask (SDPA and eager: quadratic in the pack).
    """

    pair_weight: float = 0.0
    varlen: bool = True
    bins: bool = False
    """The attention takes a custom mask (``_MASKED_ATTENTION``), so the shared-prompt forward
    runs its completions in bins (``completion_bins``) rather than one padded row each."""

    @classmethod
    def of(cls, config: Any) -> ForwardCost:
        """Return the cost weights of a transformers decoder config (multiply-adds).

        Per layer, a position runs q/k/v/o (about 4 h^2) and the MLP (3 h i); the head adds h V
        once; a pair costs 2 h (its score and its share of the weighted sum).

        >>> from types import SimpleNamespace as C
        >>> round(1 / ForwardCost.of(C(hidden_size=576, intermediate_size=1536,
        ...     num_hidden_layers=30, vocab_size=49152)).pair_weight)
        4275
        """
        h = int(getattr(config, "hidden_size", 0) or 0)
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        if h <= 0 or layers <= 0:
            return cls()
        inner = int(getattr(config, "intermediate_size", 0) or 4 * h)
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        position = layers * (4 * h * h + 3 * h * inner) + h * vocab
        implementation = str(getattr(config, "_attn_implementation", "") or "")
        return cls(
            pair_weight=layers * 2 * h / position,
            varlen="flash" in implementation,
            bins=implementation in _MASKED_ATTENTION,
        )


def packing_pays(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    token_budget: int,
    select: Sequence[int] | None = None,
    cost: ForwardCost = ForwardCost(),
) -> bool:
    """Whether packed rows cost less to run than the shared-prompt forward over padded rows.

    The two save different waste. The shared-prompt forward (``token_logprobs(share_prompts=
    True)``) runs each distinct prompt of a micro-batch once but pads every completion to the
    micro-batch's longest; packing runs every row's own prompt again but pads nothing. So the
    shared forward costs, per padded micro-batch, (distinct prompts x longest prompt) + (rows x
    longest completion) positions (rows x longest row where no prompt repeats: then it runs
    the plain forward); packing costs the real tokens of every row, prompt included. Attention
    adds ``cost.pair_weight`` per query-key pair: each prompt over itself and each padded
    completion over prompt and completion; a pack over itself (``cost.varlen``: each row over
    itself).

    Uniform lengths: the shared forward wins (8 completions of 10 tokens under one 30-token
    prompt: 30 + 80 positions against 8 x 40 = 320). A 40x length spread: packing wins (one
    400-token completion pads seven 10-token ones to 400: 30 + 3,200 against 710).

    >>> packing_pays([[1] * 30] * 8, [[2] * 10] * 8, 10_000)
    False
    >>> packing_pays([[1] * 30] * 8, [[2] * 400] + [[2] * 10] * 7, 10_000)
    True
    >>> packing_pays([[1] * 30] * 8, [[2] * 400] + [[2] * 10] * 7, 10_000, select=[1, 2])
    False

    Attention can turn it: 32 rows of 100 tokens and one of 200 save positions packed (4,260
    against 6,430), but a dense mask over the 4,260-token pack costs 18.1 M pairs against the
    padded rows' 1.5 M; with SmolLM2-135M's weights (``ForwardCost.of``: a position is worth
    4,275 pairs) the shared forward wins, with varlen kernels packing does:

    >>> prompts, completions = [[1] * 30] * 32, [[2] * 200] + [[2] * 100] * 31
    >>> packing_pays(prompts, completions, 10**6)
    True
    >>> smollm2 = ForwardCost(pair_weight=1 / 4275, varlen=False)
    >>> packing_pays(prompts, completions, 10**6, cost=smollm2)
    False
    >>> packing_pays(prompts, completions, 10**6, cost=replace(smollm2, varlen=True))
    True

    Where the attention takes a custom mask (``ForwardCost.bins``: SDPA, eager), the shared
    forward's completions share bins as long as the longest (``completion_bins``): 17 rows of
    200 instead of 32, fewer positions than the pack (3,430 against 4,260) even before attention:

    >>> packing_pays(prompts, completions, 10**6, cost=ForwardCost(bins=True))
    False
    """
    chosen = range(len(prompts)) if select is None else select
    packed_positions = sum(len(prompts[i]) + len(completions[i]) for i in chosen)
    packed_pairs = 0
    if cost.pair_weight:
        for rows in _packed_groups(prompts, completions, chosen, token_budget):
            lengths = [len(prompts[i]) + len(completions[i]) for i in rows]
            packed_pairs += sum(n * n for n in lengths) if cost.varlen else sum(lengths) ** 2
    shared_positions = shared_pairs = 0
    for rows in _padded_groups(prompts, completions, chosen, token_budget, group_prompts=True):
        distinct = len({tuple(prompts[i]) for i in rows})
        longest_prompt = max(len(prompts[i]) for i in rows)
        longest_completion = max(1, max(len(completions[i]) for i in rows))
        prompt_rows = distinct if distinct < len(rows) else len(rows)
        completion_rows = len(rows)
        if distinct < len(rows) and cost.bins:
            owners = [tuple(prompts[i]) for i in rows]
            owner_ids = [owners.index(o) for o in owners]
            lengths = [len(completions[i]) for i in rows]
            completion_rows = len(completion_bins(lengths, owner_ids, longest_completion))
        shared_positions += prompt_rows * longest_prompt + completion_rows * longest_completion
        shared_pairs += prompt_rows * longest_prompt**2
        shared_pairs += completion_rows * longest_completion * (longest_prompt + longest_completion)
    packed = packed_positions + cost.pair_weight * packed_pairs
    shared = shared_positions + cost.pair_weight * shared_pairs
    return packed < shared


def _pack_groups(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    chosen: Sequence[int] | range,
    token_budget: int,
    pad_id: int,
) -> list[MicroBatch]:
    """Cut pairs into packs of at most ``token_budget`` real tokens (first fit, longest first).

    A pair longer than the budget gets a pack of its own.
    """
    if any(len(prompts[i]) == 0 for i in chosen):
        raise ValueError("packed micro-batches need a non-empty prompt in every pair")
    packs = _packed_groups(prompts, completions, chosen, token_budget)
    return [
        _pack([prompts[i] for i in g], [completions[i] for i in g], tuple(g), pad_id) for g in packs
    ]


def _packed_groups(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    chosen: Sequence[int] | range,
    token_budget: int,
) -> list[list[int]]:
    """Return the rows of each pack (``_pack_groups``): first fit, longest first."""
    order = sorted(chosen, key=lambda i: -(len(prompts[i]) + len(completions[i])))
    packs: list[list[int]] = []
    sizes: list[int] = []
    for i in order:
        size = len(prompts[i]) + len(completions[i])
        fit = next((k for k, used in enumerate(sizes) if used + size <= token_budget), None)
        if fit is None:
            packs.append([i])
            sizes.append(size)
        else:
            packs[fit].append(i)
            sizes[fit] += size
    return packs


def _pack(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    rows: tuple[int, ...],
    pad_id: int,
) -> MicroBatch:
    """One (1, N) sequence of the pairs end to end; positions restart at 0 for each pair."""
    ids: list[int] = []
    positions: list[int] = []
    targets: list[int] = []
    for p, c in zip(prompts, completions):
        start = len(ids)
        ids += [*p, *c]
        positions += range(len(p) + len(c))
        targets += range(start + len(p) - 1, start + len(p) - 1 + len(c))
    padded = _pad([[pad_id]] * len(rows), completions, rows, pad_id)  # (B, C) completion layout
    sequence = torch.tensor([ids], dtype=torch.long)
    return MicroBatch(
        rows,
        sequence,
        torch.ones_like(sequence),
        torch.tensor([positions], dtype=torch.long),
        padded.completion_ids,
        padded.completion_mask,
        torch.tensor(targets, dtype=torch.long),
    )


def _pad(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    rows: tuple[int, ...],
    pad_id: int,
) -> MicroBatch:
    p_len = max(len(p) for p in prompts)
    c_len = max(1, max(len(c) for c in completions))
    batch = len(prompts)
    ids = torch.full((batch, p_len + c_len), pad_id, dtype=torch.long)
    attn = torch.zeros((batch, p_len + c_len), dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompts, completions)):
        ids[b, p_len - len(p) : p_len] = torch.tensor(list(p), dtype=torch.long)
        ids[b, p_len : p_len + len(c)] = torch.tensor(list(c), dtype=torch.long)
        attn[b, p_len - len(p) : p_len + len(c)] = 1
    # Left padding shifts positions: count them from the first real token, as HF generate does.
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return MicroBatch(rows, ids, attn, pos, ids[:, p_len:], attn[:, p_len:])


def token_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = False,
    head: HeadChoice = DEFAULT_HEAD,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of each completion token under ``model``: (B, C), plus entropy (B, C).

    Logits are divided by the sampling temperature so that they describe the distribution the
    engine sampled from (as TRL does). Only the last ``C + 1`` positions' logits are materialised
    (``logits_to_keep``), never the (B, P + C, V) tensor, and no float32 (B, C, V) tensor is kept
    for the backward: ``head`` picks the chunked log-softmax over the logits (bitwise the plain
    formula) or the fused, chunked lm_head over the final hidden states (no logits at all; see
    ``grpo_train.learner.logprobs``). ``share_prompts``: rows with the same prompt (a GRPO group)
    run it once (``_shared_prompt_forward``); same values and gradients.
    """
    c_len = mb.completion_ids.shape[1]
    output = output_layer(model)
    weight = output.weight if output is not None else None
    vocab = int(weight.shape[0]) if isinstance(weight, torch.Tensor) else 0
    if mb.targets is not None:
        return _packed_logprobs(model, mb, temperature, with_entropy, head, output, vocab)
    fused = output is not None and head.fuses(mb.completion_ids.numel(), vocab)
    if fused and output is not None:
        states = completion_hidden_states(model, mb, share_prompts, output)
        if states is not None:
            return fused_logprobs(
                output, states, mb.completion_ids, temperature, with_entropy, vocab=vocab
            )
    elif share_prompts:
        shared = _shared_prompt_forward(model, mb)
        if shared is not None:
            lp_first, ent_first = chunked_logprobs(
                shared.first, mb.completion_ids[:, :1], temperature, with_entropy
            )
            if shared.bins is None:  # (B, C, V): position t predicts token t + 1
                lp_rest, ent_rest = chunked_logprobs(
                    shared.rest, mb.completion_ids[:, 1:], temperature, with_entropy
                )
            else:  # (N, C, V) in bins: each position's own next token, then back to the rows
                lp_bins, ent_bins = chunked_logprobs(
                    shared.rest, shared.bins.targets, temperature, with_entropy
                )
                lp_rest = shared.bins.to_rows(lp_bins)
                ent_rest = None if ent_bins is None else shared.bins.to_rows(ent_bins)
            entropy = None
            if ent_first is not None and ent_rest is not None:
                entropy = torch.cat([ent_first, ent_rest], dim=1)
            return torch.cat([lp_first, lp_rest], dim=1), entropy
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        logits_to_keep=c_len + 1,
        use_cache=False,
    )
    # (B, C + 1, V): position t predicts token t + 1 (the last position predicts nothing)
    return chunked_logprobs(out.logits, mb.completion_ids, temperature, with_entropy)


def completion_hidden_states(
    model: torch.nn.Module,
    mb: MicroBatch,
    share_prompts: bool = False,
    output: torch.nn.Module | None = None,
) -> torch.Tensor | None:
    """Return the (B, C, H) final hidden states whose output layer predicts the completion tokens.

    Column t is the lm_head's input at the position predicting ``mb.completion_ids[:, t]``, in
    the padded (B, C) layout whatever the micro-batch (a packed one's states are scattered into
    it: zeros past each completion's end). For the fused head and Liger's loss, which run the
    head themselves, chunk by chunk. ``share_prompts``: each distinct prompt runs once
    (``_shared_prompt_forward``). None where ``output`` (default: the model's output layer) does
    not give the model's own logits from these states (soft-capped or scaled logits, FSDP).
    """
    output = output if output is not None else output_layer(model)
    if output is None:
        return None
    c_len = mb.completion_ids.shape[1]
    if mb.targets is not None:
        out = model(
            input_ids=mb.input_ids,
            position_ids=mb.position_ids,
            use_cache=False,
            logits_to_keep=1,
            output_hidden_states=True,
        )
        hidden = out.hidden_states[-1]  # (1, N, H)
        if not _feeds_head(output, hidden, out.logits):
            return None
        on = mb.completion_mask.bool()
        states = hidden.new_zeros((*on.shape, hidden.shape[-1]))
        states[on] = hidden[0, mb.targets]
        return states
    if share_prompts:
        shared = _shared_prompt_forward(model, mb, hidden=True)
        if shared is not None:
            rest = shared.rest[:, :-1] if shared.bins is None else shared.bins.to_rows(shared.rest)
            return torch.cat([shared.first, rest], dim=1)  # (B, 1, H) + (B, C - 1, H)
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        logits_to_keep=1,
        output_hidden_states=True,
        use_cache=False,
    )
    hidden = out.hidden_states[-1]  # (B, P + C, H): the lm_head's input
    if not _feeds_head(output, hidden, out.logits):
        return None
    p_len = mb.input_ids.shape[1] - c_len
    return hidden[:, p_len - 1 : p_len - 1 + c_len]


def _packed_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float,
    with_entropy: bool,
    head: HeadChoice,
    output: torch.nn.Module | None,
    vocab: int,
    use_cache: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return ``token_logprobs`` of a packed micro-batch, (B, C) as a padded one's (0 on pads).

    No attention mask and no cache: transformers then derives a block-diagonal causal mask from
    the restarting ``position_ids`` (``masking_utils.find_packed_sequence_indices``; its flash-
    attention path runs varlen kernels from them). With a cache (``use_cache=True``, kept only
    so that a test can show it) that detection is skipped and packed rows attend to each other.
    """
    assert mb.targets is not None
    on = mb.completion_mask.bool()
    tokens = mb.completion_ids[on].unsqueeze(0)  # (1, T), row by row
    inputs = {"input_ids": mb.input_ids, "position_ids": mb.position_ids, "use_cache": use_cache}
    logprobs = entropy = None
    if output is not None and head.fuses(tokens.numel(), vocab):
        out = model(**inputs, logits_to_keep=1, output_hidden_states=True)
        hidden = out.hidden_states[-1]  # (1, N, H)
        if _feeds_head(output, hidden, out.logits):
            logprobs, entropy = fused_logprobs(
                output, hidden[:, mb.targets], tokens, temperature, with_entropy, vocab=vocab
            )
        del out, hidden
    if logprobs is None:
        out = model(**inputs, logits_to_keep=mb.targets)  # (1, T, V)
        logprobs, entropy = chunked_logprobs(out.logits, tokens, temperature, with_entropy)
    shaped = torch.zeros(on.shape, dtype=logprobs.dtype, device=logprobs.device)
    shaped = shaped.masked_scatter(on, logprobs[0])
    if entropy is not None:
        entropy = torch.zeros_like(shaped).masked_scatter(on, entropy[0])
    return shaped, entropy


def _logprobs_from_logits(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return the (B, C) logprobs of ``token_ids`` under (B, C, V) ``logits / temperature``.

    The plain formula (``logprobs.plain_logprobs``), which keeps the full float32 log-softmax
    for the backward; the update uses ``chunked_logprobs``, bitwise the same.
    """
    return plain_logprobs(logits, token_ids, temperature, with_entropy)


def output_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """Return the model's lm_head module (inside DDP / peft wrappers), or None.

    None where it cannot be called on its own: no output layer, no 2-D weight, or parameters
    sharded by FSDP (gathered only inside the wrapper's forward).
    """
    inner: Any = model
    for _ in range(4):  # DDP's .module, peft's base model
        if any("FullySharded" in c.__name__ or "FSDP" in c.__name__ for c in type(inner).__mro__):
            return None
        if hasattr(inner, "module") and isinstance(inner.module, torch.nn.Module):
            inner = inner.module
        elif hasattr(inner, "get_base_model"):
            inner = inner.get_base_model()
        else:
            break
    getter = getattr(inner, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    weight = getattr(head, "weight", None)
    if not isinstance(head, torch.nn.Module) or not isinstance(weight, torch.Tensor):
        return None
    if weight.dim() != 2 or any(
        "FullySharded" in type(m).__name__ or "FSDP" in type(m).__name__ for m in model.modules()
    ):
        return None
    return head


@torch.no_grad()
def _feeds_head(head: torch.nn.Module, hidden: torch.Tensor, logits: torch.Tensor) -> bool:
    """Whether ``head(hidden)`` gives the model's own logits (checked on the last position).

    The fused head assumes the model's logits are exactly its output layer applied to the last
    hidden state. Models that scale, soft-cap or otherwise post-process their logits (and
    ``output_hidden_states`` that returns the state before the final norm) fail this check and
    use the chunked path over their real logits instead.
    """
    mine = head(hidden[:, -1:]).float()
    theirs = logits[:, -1:].float()
    if mine.shape != theirs.shape:
        return False
    tolerance = 1e-4 if logits.dtype == torch.float32 else 2e-2
    scale = 1.0 + float(theirs.abs().max())
    return float((mine - theirs).abs().max()) <= tolerance * scale


def completion_bins(
    lengths: Sequence[int], owners: Sequence[int], capacity: int
) -> list[list[int]]:
    """Rows of each bin: completions of one prompt end to end, at most ``capacity`` tokens a bin.

    First fit, longest first, per prompt (``owners``: the prompt of each row). With ``capacity``
    the longest completion, the bins never hold more token positions than the padded rows (one
    bin per row at worst) and never more attention pairs, so the shared-prompt forward runs its
    completions in bins without a cost model. Returns bins in order of their first row.

    >>> completion_bins([64, 20, 30, 64, 10, 50], [0, 0, 0, 1, 1, 1], 64)
    [[0], [2, 1], [3], [5, 4]]
    >>> completion_bins([5, 5], [0, 1], 64)  # different prompts never share a bin
    [[0], [1]]
    """
    bins: list[list[int]] = []
    used: list[int] = []
    bin_owner: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        fit = next(
            (
                k
                for k in range(len(bins))
                if bin_owner[k] == owners[row] and used[k] + lengths[row] <= capacity
            ),
            None,
        )
        if fit is None:
            bins.append([row])
            used.append(lengths[row])
            bin_owner.append(owners[row])
        else:
            bins[fit].append(row)
            used[fit] += lengths[row]
    return sorted(bins, key=min)


@dataclass(frozen=True)
class _Bins:
    """A micro-batch's completions in bins (``completion_bins``) after the shared prompt cache."""

    owner: torch.Tensor  # (N,): the distinct prompt of each bin
    input_ids: torch.Tensor  # (N, C)
    position_ids: torch.Tensor  # (N, C)
    allowed: torch.Tensor  # (N, 1, C, P + C) bool: the query may attend to the key
    targets: torch.Tensor  # (N, C): the token each bin position predicts (0 where none)
    source: torch.Tensor  # (B, C - 1): the flat bin position predicting completion token t + 1
    valid: torch.Tensor  # (B, C - 1) bool: that token exists

    def to_rows(self, values: torch.Tensor) -> torch.Tensor:
        """(N, C, ...) per bin position -> (B, C - 1, ...) per completion token 1.., 0 past ends."""
        flat = values.reshape(-1, *values.shape[2:])
        rows = flat.index_select(0, self.source.flatten()).reshape(
            *self.source.shape, *values.shape[2:]
        )
        mask = self.valid.reshape(*self.valid.shape, *([1] * (values.dim() - 2)))
        return rows * mask.to(rows.dtype)


def _bins_of(mb: MicroBatch, owner: torch.Tensor, prompt_mask: torch.Tensor) -> _Bins | None:
    """Return the completion bins of ``mb`` (row r of prompt ``owner[r]``); None if one per row."""
    c_len = mb.completion_ids.shape[1]
    p_len = prompt_mask.shape[1]
    lengths = [int(n) for n in mb.completion_mask.sum(dim=1).tolist()]
    owners = [int(u) for u in owner.tolist()]
    bins = completion_bins(lengths, owners, c_len)
    if c_len < 2 or len(bins) == len(lengths):
        return None
    n, device = len(bins), mb.completion_ids.device
    ids = torch.zeros((n, c_len), dtype=torch.long, device=device)
    targets = torch.zeros_like(ids)
    offsets = torch.zeros_like(ids)  # token index within its completion
    # The row each bin position holds; free positions get ids of their own (-1, -2, ...).
    segment = -1 - torch.arange(n * c_len, device=device).reshape(n, c_len)
    source = torch.zeros((len(lengths), c_len - 1), dtype=torch.long, device=device)
    valid = torch.zeros((len(lengths), c_len - 1), dtype=torch.bool, device=device)
    for k, rows in enumerate(bins):
        start = 0
        for r in (r for r in rows if lengths[r]):
            end = start + lengths[r]
            ids[k, start:end] = mb.completion_ids[r, : lengths[r]]
            targets[k, start : end - 1] = mb.completion_ids[r, 1 : lengths[r]]
            offsets[k, start:end] = torch.arange(lengths[r], device=device)
            segment[k, start:end] = r
            source[r, : lengths[r] - 1] = k * c_len + torch.arange(start, end - 1, device=device)
            valid[r, : lengths[r] - 1] = True
            start = end
    bin_owner = torch.tensor([owners[rows[0]] for rows in bins], dtype=torch.long, device=device)
    # Query q may attend to key j of its bin where both hold the same completion and j is not
    # after q (a free position: only itself, so no softmax is empty); and to its real prompt.
    allowed = torch.empty((n, 1, c_len, p_len + c_len), dtype=torch.bool, device=device)
    allowed[:, 0, :, :p_len] = prompt_mask.bool()[bin_owner][:, None, :]
    same = allowed[:, 0, :, p_len:]
    torch.eq(segment[:, :, None], segment[:, None, :], out=same)
    same &= offsets[:, None, :] <= offsets[:, :, None]
    positions = prompt_mask.sum(dim=1)[bin_owner][:, None] + offsets
    return _Bins(bin_owner, ids, positions, allowed, targets, source, valid)


@dataclass(frozen=True)
class _SharedForward:
    """Outputs of ``_shared_prompt_forward``: logits (or final hidden states) of the completions.

    ``first`` (B, 1, X) predicts each row's first completion token. ``rest``: (B, C, X) in the
    rows' padded layout (position t predicts token t + 1) when ``bins`` is None, else (N, C, X)
    in the bins' layout (``_Bins.targets`` / ``_Bins.to_rows`` map it back to the rows).
    """

    first: torch.Tensor
    rest: torch.Tensor
    bins: _Bins | None


def _shared_prompt_forward(
    model: torch.nn.Module, mb: MicroBatch, hidden: bool = False
) -> _SharedForward | None:
    """Logits for the completion tokens with each distinct prompt run once; None if not worth it.

    A GRPO group is ``n`` completions of one prompt, and the prompt is often as long as the
    completions: the plain forward runs it ``n`` times. Here the distinct prompts run once with a
    KV cache, their keys and values are repeated for each row (``index_select``, whose backward
    sums the rows' gradients back into the one prompt pass), and the completions run on top.
    Where the model's attention takes a custom mask (``_MASKED_ATTENTION``), short completions
    of one prompt share a row (``completion_bins``): each attends to the prompt and to itself,
    and the padding to the longest completion shrinks (GRPO groups mix truncated and short
    answers). Causal attention makes every logit the same as in the plain forward, up to float
    rounding. ``hidden``: the final hidden states instead of the logits, for a head that runs
    the lm_head itself (``completion_hidden_states``). None (use the plain forward) when no
    prompt repeats or the model's cache is not a plain per-layer key/value cache (sliding
    windows, recurrent layers).
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    from grpo_train.models.hf_compat import cache_keyword, checkpointing_enabled

    config = getattr(model, "config", None)
    c_len = mb.completion_ids.shape[1]
    p_len = mb.input_ids.shape[1] - c_len
    key = torch.cat([mb.input_ids[:, :p_len], mb.attention_mask[:, :p_len]], dim=1)  # (B, 2P)
    unique, owner = torch.unique(key, dim=0, return_inverse=True)  # (U, 2P), (B,)
    # Checkpointed layers drop the cache (transformers turns use_cache off in training).
    if config is None or checkpointing_enabled(model):
        return None
    if unique.shape[0] == key.shape[0]:
        return None
    prefix = DynamicCache(config=config)
    if not all(type(layer) is DynamicLayer for layer in prefix.layers):
        return None
    prompt_ids, prompt_mask = unique[:, :p_len], unique[:, p_len:]
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=(prompt_mask.cumsum(dim=1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
        output_hidden_states=hidden,
        **{cache_keyword(model): prefix},
    )
    implementation = str(getattr(config, "_attn_implementation", "") or "")
    bins = _bins_of(mb, owner, prompt_mask) if implementation in _MASKED_ATTENTION else None
    if bins is None:
        inputs = {
            "input_ids": mb.completion_ids,
            "attention_mask": mb.attention_mask,  # prompt + completion columns: cache + input
            "position_ids": mb.position_ids[:, p_len:],
        }
        rows_of = owner
    else:
        mask: torch.Tensor = bins.allowed
        if implementation == "eager":  # eager attention adds its mask to the scores
            dtype = next(model.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~bins.allowed, torch.finfo(dtype).min
            )
        inputs = {
            "input_ids": bins.input_ids,
            "attention_mask": mask,
            "position_ids": bins.position_ids,
        }
        rows_of = bins.owner
    rows = DynamicCache(config=config)
    layers: list[Any] = list(prefix.layers)  # DynamicLayer each, checked above
    for index, layer in enumerate(layers):  # (U, H, P, D) -> (B or N, H, P, D)
        rows.update(
            layer.keys.index_select(0, rows_of), layer.values.index_select(0, rows_of), index
        )
    completion = model(
        **inputs,
        use_cache=True,
        logits_to_keep=1 if hidden else c_len,
        output_hidden_states=hidden,
        **{cache_keyword(model): rows},
    )
    if hidden:
        states = completion.hidden_states[-1]  # (B or N, C, H)
        head = output_layer(model)
        if head is None or not _feeds_head(head, states, completion.logits):
            return None
        first_state = out.hidden_states[-1][:, -1:, :].index_select(0, owner)  # (B, 1, H)
        return _SharedForward(first_state, states, bins)
    return _SharedForward(out.logits[:, -1:, :].index_select(0, owner), completion.logits, bins)


def pad_rows(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """Return per-token values (e.g. sampling logprobs) as a zero-padded (B, width) tensor."""
    out = torch.zeros((len(rows), width))
    for b, values in enumerate(rows):
        out[b, : len(values)] = torch.tensor(list(values), dtype=torch.float32)
    return out
