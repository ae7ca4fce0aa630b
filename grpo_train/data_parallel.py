"""The data-parallel protocol of a GRPO step, as one strategy object the algorithm calls.

``grpo_update`` and the trainer's step are written for one process; everything that makes N
ranks compute what one process would lives here: global advantages and loss normalisers, the
world-size loss scale, padding passes (every rank runs the same number of forward/backward
passes), ``no_sync`` until the last micro-batch, which ranks' metrics count, and merging metrics
over ranks. ``SingleProcess`` does nothing (no collective, no scaling); ``DataParallel`` calls the
collectives of ``grpo_train.distributed``, which place their tensors on the backend's device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from grpo_train import distributed
from grpo_train.advantages import Estimator, ScaleRewards, compute_advantages
from grpo_train.baselines import EmaBaselines, GroupKey, ema_advantages
from grpo_train.metrics import MetricSums

T = TypeVar("T")


class SingleProcess:
    """One process: every "global" quantity is the local one and nothing is communicated."""

    def __init__(self, backward: Callable[[torch.Tensor], Any] | None = None) -> None:
        # The trainer passes accelerate's backward (its fp16 loss scaler, when one is set up).
        self._backward = backward or torch.Tensor.backward
        self.padding_passes = 0
        """Zero-weight passes run so far (always 0 here; counted by ``DataParallel``)."""

    def advantages(
        self,
        rewards: torch.Tensor,
        estimator: Estimator | str,
        scale_rewards: ScaleRewards | str,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return the advantages of this process's (P, G) rewards (the whole batch)."""
        return compute_advantages(rewards, estimator, scale_rewards, valid=valid)

    def ema_advantages(
        self,
        rewards: torch.Tensor,
        keys: Sequence[GroupKey],
        baselines: EmaBaselines,
        alpha: float,
        scale_rewards: ScaleRewards | str,
        valid: torch.Tensor,
    ) -> tuple[torch.Tensor, EmaBaselines]:
        """Return the EMA-baseline advantages of this process's groups, and the new baselines."""
        return ema_advantages(rewards, keys, baselines, alpha, scale_rewards, valid=valid)

    def any(self, flag: bool) -> bool:
        """Tell whether ``flag`` holds on some rank."""
        return flag

    def total(self, value: float) -> float:
        """Return ``value`` summed over ranks."""
        return value

    def normalizers(self, tokens: int, sequences: int) -> tuple[int, int]:
        """Return the global (tokens, sequences) counts that normalise the loss."""
        return tokens, sequences

    @property
    def loss_scale(self) -> float:
        """Return the factor undoing the wrappers' gradient average over ranks."""
        return 1.0

    def schedule(self, count: int) -> list[tuple[int, float]]:
        """Return ``(micro-batch index, loss weight)`` of each forward/backward pass to run."""
        return [(k, 1.0) for k in range(count)]

    def sync(self, index: int, count: int) -> contextlib.AbstractContextManager[object]:
        """Return the context of pass ``index`` of ``count`` (gradients reduced on the last)."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` (through the wrapper's hooks when there is one)."""
        self._backward(loss)

    def metrics_silent(self, padding: bool, learns: bool) -> bool:
        """Tell whether this rank's entropy / ratio metrics stay out of the step's averages.

        A padding rank's rows only keep the collectives in step. Single process: never.
        """
        return padding

    def gather(self, items: list[T]) -> list[T]:
        """Return every rank's ``items`` concatenated in rank order."""
        return items

    def merged(self, sums: MetricSums) -> MetricSums:
        """Return ``sums`` merged with every other rank's."""
        return sums


class DataParallel(SingleProcess):
    """N ranks under DDP / FSDP / ZeRO (``accelerate``), each with a share of the prompts.

    Losses are normalised by global token / sequence counts and scaled by the world size, since
    the wrappers average gradients over ranks: the update then equals the single-process one.
    """

    def __init__(self, accelerator: Any, model: torch.nn.Module) -> None:
        super().__init__(accelerator.backward)
        self.accelerator, self.model = accelerator, model

    def advantages(
        self,
        rewards: torch.Tensor,
        estimator: Estimator | str,
        scale_rewards: ScaleRewards | str,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return this rank's rows of the advantages computed over every rank's rewards."""
        result = distributed.global_advantages(rewards, estimator, scale_rewards, local_valid=valid)
        return result.local

    def ema_advantages(
        self,
        rewards: torch.Tensor,
        keys: Sequence[GroupKey],
        baselines: EmaBaselines,
        alpha: float,
        scale_rewards: ScaleRewards | str,
        valid: torch.Tensor,
    ) -> tuple[torch.Tensor, EmaBaselines]:
        """Return this rank's rows of the EMA advantages over every rank's groups (collective).

        Every rank computes from the same gathered rewards and keys, in rank order, so every
        rank's baselines stay identical (each saves and restores the same state).
        """
        every = distributed.gather_rows(rewards)
        every_valid = distributed.gather_rows(valid.to(rewards.dtype)) > 0.5
        counts = self.gather([int(rewards.shape[0])])
        offset = sum(counts[: distributed.rank_info().rank])
        adv, new = ema_advantages(
            every, self.gather(list(keys)), baselines, alpha, scale_rewards, valid=every_valid
        )
        return adv[offset : offset + rewards.shape[0]], new

    def any(self, flag: bool) -> bool:
        """Tell whether ``flag`` holds on some rank (collective)."""
        return distributed.global_sum(float(flag))[0] > 0

    def total(self, value: float) -> float:
        """Return ``value`` summed over ranks (collective)."""
        return distributed.global_sum(value)[0]

    def normalizers(self, tokens: int, sequences: int) -> tuple[int, int]:
        """Return every rank's (tokens, sequences) summed (collective)."""
        return distributed.global_loss_normalizers(tokens, sequences)

    @property
    def loss_scale(self) -> float:
        """Return the world size: the wrappers average gradients over ranks."""
        return distributed.data_parallel_loss_scale()

    def schedule(self, count: int) -> list[tuple[int, float]]:
        """Return the passes to run: as many as the busiest rank, the extra ones with weight 0."""
        # FSDP / ZeRO-3 all-gather parameters inside each forward: a rank with fewer
        # micro-batches repeats its last one with weight 0 so that the others do not hang.
        plan = distributed.micro_batch_schedule(count)
        self.padding_passes += sum(weight == 0.0 for _, weight in plan)
        return plan

    def sync(self, index: int, count: int) -> contextlib.AbstractContextManager[object]:
        """Return ``no_sync`` but on the last pass: one gradient all-reduce per optimizer step."""
        return distributed.gradient_sync(self.accelerator, self.model, index, count)

    def metrics_silent(self, padding: bool, learns: bool) -> bool:
        """Tell whether this rank's metrics stay out (padding, or idle while others learn)."""
        # With no row to learn from a rank still runs one row; its metrics stand for the batch
        # only when no rank trains anything (else they would skew the trained rows' metrics,
        # and differ from a single process's). Collective.
        anyone_learns = self.any(learns)
        return padding or (anyone_learns and not learns)

    def gather(self, items: list[T]) -> list[T]:
        """Return every rank's picklable ``items`` in rank order (collective)."""
        parts: list[list[T] | None] = [None] * distributed.rank_info().world_size
        torch.distributed.all_gather_object(parts, items)
        return [item for part in parts for item in (part or [])]

    def merged(self, sums: MetricSums) -> MetricSums:
        """Merge the other ranks' sums into ``sums`` (exact on the main rank, which logs)."""
        for other in self.gather([sums])[1:]:
            sums.merge(other)
        return sums


def strategy(accelerator: Any, model: torch.nn.Module, is_distributed: bool) -> SingleProcess:
    """Return ``DataParallel`` under a launcher, else ``SingleProcess``."""
    if is_distributed:
        return DataParallel(accelerator, model)
    return SingleProcess(accelerator.backward)


__all__: Sequence[str] = ("DataParallel", "SingleProcess", "strategy")
