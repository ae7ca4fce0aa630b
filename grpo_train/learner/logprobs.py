"""Per-token log-probabilities and entropies without (tokens x vocabulary) float32 tensors.

The update needs, for every completion token, ``log softmax(logits / T)[token]`` and (as a
metric) the entropy of that distribution. Written plainly, autograd keeps the float32
log-softmax of the whole (rows, tokens, vocabulary) logits for the backward pass and the
backward allocates several more such tensors: with Qwen's 151,936-row vocabulary that is
594 KiB per float32 row, several rows per completion token, more than the model itself for
long chains of thought. Two paths avoid it:

``chunked_logprobs`` (over the logits the model produced): an ``autograd.Function`` that runs
the very same ops (``float() -> / T -> log_softmax -> gather``) on one chunk of tokens at a time,
keeps only the logits and recomputes each chunk's log-softmax in the backward. Every op is
row-wise, so outputs and gradients are bitwise those of the plain formula (``plain_logprobs``);
it saves the float32 copies but still holds the logits and their gradient.

``fused_logprobs`` (from the final hidden states): the lm_head matmul itself runs chunk by chunk
under activation checkpointing (as verl's ``FusedLinearForPPO`` and Liger's fused linear losses
do), so the full logits never exist; each chunk's logits are recomputed in the backward. The
matmul of a chunk and the weight gradient summed over chunks round differently from the
one-matmul forward: equal within float tolerance, not bitwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

#: Bytes of float32 logits one chunk may hold (64 MiB: 110 tokens of a 151,936-row vocabulary,
#: 131,072 tokens of a 128-row one). A few such temporaries live at once; the chunk bounds them
#: whatever the length, and is large enough that the per-chunk overhead stays negligible.
CHUNK_BYTES = 64 << 20


def chunk_tokens(vocab: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk for a vocabulary of ``vocab`` rows (at least 1).

    >>> chunk_tokens(151_936), chunk_tokens(128), chunk_tokens(10**9)
    (110, 131072, 1)
    """
    return max(1, chunk_bytes // (4 * max(vocab, 1)))


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits.float() / T)``: the distribution the engine sampled from."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def _entropy(log_probs: torch.Tensor) -> torch.Tensor:
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def plain_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return the plain formula's (B, C) logprobs of ``token_ids`` under (B, C, V) ``logits / T``.

    Keeps the full float32 log-softmax for the backward; ``chunked_logprobs`` computes the same
    bits without it. Entropy (no gradient) is ``-sum(p log p)``.
    """
    log_probs = _log_softmax(logits, temperature)  # (B, C, V)
    logprobs = log_probs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)  # (B, C)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = _entropy(log_probs)
    return logprobs, entropy


def _chunks(length: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, length)) for s in range(0, length, size)]


class _ChunkedLogprobs(torch.autograd.Function):
    """(B, L, V) logits -> (B, C) logprobs of the tokens at columns ``start .. start + C``.

    The logits are taken whole (not a column slice of them) so that the backward writes one
    (B, L, V) gradient in place: a slice's backward would allocate a second full-size tensor.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        logits: torch.Tensor,
        token_ids: torch.Tensor,
        start: int,
        temperature: float,
        chunk: int,
        entropy_out: list[torch.Tensor],
    ) -> torch.Tensor:
        rows, length = token_ids.shape
        out = torch.empty((rows, length), dtype=torch.float32, device=logits.device)
        entropy = torch.empty_like(out) if entropy_out is not None else None
        for b in range(rows):
            for s, e in _chunks(length, chunk):
                log_probs = _log_softmax(logits[b, start + s : start + e], temperature)
                out[b, s:e] = log_probs.gather(-1, token_ids[b, s:e, None]).squeeze(-1)
                if entropy is not None:
                    entropy[b, s:e] = _entropy(log_probs)
        if entropy is not None:
            entropy_out.append(entropy)
        ctx.save_for_backward(logits, token_ids)
        ctx.start, ctx.temperature, ctx.chunk = start, temperature, chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        logits, token_ids = ctx.saved_tensors
        start, temperature, chunk = ctx.start, ctx.temperature, ctx.chunk
        rows, length = token_ids.shape
        grad_logits = torch.zeros_like(logits)
        # Each chunk's gradient is the plain formula's, run by autograd on the chunk: the same
        # kernels (gather's scatter, log_softmax's backward, the division's, the cast's), row
        # by row, hence the same bits.
        for b in range(rows):
            for s, e in _chunks(length, chunk):
                with torch.enable_grad():
                    piece = logits[b, start + s : start + e].detach().requires_grad_(True)
                    log_probs = _log_softmax(piece, temperature)
                    picked = log_probs.gather(-1, token_ids[b, s:e, None]).squeeze(-1)
                    (piece_grad,) = torch.autograd.grad(picked, piece, grad[b, s:e])
                grad_logits[b, start + s : start + e] = piece_grad
        return grad_logits, None, None, None, None, None


def chunked_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    *,
    start: int = 0,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, C) logprobs of ``token_ids`` under ``logits[:, start : start + C] / T``, chunked.

    Bitwise equal to ``plain_logprobs`` on that slice, gradients included, with only the
    (B, L, V) ``logits`` kept for the backward (no float32 copy, no log-softmax): each chunk of
    ``chunk`` tokens (default ``chunk_tokens(V)``) is recomputed there. The entropy (no
    gradient) is computed chunk by chunk in the same pass.
    """
    size = chunk or chunk_tokens(logits.shape[-1])
    entropy: list[torch.Tensor] | None = [] if with_entropy else None
    logprobs = _ChunkedLogprobs.apply(logits, token_ids, start, temperature, size, entropy)
    return logprobs, entropy[0] if entropy else None


class _FusedLinearLogprobs(torch.autograd.Function):
    """(B, L, H) hidden states and an output layer's weight (V, H) -> (B, C) token logprobs.

    Forward: per chunk, ``linear -> float -> / T -> log_softmax -> gather`` with nothing kept
    but the inputs. Backward: per chunk, the logits are recomputed, the gradient of the
    log-softmax and gather with respect to them is autograd's (as in ``_ChunkedLogprobs``), and
    the two matmul gradients are written in place: into the hidden states' gradient and, with
    ``addmm_``, into one float32 weight gradient, so the memory is one weight-sized buffer plus
    one chunk's logits, whatever the length.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        token_ids: torch.Tensor,
        start: int,
        temperature: float,
        chunk: int,
        entropy_out: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        rows, length = token_ids.shape
        out = torch.empty((rows, length), dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(out) if entropy_out is not None else None
        for b in range(rows):
            for s, e in _chunks(length, chunk):
                logits = torch.nn.functional.linear(hidden[b, start + s : start + e], weight, bias)
                log_probs = _log_softmax(logits, temperature)
                out[b, s:e] = log_probs.gather(-1, token_ids[b, s:e, None]).squeeze(-1)
                if entropy is not None:
                    entropy[b, s:e] = _entropy(log_probs)
        if entropy_out is not None and entropy is not None:
            entropy_out.append(entropy)
        ctx.save_for_backward(hidden, weight, bias, token_ids)
        ctx.start, ctx.temperature, ctx.chunk = start, temperature, chunk
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, token_ids = ctx.saved_tensors
        start, temperature, chunk = ctx.start, ctx.temperature, ctx.chunk
        rows, length = token_ids.shape
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        # Only for a head that trains: a frozen one (LoRA's lm_head) would get a
        # (V, H) float32 buffer, 2.2 GB for a 7B model's 151,936 x 3,584 head, on the GPU
        # beside the activations at every micro-batch's backward, for nothing.
        float32 = {"dtype": torch.float32, "device": weight.device}
        grad_weight = torch.zeros(weight.shape, **float32) if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], **float32) if need_bias else None
        for b in range(rows):
            for s, e in _chunks(length, chunk):
                piece = hidden[b, start + s : start + e]
                logits = torch.nn.functional.linear(piece, weight, bias).detach()
                with torch.enable_grad():
                    logits.requires_grad_(True)
                    log_probs = _log_softmax(logits, temperature)
                    picked = log_probs.gather(-1, token_ids[b, s:e, None]).squeeze(-1)
                    (grad_logits,) = torch.autograd.grad(picked, logits, grad[b, s:e])
                if grad_hidden is not None:
                    grad_hidden[b, start + s : start + e] = grad_logits @ weight
                if grad_weight is not None:
                    grad_weight.addmm_(grad_logits.t().float(), piece.float())
                if grad_bias is not None:
                    grad_bias += grad_logits.float().sum(0)
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None and bias is not None else None,
            None,
            None,
            None,
            None,
            None,
        )


def fused_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    *,
    vocab: int,
    start: int = 0,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, C) logprobs of ``token_ids`` from the final hidden states, never the full logits.

    ``hidden`` (B, L, H) are the inputs of the output layer ``head`` (the model's lm_head,
    LoRA-wrapped or tied to the embeddings: it is called as a module, so its parameters get
    their gradients); column ``start + t`` predicts ``token_ids[:, t]``. Each chunk of
    ``chunk`` tokens (default ``chunk_tokens(vocab)``) runs ``head -> float -> / T ->
    log_softmax -> gather`` under non-reentrant activation checkpointing: only the chunk's
    hidden states are kept, its logits are recomputed in the backward (one extra head matmul
    per token). The values equal ``plain_logprobs(head(hidden))`` within float tolerance.
    """
    from torch.utils.checkpoint import checkpoint

    size = chunk or chunk_tokens(vocab)
    rows, length = token_ids.shape
    if type(head) is torch.nn.Linear:  # the usual lm_head (tied or not): in-place gradients
        entropy_out: list[torch.Tensor] | None = [] if with_entropy else None
        logprobs = _FusedLinearLogprobs.apply(
            hidden, head.weight, head.bias, token_ids, start, temperature, size, entropy_out
        )
        return logprobs, entropy_out[0] if entropy_out else None
    # Any other output layer (LoRA-wrapped, quantized): the module itself, chunk by chunk under
    # activation checkpointing (its parameters' gradients summed over the chunks by autograd).
    # The entropy is a metric (no gradient): computed in the forward only, not again when the
    # backward recomputes a chunk (which reads nothing but the saved tensors' recomputation).
    forward = [with_entropy]

    def run(piece: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = _log_softmax(head(piece), temperature)  # (n, V), freed after the chunk
        picked = log_probs.gather(-1, ids[:, None]).squeeze(-1)
        if not forward[0]:
            return picked, picked.detach()
        with torch.no_grad():
            return picked, _entropy(log_probs)

    logprobs = torch.zeros((rows, length), dtype=torch.float32, device=hidden.device)
    entropy = torch.zeros_like(logprobs) if with_entropy else None
    pieces: list[torch.Tensor] = []
    for b in range(rows):
        for s, e in _chunks(length, size):
            piece, ent = checkpoint(
                run, hidden[b, start + s : start + e], token_ids[b, s:e], use_reentrant=False
            )
            pieces.append(piece)
            if entropy is not None:
                entropy[b, s:e] = ent
    forward[0] = False
    if pieces:
        logprobs = torch.cat(pieces).view(rows, length)
    return logprobs, entropy


@dataclass(frozen=True)
class HeadChoice:
    """Which path turns hidden states into log-probs (``OptimConfig.logprob_head``).

    The defaults are the configuration's; ``setup.settings.head_choice`` gives a run's.

    >>> HeadChoice().fuses(tokens=100, vocab=151_936), HeadChoice().fuses(1000, 151_936)
    (False, True)
    >>> HeadChoice("chunked").fuses(10**6, 10**6), HeadChoice("fused").fuses(1, 2)
    (False, True)
    """

    path: Literal["auto", "chunked", "fused", "liger"] = "auto"
    """``liger``: the update's loss is Liger's (``grpo_train.learner.liger_loss``); log-probs alone
    (the KL reference's, the metrics') take the fused head."""
    fused_above_mib: int = 256

    def __post_init__(self) -> None:
        if self.path not in ("auto", "chunked", "fused", "liger"):
            raise ValueError(
                f"logprob head must be auto, chunked, fused or liger, got {self.path!r}"
            )

    def fuses(self, tokens: int, vocab: int) -> bool:
        """Whether ``tokens`` logit rows of ``vocab`` entries go through the fused head."""
        if self.path != "auto":
            return self.path in ("fused", "liger")
        return tokens * vocab * 4 > self.fused_above_mib * (1 << 20)


#: The configuration's default choice (``OptimConfig.logprob_head``), shared as a default value.
DEFAULT_HEAD = HeadChoice()
