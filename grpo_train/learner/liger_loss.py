"""The update's loss through Liger-Kernel's fused linear GRPO loss (``logprob_head: liger``).

Liger-Kernel (arXiv:2410.10989) ships ``LigerFusedLinearGRPOFunction``: from the final hidden
states and the lm_head's weight it computes the clipped GRPO loss row by row, streaming over
chunks of tokens and vocabulary with an online logsumexp, and takes the gradients during the
forward, so no (tokens x vocabulary) tensor is ever kept. It is pure PyTorch (its Triton kernels
are other losses), so it runs wherever torch does, this CPU included; it is an option where the
``liger-kernel`` package is installed, never a requirement.

It returns the loss, not the per-token log-probabilities, which the update also needs: the
"old" policy's (kept from the first pass over a micro-batch for ``mu > 1``), the importance-
sampling weights' and the step metrics' (ratios, clip fractions, entropy). Those come from our
own fused head run once more without gradient (``logprobs.fused_logprobs``), so every metric is
computed exactly as on the other paths and Liger computes only the loss and its gradients.

Our settings map onto its arguments one for one (``grpo_loss``'s formula is its formula): the
loss types (``grpo``, ``dapo``, ``dr_grpo``), the clip range, ``beta`` with the reference's
per-token log-probs (its k3 estimate is ours), GSPO's sequence-level ratio, the temperature and
the truncated importance weights (its ``vllm_is_ratio``, applied before the KL term as ours).
Each call is one micro-batch's mean over its own tokens or rows, as ``grpo_loss`` is, so the
update weighs it by ``objective.loss_share`` the same way; DAPO's normaliser is passed explicitly
(``num_items_in_batch``) because without it Liger all-reduces each micro-batch's token count
over the ranks, a collective the update's micro-batch schedule does not expect.
"""

from __future__ import annotations

import importlib.util

import torch

from grpo_train.algorithm.choices import LossType
from grpo_train.algorithm.objective import ObjectiveSettings

#: What a user without the package is told (at start-up, before any model loads).
MISSING = (
    "logprob_head: liger needs the liger-kernel package (pip install liger-kernel); "
    "logprob_head: auto needs nothing and keeps the same memory bound"
)


def liger_installed() -> bool:
    """Whether ``liger_kernel`` can be imported here."""
    return importlib.util.find_spec("liger_kernel") is not None


def liger_grpo_loss(
    head: torch.nn.Module,
    states: torch.Tensor,
    token_ids: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    objective: ObjectiveSettings,
    *,
    temperature: float,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    importance_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Return one micro-batch's ``grpo_loss`` computed by Liger from its hidden states.

    ``states`` (B, C, H) feed the output layer ``head`` (an ``nn.Linear``: the lm_head, tied or
    not) at the positions predicting ``token_ids`` (B, C); ``mask`` (B, C) weighs the tokens
    (0 on padding); ``advantages`` (B,); ``objective`` the loss's settings (its
    ``max_completion_length`` is ``dr_grpo``'s divisor). ``old_logprobs`` None: the current
    policy is the old one (ratio exactly 1, as on the first pass); ``ref_logprobs`` for
    ``beta > 0``; ``importance_weights`` the truncated IS weights. The value and the gradients
    of ``states`` and ``head``'s parameters equal ``grpo_loss`` over ``fused_logprobs`` within
    float tolerance (its logsumexp runs over vocabulary chunks).
    """
    if not liger_installed():
        raise ModuleNotFoundError(MISSING)
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOFunction

    if type(head) is not torch.nn.Linear:
        raise TypeError(
            f"logprob_head: liger runs the output layer as one weight matrix; this model's is a "
            f"{type(head).__name__} (LoRA on lm_head, a quantized head): use logprob_head: auto"
        )
    kind = LossType(objective.loss_type)
    world = 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
    # Liger divides num_items_in_batch by the world size: this gives the micro-batch's own count.
    tokens = float(mask.sum()) * world if kind is LossType.DAPO else None
    beta = float(objective.beta) if ref_logprobs is not None else 0.0
    loss, _metrics = LigerFusedLinearGRPOFunction.apply(
        states,
        head.weight,
        token_ids,
        mask.to(torch.float32),
        advantages.to(torch.float32),
        head.bias,
        ref_logprobs,
        old_logprobs,
        None,  # ref_input: the reference's log-probs are given instead
        None,  # ref_weight
        None,  # ref_bias
        beta,
        objective.epsilon_low,
        objective.epsilon_high,
        kind.value,
        objective.max_completion_length,
        str(objective.importance_sampling_level),
        1.0,  # sapo_temperature_pos (SAPO only)
        1.05,  # sapo_temperature_neg (SAPO only)
        float(temperature) if temperature > 0 else 1.0,
        False,  # compiled: torch.compile of its loss math recompiles for every new shape
        ref_logprobs is not None,  # use_ref_model
        1,  # chunk_size: rows per chunk
        importance_weights,  # vllm_is_ratio
        None,  # delta (INTELLECT-2's two-sided clip)
        False,  # use_bias_correction_kl
        2.0,  # vespo_k_pos (VESPO only)
        3.0,  # vespo_lambda_pos
        3.0,  # vespo_k_neg
        2.0,  # vespo_lambda_neg
        tokens,  # num_items_in_batch
    )
    return loss
