"""The GRPO policy update: ``mu`` clipped policy-gradient steps on one rollout batch.

``grpo_update(policy, optimizer_step, batch, advantages, settings, dp)`` is the whole update, for
one process or one rank of many (the ``dp`` strategy, ``grpo_train.data_parallel``, makes N ranks
compute what one process would). The trainer, the data-parallel tests and
``benchmarks/gpu_check.py`` all call it. The per-token loss is ``loss.grpo_loss``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpo_train.batch import RolloutBatch
from grpo_train.config import AlgorithmConfig, OptimConfig, RolloutConfig, TrainConfig
from grpo_train.data_parallel import SingleProcess
from grpo_train.loss import (
    MicroBatch,
    grpo_loss,
    live_rows,
    loss_share,
    make_micro_batches,
    pad_rows,
    rows_with_gradient,
    token_logprobs,
    truncated_is_weights,
)
from grpo_train.metrics import MetricSums


@dataclass(frozen=True)
class UpdateSettings:
    """The configuration sections the update reads, as they are: one source of defaults.

    ``from_config`` takes a run's; ``of(beta=0.1, ...)`` builds one from flat field values over
    the configuration's defaults (validated and coerced as a config file's would be).
    """

    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> UpdateSettings:
        """Return the update settings of a training configuration."""
        return cls(cfg.algorithm, cfg.rollout, cfg.optim)

    @classmethod
    def of(cls, **values: object) -> UpdateSettings:
        """Return the settings of ``TrainConfig.from_flat(values)``.

        >>> UpdateSettings.of(beta=0.1).algorithm.beta, UpdateSettings.of().algorithm.epsilon_high
        (0.1, 0.28)
        """
        return cls.from_config(TrainConfig.from_flat(values))


def _no_autocast() -> contextlib.AbstractContextManager[object]:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Policy:
    """The model being trained, as the update sees it."""

    model: torch.nn.Module
    """The (possibly DDP / FSDP-wrapped) module whose forward and backward the update runs."""
    pad_id: int
    device: str = "cpu"
    share_prompts: bool = False
    """Run each group's prompt once per micro-batch (``loss.token_logprobs``)."""
    autocast: Callable[[], contextlib.AbstractContextManager[object]] = _no_autocast
    reference: Callable[[MicroBatch], torch.Tensor] | None = None
    """Per-token logprobs under the KL reference; needed when ``beta > 0``."""


def _token_mask(batch: RolloutBatch, rows: list[int], width: int) -> torch.Tensor:
    """(B, width) float loss mask of ``rows``, zero past each completion's end."""
    out = torch.zeros((len(rows), width))
    for b, r in enumerate(rows):
        mask = batch.loss_mask[r]
        out[b, : mask.shape[0]] = mask.float()
    return out


@dataclass(frozen=True)
class _Plan:
    """What an update runs: row weights, micro-batches, passes, normalisers, metric rule."""

    keep: torch.Tensor
    batches: list[MicroBatch]
    schedule: list[tuple[int, float]]
    silent: bool
    total_tokens: int
    total_sequences: int


def _plan(
    policy: Policy,
    batch: RolloutBatch,
    adv: torch.Tensor,
    s: UpdateSettings,
    dp: SingleProcess,
) -> _Plan:
    """Decide which rows train and how they are split; collective (the ``dp`` calls)."""
    # Items whose scoring failed (and groups left with too few scored ones) get no loss, and
    # neither do truncated ones under DAPO overlong filtering (their reward is unreliable).
    skip = ~batch.trainable.flatten() | (batch.truncated.flatten() & s.algorithm.mask_truncated)
    keep = torch.where(skip | batch.padding, 0.0, 1.0)
    # Only rows whose loss can have a gradient get a forward/backward pass (with beta = 0, not
    # those with advantage 0); the normalisers still count every row. With none, one row still
    # runs (every rank must run a backward).
    select = rows_with_gradient(adv, keep, s.algorithm.beta)
    silent = dp.metrics_silent(batch.padding, bool(live_rows(adv, keep, s.algorithm.beta)))
    batches = make_micro_batches(
        batch.row_prompts(),
        batch.completion_ids,
        s.optim.micro_batch_tokens,
        policy.pad_id,
        select=select,
        group_prompts=policy.share_prompts,
    )
    sequences = 0 if batch.padding else int(batch.trainable.sum())
    total_tokens, total_seqs = dp.normalizers(batch.trained_tokens(keep), sequences)
    schedule = dp.schedule(len(batches))
    return _Plan(keep, batches, schedule, silent, total_tokens, total_seqs)


def grpo_update(
    policy: Policy,
    optimizer_step: Callable[[float], float],
    batch: RolloutBatch,
    advantages: torch.Tensor,
    settings: UpdateSettings,
    dp: SingleProcess | None = None,
) -> dict[str, float]:
    """Run ``mu`` clipped policy-gradient updates on ``batch``; return the step's metrics.

    ``advantages``: (P, G), this batch's rows of the step's advantages. ``optimizer_step(loss)``
    clips, steps and zeroes the gradients and returns the gradient norm. Losses are normalised by
    the step's token / sequence counts over all ranks (``dp``), so accumulating micro-batches
    gives the gradient of the whole batch.
    """
    a, dp = settings.algorithm, dp or SingleProcess()
    plan = _plan(policy, batch, advantages.flatten(), settings, dp)
    keep, batches, schedule, silent = plan.keep, plan.batches, plan.schedule, plan.silent
    total_tokens, total_seqs = plan.total_tokens, plan.total_sequences
    adv = advantages.flatten().to(policy.device)
    old: dict[int, torch.Tensor] = {}  # micro-batch -> logprobs before any update
    sums, loss_total, grad_norm = MetricSums(), 0.0, 0.0
    policy.model.train()
    for iteration in range(a.mu):
        loss_total = 0.0
        done: set[int] = set()
        for k, (i, weight) in enumerate(schedule):
            mb = batches[i].to(policy.device)
            rows = list(mb.rows)
            width = mb.completion_mask.shape[1]
            token_mask = _token_mask(batch, rows, width).to(policy.device)
            mask = mb.completion_mask.float() * token_mask * keep[rows].to(policy.device)[:, None]
            tokens = 0.0 if silent else float(mask.sum()) * weight  # metric weight
            first = iteration == 0 and i not in old
            with dp.sync(k, len(schedule)), policy.autocast():
                logprobs, entropy = token_logprobs(
                    policy.model, mb, settings.rollout.temperature, first, policy.share_prompts
                )
                logprobs = logprobs.float()
                if first:  # before the first update the current policy is the "old" one
                    old[i] = logprobs.detach()
                if entropy is not None and tokens:
                    sums.add({"entropy": float((entropy * mask).sum() / max(tokens, 1.0))}, tokens)
                ref = None
                if a.beta > 0:
                    if policy.reference is None:
                        raise ValueError("beta > 0 needs Policy.reference (the KL reference)")
                    ref = policy.reference(mb)
                weights = None
                if a.is_correction:
                    sampled = pad_rows([batch.sampling_logprobs[r] for r in rows], width)
                    weights, is_metrics = truncated_is_weights(
                        old[i], sampled.to(policy.device), mask, a.is_cap
                    )
                    if first and tokens:
                        sums.add(is_metrics, tokens)
                loss, metrics = grpo_loss(
                    logprobs,
                    old[i],
                    adv[rows],
                    mask,
                    ref_logprobs=ref,
                    beta=a.beta,
                    epsilon_low=a.epsilon_low,
                    epsilon_high=a.epsilon_high,
                    loss_type=a.loss_type,
                    max_completion_length=settings.rollout.max_completion_length,
                    importance_weights=weights,
                    importance_sampling_level=a.importance_sampling_level,
                )
                # Each micro-batch's loss is a mean over its own tokens / sequences; weighting by
                # its share of the global batch makes the accumulated gradient the whole batch's.
                share = loss_share(a.loss_type, mask, total_tokens, total_seqs) * weight
                share = 0.0 if batch.padding else share
                dp.backward(loss * (share * dp.loss_scale))
            loss_total += float(loss.detach()) * share
            if iteration == a.mu - 1 and tokens and i not in done:
                sums.add(metrics, tokens)
                done.add(i)
        loss_total = dp.total(loss_total)
        grad_norm = optimizer_step(loss_total)
    return {**dp.merged(sums).result(), "loss": loss_total, "grad_norm": grad_norm}
