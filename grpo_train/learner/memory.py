"""How the training model holds its memory: activation recomputation, mixed precision, offload.

Gradient checkpointing, autocast and moving an offloaded module (the KL reference kept in host
RAM) to the device for a while. Each helper is a small function the trainer calls at one place;
none holds state of its own. Peak-memory readings are metrics (``grpo_train.collect.metrics``);
putting the rollout engine to sleep during the update is the engine's
(``rollout.base.engine_asleep``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in the backward pass (less memory, ~30% more compute).

    Non-reentrant checkpointing (``use_reentrant=False``) is the variant PyTorch recommends: it
    supports inputs without ``requires_grad`` and keyword arguments. A peft model additionally
    gets ``enable_input_require_grads``: its embeddings are frozen, and with a reentrant
    checkpoint (which some models still force) no gradient would reach the adapters otherwise
    (transformers' PEFT guide documents this). The KV cache is switched off, which
    checkpointing cannot use anyway.
    """
    from grpo_train.models.hf_compat import enable_checkpointing

    target: Any = model
    peft_like = hasattr(model, "get_base_model")
    enable_checkpointing(model, {"use_reentrant": False})
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
    if home.type == target.type and target.index in (None, home.index):
        yield module  # already there (an outer on_device holds it): nothing to move or release
        return
    module.to(target)
    try:
        yield module
    finally:
        module.to(home)
        if release and target.type == "cuda":
            torch.cuda.empty_cache()
