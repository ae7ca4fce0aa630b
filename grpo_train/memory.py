"""Memory controls: checkpointing, autocast, micro-batches, peak memory, offload, vLLM sleep.

Gradient checkpointing, mixed precision, token-budget micro-batches, peak-memory readings,
reference-model offload and vLLM sleep between rollouts.

Each helper is a small function the trainer calls at one place; none holds state of its own.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from grpo_train.rollout.base import RolloutEngine


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in the backward pass (less memory, ~30% more compute).

    Non-reentrant checkpointing (``use_reentrant=False``) is the variant PyTorch recommends: it
    supports inputs without ``requires_grad`` and keyword arguments. A peft model additionally
    gets ``enable_input_require_grads``: its embeddings are frozen, and with a reentrant
    checkpoint (which some models still force) no gradient would reach the adapters otherwise
    (transformers' PEFT guide documents this). The KV cache is switched off, which
    checkpointing cannot use anyway.
    """
    target: Any = model
    peft_like = hasattr(model, "get_base_model")
    if not hasattr(target, "gradient_checkpointing_enable"):
        raise TypeError(
            f"{type(model).__name__} has no gradient_checkpointing_enable "
            "(not a transformers model)"
        )
    target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if peft_like and hasattr(target, "enable_input_require_grads"):
        target.enable_input_require_grads()
    config = getattr(target, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = False


def autocast(
    device: str | torch.device, dtype: str | torch.dtype
) -> contextlib.AbstractContextManager[Any]:
    """Mixed-precision autocast for the training forward: bf16/fp16 on CUDA, a no-op elsewhere.

    On CPU (and for float32) the computation stays in the parameters' dtype: CPU autocast to
    bf16 is slow on most CPUs and changes results the tests compare exactly. fp16 also needs a
    gradient scaler (``torch.amp.GradScaler``), which accelerate's ``mixed_precision="fp16"``
    provides; bf16 does not.
    """
    resolved = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if resolved not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"autocast dtype must be float32, bfloat16 or float16, got {dtype!r}")
    kind = torch.device(device).type
    if kind != "cuda" or resolved == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda", dtype=resolved)


@dataclass(frozen=True)
class PeakMemory:
    """Peak memory of this process since start (or the last ``reset_peak_memory``)."""

    rss_mb: float
    """Maximum resident set size of the process in MiB (never reset by the OS)."""
    cuda_allocated_mb: float | None
    """``torch.cuda.max_memory_allocated`` in MiB; None without CUDA."""
    cuda_reserved_mb: float | None
    """``torch.cuda.max_memory_reserved`` in MiB (near nvidia-smi's); None without CUDA."""


def peak_memory() -> PeakMemory:
    """Read the process's peak host RSS and, with CUDA, the peak allocated / reserved GPU memory."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_mb = rss / (2**20 if sys.platform == "darwin" else 2**10)  # bytes on macOS, KiB on Linux
    if not torch.cuda.is_available():
        return PeakMemory(rss_mb, None, None)
    return PeakMemory(
        rss_mb,
        torch.cuda.max_memory_allocated() / 2**20,
        torch.cuda.max_memory_reserved() / 2**20,
    )


def reset_peak_memory() -> None:
    """Start a new CUDA peak-memory window (host RSS peaks cannot be reset)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


@contextlib.contextmanager
def on_device(
    module: torch.nn.Module, device: str | torch.device, *, release: bool = True
) -> Iterator[torch.nn.Module]:
    """Move an offloaded module (e.g. a reference model kept in host RAM) to ``device`` for a while.

    The module goes back to the device its parameters were on before, and with ``release`` the
    CUDA cache is emptied so the trainer gets the memory back. With LoRA no reference copy exists
    (``lora.reference_policy``); this is for full fine-tuning with ``beta > 0``. A target device
    that is not available raises ``ValueError`` instead of a CUDA error deep inside.
    """
    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("on_device: CUDA is not available on this machine")
    first = next(module.parameters(), None)
    home = first.device if first is not None else torch.device("cpu")
    module.to(target)
    try:
        yield module
    finally:
        module.to(home)
        if release and target.type == "cuda":
            torch.cuda.empty_cache()


@contextlib.contextmanager
def engine_asleep(engine: RolloutEngine, level: Literal[1, 2] = 1) -> Iterator[bool]:
    """Put a colocated engine to sleep during the update and wake it for the weight sync.

    Yields whether the engine slept (``RolloutEngine.sleep``: vLLM's sleep mode on CUDA frees
    the KV cache and offloads or drops the weights; other engines stay awake).
    """
    slept = engine.sleep(level)
    try:
        yield slept
    finally:
        if slept:
            engine.wake_up()
