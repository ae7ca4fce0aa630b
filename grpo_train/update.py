"""The GRPO policy update: ``mu`` clipped policy-gradient steps on one rollout batch.

``grpo_update(policy, optimizer_step, batch, advantages, settings, dp)`` is the whole update, for
one process or one rank of many (the ``dp`` strategy, ``grpo_train.data_parallel``, makes N ranks
compute what one process would). The trainer, the data-parallel tests and
``benchmarks/gpu_check.py`` all call it. The per-token loss is ``loss.grpo_loss``.
"""

from __future__ import annotations

import contextlib
import math
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
from grpo_train.run_log import logger
from grpo_train.stop import TrainingAborted


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


class ClipAndStep:
    """The optimizer step the update calls once per pass over the batch: clip, step, zero.

    An update whose loss or gradient norm is not finite is skipped and counted; after
    ``max_bad_steps`` of them in a row the run stops (``TrainingAborted``) with its last good
    checkpoint ``last_good()`` intact. ``clip(params, max_norm)`` returns the gradient norm:
    ``torch.nn.utils.clip_grad_norm_``, or accelerate's collective one for sharded models.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        optim: OptimConfig,
        max_bad_steps: int,
        clip: Callable[[list[torch.nn.Parameter], float], object] = torch.nn.utils.clip_grad_norm_,
        last_good: Callable[[], object] = lambda: None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.max_norm = optim.max_grad_norm or float("inf")
        self.max_bad_steps, self.clip, self.last_good = max_bad_steps, clip, last_good
        self.bad_in_a_row = 0

    def __call__(self, loss: float) -> float:
        """Clip and step; skip (and count) an update whose loss or gradient is not finite."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = float(self.clip(params, self.max_norm))  # type: ignore[arg-type]
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            self.bad_in_a_row = 0
        else:
            self.bad_in_a_row += 1
            logger.warning(
                "non-finite loss (%s) or grad norm (%s): update skipped (%d in a row)",
                loss,
                grad_norm,
                self.bad_in_a_row,
            )
        self.optimizer.zero_grad(set_to_none=True)
        if self.bad_in_a_row >= self.max_bad_steps:
            raise TrainingAborted(
                f"{self.bad_in_a_row} updates in a row had a non-finite loss or gradient; stopped "
                f"with the last good checkpoint {self.last_good()} intact. "
                "Try a lower learning_rate, dtype=float32, or a smaller max_grad_norm."
            )
        return grad_norm


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
    clips, steps and zeroes the gradients and returns the gradient norm (``ClipAndStep``). Losses
    are normalised by the step's token / sequence counts over all ranks (``dp``), so accumulating
    micro-batches gives the gradient of the whole batch.
    """
    a, dp = settings.algorithm, dp or SingleProcess()
    flat_adv = advantages.flatten()
    # Items whose scoring failed (and groups left with too few scored ones) get no loss, and
    # neither do truncated ones under DAPO overlong filtering (their reward is unreliable).
    skip = ~batch.trainable.flatten() | (batch.truncated.flatten() & a.mask_truncated)
    keep = torch.where(skip | batch.padding, 0.0, 1.0)
    # Only rows whose loss can have a gradient get a forward/backward pass (with beta = 0, not
    # those with advantage 0); the normalisers still count every row. With none, one row still
    # runs (every rank must run a backward). The dp calls below are collectives.
    silent = dp.metrics_silent(batch.padding, bool(live_rows(flat_adv, keep, a.beta)))
    batches = make_micro_batches(
        batch.row_prompts(),
        batch.completion_ids,
        settings.optim.micro_batch_tokens,
        policy.pad_id,
        select=rows_with_gradient(flat_adv, keep, a.beta),
        group_prompts=policy.share_prompts,
    )
    sequences = 0 if batch.padding else int(batch.trainable.sum())
    total_tokens, total_seqs = dp.normalizers(batch.trained_tokens(keep), sequences)
    schedule = dp.schedule(len(batches))
    adv = flat_adv.to(policy.device)
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
                loss, metrics = _micro_batch_loss(
                    policy, batch, mb, logprobs, old[i], adv[rows], mask, settings,
                    sums if first and tokens else None, tokens,
                )  # fmt: skip
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


def _micro_batch_loss(
    policy: Policy,
    batch: RolloutBatch,
    mb: MicroBatch,
    logprobs: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    settings: UpdateSettings,
    is_sums: MetricSums | None,
    tokens: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the clipped GRPO loss of one micro-batch (``loss.grpo_loss``) and its metrics.

    With ``beta > 0`` it reads the KL reference's logprobs; with truncated importance sampling
    (``is_correction``) it weights tokens by old / sampling probabilities, adding their metrics
    to ``is_sums`` when given (the first pass over the micro-batch).
    """
    a = settings.algorithm
    ref = None
    if a.beta > 0:
        if policy.reference is None:
            raise ValueError("beta > 0 needs Policy.reference (the KL reference)")
        ref = policy.reference(mb)
    weights = None
    if a.is_correction:
        rows = list(mb.rows)
        sampled = pad_rows([batch.sampling_logprobs[r] for r in rows], mask.shape[1])
        weights, is_metrics = truncated_is_weights(old, sampled.to(policy.device), mask, a.is_cap)
        if is_sums is not None:
            is_sums.add(is_metrics, tokens)
    return grpo_loss(
        logprobs,
        old,
        adv,
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
