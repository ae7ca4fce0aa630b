"""Turn the trainer's module into the plain checkpoint tensors a rollout engine loads.

Handles the two wrinkles of weight sync: tied weights (one tensor under two names, which
safetensors refuses to save twice) and PEFT/LoRA wrappers, whose parameter names
(``base_model.model.<name>.base_layer.weight``, ``lora_A``...) the engines do not know.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def checkpoint_state_dict(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Return the weights under the base model's checkpoint names, LoRA adapters merged in.

    A PEFT model's active LoRA adapters are folded in as ``W + scale * B @ A`` computed from the
    adapter (``get_delta_weight``), without touching the trainer's weights: no merge/unmerge round
    trip that would drift the base weights in low precision, and no ``merge_and_unload`` copy of
    the model (slow, and a full second copy of the weights in memory). Adapters with
    no ``get_delta_weight`` (DoRA, other tuners) fall back to PEFT's ``merge_adapter`` /
    ``unmerge_adapter``. Tensors that share storage (tied embeddings) appear once, under their
    first name, which is the one vLLM's loaders expect (``model.embed_tokens.weight``).
    Tensors are detached, on CPU only when ``dtype`` conversion requires a copy anyway.
    """
    import torch

    with torch.no_grad(), _merged_view(model) as (base, deltas):
        out: dict[str, torch.Tensor] = {}
        seen: set[tuple[int, int]] = set()
        for name, tensor in base.state_dict().items():
            if ".lora_" in name or ".original_module." in name:
                continue
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
            if key in seen:
                continue  # a tied weight already emitted under its first name
            seen.add(key)
            value = tensor.detach()
            if name in deltas:
                value = value + deltas[name].to(value.dtype)
            out[_checkpoint_name(name)] = value if dtype is None else value.to(dtype)
        return out


def _checkpoint_name(name: str) -> str:
    """Map a (PEFT) state-dict name to the base checkpoint name."""
    name = name.replace(".base_layer.", ".")
    if ".modules_to_save." in name:
        # "<module>.modules_to_save.<adapter>.weight" -> "<module>.weight"
        head, _, tail = name.partition(".modules_to_save.")
        name = f"{head}.{tail.split('.', 1)[1]}"
    return name


@contextlib.contextmanager
def _merged_view(
    model: torch.nn.Module,
) -> Iterator[tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    """Yield the base module and the LoRA deltas to add, keyed by base-layer weight name."""
    try:
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft not installed: nothing can hold LoRA layers
        yield model, {}
        return
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    layers: list[tuple[str, Any]] = [
        (name, module)
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and not module.merged
    ]
    if all(_has_plain_delta(module) for _, module in layers):
        deltas: dict[str, torch.Tensor] = {}
        for mod_name, module in layers:
            for adapter in module.active_adapters:
                if adapter in module.lora_A or adapter in module.lora_embedding_A:
                    delta = module.get_delta_weight(adapter)
                    key = f"{mod_name}.base_layer.weight"
                    deltas[key] = deltas[key] + delta if key in deltas else delta
        yield base, deltas
        return
    # DoRA or a layer type without get_delta_weight: let PEFT merge in place and undo it after.
    for _, layer in layers:
        layer.merge()
    try:
        yield base, {}
    finally:
        for _, layer in layers:
            layer.unmerge()


def _has_plain_delta(module: Any) -> bool:
    """Tell whether ``W + get_delta_weight(adapter)`` is the merged weight for each adapter."""
    return hasattr(module, "get_delta_weight") and not any(
        module.use_dora.get(adapter, False) for adapter in module.active_adapters
    )
