"""The GRPO policy update: ``mu`` clipped policy-gradient steps on one rollout batch.

``grpo_update(learner, optimizer_step, batch, advantages, settings)`` is the whole update, for
one process or one rank of many: its collectives (``grpo_train.parallel.distributed``: global loss
normalisers, the world-size loss scale, padding passes, ``no_sync`` until the last micro-batch,
metrics merged over ranks) make N ranks compute what one process would, and cost nothing at world
size 1. The trainer, the data-parallel tests and ``benchmarks/gpu_check.py`` all call it. The
per-token loss is ``grpo_train.algorithm.objective.grpo_loss``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

import torch

from grpo_train.algorithm.objective import (
    ObjectiveSettings,
    grpo_loss,
    live_rows,
    loss_share,
    rows_with_gradient,
    truncated_is_weights,
)
from grpo_train.collect.batch import RolloutBatch
from grpo_train.collect.metrics import MetricSums
from grpo_train.learner.forward import completion_hidden_states, output_layer, token_logprobs
from grpo_train.learner.liger_loss import liger_grpo_loss
from grpo_train.learner.logprobs import DEFAULT_HEAD, HeadChoice, fused_logprobs
from grpo_train.learner.micro_batches import (
    ForwardCost,
    MicroBatch,
    make_micro_batches,
    packing_pays,
    pad_rows,
)
from grpo_train.parallel import distributed
from grpo_train.run.run_log import logger
from grpo_train.run.stop import TrainingAborted


@dataclass(frozen=True)
class UpdateSettings:
    """What the update reads of a run's configuration, as plain values.

    Built once where the run is assembled (``grpo_train.setup.run.update_settings``), so that
    the update depends on these values only, not on the configuration's sections.
    """

    objective: ObjectiveSettings
    """The loss: clip range, KL coefficient, loss type, GSPO's level, ``dr_grpo``'s divisor."""
    mu: int
    """Policy updates per rollout batch (``AlgorithmConfig.mu``)."""
    temperature: float
    """The rollout's sampling temperature: the log-probs describe the distribution it sampled."""
    micro_batch_tokens: int
    """Token budget of a forward/backward micro-batch (``OptimConfig.micro_batch_tokens``)."""
    mask_truncated: bool
    """No loss on truncated completions (DAPO's overlong filtering)."""
    is_correction: bool
    """Weigh tokens by truncated importance sampling (``truncated_is_weights``)."""
    is_cap: float
    """The cap of those weights."""


def _nothing() -> contextlib.AbstractContextManager[object]:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Learner:
    """The policy model being trained, as the update runs it.

    The module whose forward and backward the update calls, and how: padding id, device,
    autocast, KL reference, accelerate's backward and ``no_sync``.
    """

    model: torch.nn.Module
    """The (possibly DDP / FSDP-wrapped) module whose forward and backward the update runs."""
    pad_id: int
    device: str = "cpu"
    share_prompts: bool = False
    """Run each group's prompt once per micro-batch (``forward.token_logprobs``)."""
    autocast: Callable[[], contextlib.AbstractContextManager[object]] = _nothing
    reference: Callable[[MicroBatch], torch.Tensor] | None = None
    """Per-token logprobs under the KL reference; needed when ``beta > 0``."""
    reference_resident: Callable[[], contextlib.AbstractContextManager[object]] = _nothing
    """While open, an offloaded reference stays on the device (``KLReference.resident``)."""
    accelerator: Any = None
    """accelerate's ``Accelerator``: its ``backward`` (the fp16 loss scaler, when one is set up)
    and ``no_sync`` (one gradient all-reduce per optimizer step). None: ``loss.backward()``."""
    head: HeadChoice = DEFAULT_HEAD
    """How log-probs come out of the model's last hidden states (``OptimConfig.logprob_head``)."""
    packing: Literal["always", "never", "when_cheaper"] = "never"
    """Padding-free micro-batches (``OptimConfig.packing``, ``make_micro_batches``):
    ``when_cheaper`` packs the steps whose rows cost less packed than through the shared-prompt
    forward (``packing_pays``)."""
    forward_cost: ForwardCost = field(default_factory=ForwardCost)
    """The model's cost of a token position against an attention pair (``ForwardCost.of``)."""

    def packs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        token_budget: int,
        select: Sequence[int],
    ) -> bool:
        """Whether this step's micro-batches are packed (``packing``)."""
        if self.packing == "when_cheaper":
            return packing_pays(prompts, completions, token_budget, select, self.forward_cost)
        return self.packing == "always"

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` (through accelerate, and the wrapper's hooks, when given)."""
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss)


def _token_mask(batch: RolloutBatch, rows: list[int], width: int) -> torch.Tensor:
    """(B, width) float loss mask of ``rows``, zero past each completion's end."""
    out = torch.zeros((len(rows), width))
    for b, r in enumerate(rows):
        mask = batch.loss_mask[r]
        out[b, : mask.shape[0]] = mask.float()
    return out


class SteppingEngine(Protocol):
    """An engine that clips and steps inside ``accelerator.backward``: DeepSpeed's.

    ``distributed.engine_stepping_in_backward`` finds it; the names are DeepSpeed's.
    """

    def was_step_applied(self) -> bool:
        """Whether the last step changed the weights (False: skipped on non-finite gradients)."""
        ...

    def get_global_grad_norm(self) -> object:
        """Return the last applied step's gradient norm before clipping (float, tensor, None)."""
        ...


class ClipAndStep:
    """The optimizer step the update calls once per pass over the batch: clip, step, zero.

    An update whose loss or gradient norm is not finite is skipped and counted; after
    ``max_bad_steps`` of them in a row the run stops (``TrainingAborted``) with its last good
    checkpoint ``last_good()`` intact. ``max_grad_norm`` 0: no clipping. ``clip(params,
    max_norm)`` returns the gradient norm:
    ``torch.nn.utils.clip_grad_norm_``, or accelerate's collective one for sharded models.

    ``engine`` (DeepSpeed): the engine already clipped (at ``max_grad_norm``:
    ``distributed.set_deepspeed_gradient_clipping``), stepped and zeroed inside the last
    backward, or skipped the step on non-finite gradients; then nothing is stepped here but the
    scheduler, after an applied step only (as DeepSpeed treats its own), and a skipped step
    counts as a bad one.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        max_grad_norm: float,
        max_bad_steps: int,
        clip: Callable[[list[torch.nn.Parameter], float], object] = torch.nn.utils.clip_grad_norm_,
        last_good: Callable[[], object] = lambda: None,
        engine: SteppingEngine | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.max_norm = max_grad_norm or float("inf")
        self.max_bad_steps, self.clip, self.last_good = max_bad_steps, clip, last_good
        self.engine = engine
        self.bad_in_a_row = 0

    def __call__(self, loss: float) -> float:
        """Clip and step; skip (and count) an update whose loss or gradient is not finite."""
        if self.engine is not None:
            return self._after_engine_step(loss)
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = float(self.clip(params, self.max_norm))  # type: ignore[arg-type]
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            self.bad_in_a_row = 0
        else:
            self._count_bad(loss, grad_norm, "update skipped")
        self.optimizer.zero_grad(set_to_none=True)
        self._stop_after_too_many()
        return grad_norm

    def _after_engine_step(self, loss: float) -> float:
        """Count the step DeepSpeed took or skipped; NaN as the norm where it reports none.

        DeepSpeed keeps the norm of its last applied step (None before the first, and always
        on an engine whose optimizer records none): after a skipped step it is stale.
        """
        assert self.engine is not None
        applied = bool(self.engine.was_step_applied())
        reported = self.engine.get_global_grad_norm()
        grad_norm = float("nan")
        if applied and reported is not None:
            value = reported.item() if isinstance(reported, torch.Tensor) else reported
            grad_norm = float(cast(float, value))
        if not applied:
            self._count_bad(loss, grad_norm, "DeepSpeed skipped the update")
        else:
            self.scheduler.step()  # the optimizer stepped inside backward; no second step
            if math.isfinite(loss) and (reported is None or math.isfinite(grad_norm)):
                self.bad_in_a_row = 0
            else:  # applied all the same: DeepSpeed's gradient overflow check is off
                self._count_bad(loss, grad_norm, "DeepSpeed applied the update")
        self._stop_after_too_many()
        return grad_norm

    def _count_bad(self, loss: float, grad_norm: float, what: str) -> None:
        self.bad_in_a_row += 1
        logger.warning(
            "non-finite loss (%s) or grad norm (%s): %s (%d in a row)",
            loss,
            grad_norm,
            what,
            self.bad_in_a_row,
        )

    def _stop_after_too_many(self) -> None:
        if self.bad_in_a_row >= self.max_bad_steps:
            raise TrainingAborted(
                f"{self.bad_in_a_row} updates in a row had a non-finite loss or gradient; stopped "
                f"with the last good checkpoint {self.last_good()} intact. "
                "Try a lower learning_rate, dtype=float32, or a smaller max_grad_norm."
            )


def grpo_update(
    learner: Learner,
    optimizer_step: Callable[[float], float],
    batch: RolloutBatch,
    advantages: torch.Tensor,
    settings: UpdateSettings,
) -> dict[str, float]:
    """Run ``mu`` clipped policy-gradient updates on ``batch``; return the step's metrics.

    ``advantages``: (P, G), this batch's rows of the step's advantages. ``optimizer_step(loss)``
    clips, steps and zeroes the gradients and returns the gradient norm (``ClipAndStep``). Losses
    are normalised by the step's token / sequence counts over all ranks, so accumulating
    micro-batches gives the gradient of the whole batch. Every rank calls it (collectives).
    """
    objective = settings.objective
    # A rerender episode's later training sequences are extra rows with the episode's values.
    flat_adv = batch.per_row(advantages.flatten())
    # Items whose scoring failed (and groups left with too few scored ones) get no loss, and
    # neither do truncated ones under DAPO overlong filtering (their reward is unreliable).
    skip = batch.per_row(
        ~batch.trainable.flatten() | (batch.truncated.flatten() & settings.mask_truncated)
    )
    keep = torch.where(skip | batch.padding, 0.0, 1.0)
    # Only rows whose loss can have a gradient get a forward/backward pass (with beta = 0, not
    # those with advantage 0); the normalisers still count every row. With none, one row still
    # runs (every rank must run a backward). The distributed.* calls below are collectives.
    # A padding rank's metrics stay out of the step's averages (its rows only keep the
    # collectives in step), and so do an idle rank's while another rank learns (they would skew
    # the trained rows' metrics, and differ from a single process's).
    learns = bool(live_rows(flat_adv, keep, objective.beta))
    anyone_learns = distributed.any_rank(learns)  # every rank calls it, padding or not
    silent = batch.padding or (anyone_learns and not learns)
    prompts, select = batch.row_prompts(), rows_with_gradient(flat_adv, keep, objective.beta)
    budget = settings.micro_batch_tokens
    packed = learner.packs(prompts, batch.completion_ids, budget, select)
    batches = make_micro_batches(
        prompts,
        batch.completion_ids,
        budget,
        learner.pad_id,
        select=select,
        group_prompts=learner.share_prompts,
        packed=packed,
    )
    sequences = 0 if batch.padding else int(batch.per_row(batch.trainable.flatten()).sum())
    total_tokens, total_seqs = distributed.global_loss_normalizers(
        batch.trained_tokens(keep), sequences
    )
    # As many passes as the busiest rank has micro-batches: FSDP / ZeRO-3 all-gather parameters
    # inside each forward, so a rank with fewer repeats its last one with weight 0.
    schedule = distributed.micro_batch_schedule(len(batches))
    loss_scale = distributed.data_parallel_loss_scale()
    adv = flat_adv.to(learner.device)
    refs = _reference_logprobs(learner, batches, schedule) if objective.beta > 0 else {}
    old: dict[int, torch.Tensor] = {}  # micro-batch -> logprobs before any update
    sums, loss_total, grad_norm = MetricSums(), 0.0, 0.0
    learner.model.train()
    for iteration in range(settings.mu):
        loss_total = 0.0
        done: set[int] = set()
        for k, (i, weight) in enumerate(schedule):
            mb = batches[i].to(learner.device)
            rows = list(mb.rows)
            width = mb.completion_mask.shape[1]
            token_mask = _token_mask(batch, rows, width).to(learner.device)
            mask = mb.completion_mask.float() * token_mask * keep[rows].to(learner.device)[:, None]
            tokens = 0.0 if silent else float(mask.sum()) * weight  # metric weight
            first = iteration == 0 and i not in old
            sync = distributed.gradient_sync(learner.accelerator, learner.model, k, len(schedule))
            with sync, learner.autocast():
                states = _liger_states(learner, mb)  # None unless logprob_head: liger
                if states is None:
                    logprobs, entropy = token_logprobs(
                        learner.model, mb, settings.temperature, first,
                        learner.share_prompts, learner.head,
                    )  # fmt: skip
                else:  # the values for the old policy, the IS weights and the metrics
                    with torch.no_grad():
                        logprobs, entropy = fused_logprobs(
                            states.head, states.hidden.detach(), mb.completion_ids,
                            settings.temperature, first, vocab=states.vocab,
                        )  # fmt: skip
                logprobs = logprobs.float()
                if first:  # before the first update the current policy is the "old" one
                    old[i] = logprobs.detach()
                if entropy is not None and tokens:
                    sums.add({"entropy": float((entropy * mask).sum() / max(tokens, 1.0))}, tokens)
                loss, metrics = _micro_batch_loss(
                    learner, batch, mb, logprobs, old[i], refs.get(i), adv[rows], mask,
                    settings, sums if first and tokens else None, tokens, states, first,
                )  # fmt: skip
                # Each micro-batch's loss is a mean over its own tokens / sequences; weighting by
                # its share of the global batch makes the accumulated gradient the whole batch's.
                share = loss_share(objective.loss_type, mask, total_tokens, total_seqs) * weight
                share = 0.0 if batch.padding else share
                learner.backward(loss * (share * loss_scale))
            loss_total += float(loss.detach()) * share
            if iteration == settings.mu - 1 and tokens and i not in done:
                sums.add(metrics, tokens)
                done.add(i)
        loss_total = distributed.global_sum(loss_total)[0]
        grad_norm = optimizer_step(loss_total)
    metrics = sums.merged_over_ranks().result()
    return {**metrics, "loss": loss_total, "grad_norm": grad_norm, "packed": float(packed)}


def _micro_batch_loss(
    learner: Learner,
    batch: RolloutBatch,
    mb: MicroBatch,
    logprobs: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor | None,
    adv: torch.Tensor,
    mask: torch.Tensor,
    settings: UpdateSettings,
    is_sums: MetricSums | None,
    tokens: float,
    liger: LigerStates | None = None,
    first: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the clipped GRPO loss of one micro-batch (``grpo_loss``) and its metrics.

    ``ref``: the KL reference's logprobs (``beta > 0``); with truncated importance sampling
    (``is_correction``) it weights tokens by old / sampling probabilities, adding their metrics
    to ``is_sums`` when given (the first pass over the micro-batch). ``liger``: the loss (and
    its gradients) comes from Liger's fused linear GRPO loss over those hidden states, the
    metrics from ``grpo_loss`` over the (gradient-free) ``logprobs``; ``first``: the pass
    before any update, whose old policy is the current one.
    """
    objective = settings.objective
    weights = None
    if settings.is_correction:
        rows = list(mb.rows)
        sampled = pad_rows([batch.sampling_logprobs[r] for r in rows], mask.shape[1])
        weights, is_metrics = truncated_is_weights(
            old, sampled.to(learner.device), mask, settings.is_cap
        )
        if is_sums is not None:
            is_sums.add(is_metrics, tokens)
    loss, metrics = grpo_loss(
        logprobs,
        old,
        adv,
        mask,
        ref_logprobs=ref,
        beta=objective.beta,
        epsilon_low=objective.epsilon_low,
        epsilon_high=objective.epsilon_high,
        loss_type=objective.loss_type,
        max_completion_length=objective.max_completion_length,
        importance_weights=weights,
        importance_sampling_level=objective.importance_sampling_level,
    )
    if liger is not None:
        loss = liger_grpo_loss(
            liger.head, liger.hidden, mb.completion_ids, mask, adv, objective,
            temperature=settings.temperature,
            old_logprobs=None if first else old, ref_logprobs=ref, importance_weights=weights,
        )  # fmt: skip
    return loss, metrics


def _reference_logprobs(
    learner: Learner, batches: Sequence[MicroBatch], schedule: Sequence[tuple[int, float]]
) -> dict[int, torch.Tensor]:
    """Every micro-batch's KL-reference logprobs, computed once before the update's passes.

    The reference does not change during an update, so ``mu`` passes need it once, and an
    offloaded copy moves to the device once (``Learner.reference_resident``) instead of once
    per micro-batch and pass. One forward per entry of ``schedule`` (padding repeats included):
    a sharded reference (the LoRA policy with its adapter off, under FSDP) gathers its
    parameters inside each forward, so every rank must run as many.
    """
    if learner.reference is None:
        raise ValueError("beta > 0 needs Learner.reference (the KL reference)")
    refs: dict[int, torch.Tensor] = {}
    with learner.reference_resident(), learner.autocast(), torch.no_grad():
        for i, _ in schedule:
            refs[i] = learner.reference(batches[i].to(learner.device)).float()
    return refs


@dataclass(frozen=True)
class LigerStates:
    """A micro-batch's input to Liger's loss: the lm_head and its (B, C, H) input states."""

    head: torch.nn.Module
    hidden: torch.Tensor
    vocab: int


def _liger_states(learner: Learner, mb: MicroBatch) -> LigerStates | None:
    """Return the hidden states Liger's loss runs on (``logprob_head: liger``), else None."""
    if learner.head.path != "liger":
        return None
    head = output_layer(learner.model)
    states = completion_hidden_states(learner.model, mb, learner.share_prompts, head)
    if head is None or states is None:
        raise ValueError(
            "logprob_head: liger needs the model's logits to be its output layer applied to its "
            "last hidden states, and that layer unsharded; this model's are not (FSDP, "
            "soft-capped or scaled logits): use logprob_head: auto"
        )
    weight = head.weight
    assert isinstance(weight, torch.Tensor)  # output_layer returns only heads with a weight
    return LigerStates(head, states, int(weight.shape[0]))
