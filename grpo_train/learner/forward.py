"""The policy's forward pass over a micro-batch: per-token log-probabilities and entropies.

``token_logprobs`` runs the model on a ``MicroBatch`` (padded, packed, or with each distinct
prompt run once: ``_shared_prompt_forward``) and turns its logits or final hidden states into the
completion tokens' log-probabilities through ``grpo_train.learner.logprobs``;
``completion_hidden_states`` gives the hidden states alone, for a head that runs the lm_head
itself (the fused head, Liger's loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpo_train.learner.logprobs import (
    DEFAULT_HEAD,
    HeadChoice,
    chunked_logprobs,
    fused_logprobs,
    plain_logprobs,
)
from grpo_train.learner.micro_batches import MASKED_ATTENTION, MicroBatch, completion_bins


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
    Where the model's attention takes a custom mask (``MASKED_ATTENTION``), short completions
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
    bins = _bins_of(mb, owner, prompt_mask) if implementation in MASKED_ATTENTION else None
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
