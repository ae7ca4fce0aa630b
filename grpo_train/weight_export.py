"""The one path from the trainer's module to plain checkpoint tensors: saving and engine sync.

``export_state_dict(model)`` returns the weights under the base checkpoint's names
(``model.layers.0.self_attn.q_proj.weight``), with a LoRA adapter folded in, whatever the policy
is wrapped in:

* replicated (one process, DDP): LoRA deltas are added to a view of the base weights
  (``W + scale * B @ A`` from PEFT's ``get_delta_weight``), the trainer's weights untouched;
* a 4-bit / 8-bit (QLoRA) base: each layer is dequantized first (merging into packed 4-bit
  weights would be meaningless);
* sharded (FSDP1/2, DeepSpeed ZeRO-3): the full state dict is gathered from the shards
  (collective: every rank calls), then the adapter is merged on the gathered tensors.

``save_merged`` (checkpoints) and ``sync_rollout_weights`` (engines) both call it, so what is
saved and what the engine generates with are the same tensors. Engines take a state dict.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from grpo_train.distributed import unwrap_model

if TYPE_CHECKING:
    from grpo_train.rollout.base import RolloutEngine


def lora_scale(r: int, alpha: float, use_rslora: bool = False) -> float:
    """Return the factor LoRA multiplies ``B @ A`` by: ``alpha / r`` (rsLoRA: ``alpha / sqrt(r)``).

    rsLoRA: "A Rank Stabilization Scaling Factor for Fine-Tuning with LoRA" (arXiv 2312.03732).

    >>> lora_scale(8, 16), lora_scale(4, 8, use_rslora=True)
    (2.0, 4.0)
    """
    return alpha / math.sqrt(r) if use_rslora else alpha / r


def export_state_dict(
    model: torch.nn.Module, *, dtype: torch.dtype | None = None, rank0_only: bool = False
) -> dict[str, torch.Tensor]:
    """Return the policy's weights under base checkpoint names, LoRA merged (module doc).

    Collective for a sharded model (call on every rank); with ``rank0_only`` the gathered tensors
    land on rank 0's CPU and the other ranks get ``{}`` (for saving). ``dtype`` converts.
    """
    if is_sharded(model):
        state = full_state_dict(model, rank0_only=rank0_only)
        scale = _model_lora_scale(model)
        if scale is not None and state:
            state = merge_lora_state_dict(state, scale)
    elif is_quantized(model):
        state = _dequantized_merge(unwrap_model(model))
    else:
        state = _merged_view_state_dict(unwrap_model(model))
    if dtype is None:
        return state
    return {k: v.to(dtype) for k, v in state.items()}


def sync_rollout_weights(engine: RolloutEngine, model: torch.nn.Module) -> int:
    """Push the policy's current weights into this rank's engine; collective when sharded.

    An engine that generates with the trainer's own module (the HF engine's default) has
    nothing to load. A sharded policy needs an engine with its own copy of the weights (vLLM, or
    ``HFEngine(model_path)``): every rank gathers (the all-gathers are collectives; a rank that
    skipped them would hang the others) and feeds its own engine. Returns the bytes handed to
    the engine (0 when it shares the module).
    """
    if engine.shares_weights(unwrap_model(model)):
        engine.sync_weights({})
        return 0
    state = export_state_dict(model)
    engine.sync_weights(state)
    return sum(t.numel() * t.element_size() for t in state.values())


def _model_lora_scale(model: torch.nn.Module) -> float | None:
    """``lora_scale`` of the PEFT model inside ``model``; None for a plain model."""
    from peft import PeftModel

    inner = unwrap_model(model)
    if not isinstance(inner, PeftModel):
        return None
    config: Any = inner.peft_config[inner.active_adapter]
    return lora_scale(config.r, config.lora_alpha, bool(getattr(config, "use_rslora", False)))


def is_quantized(model: torch.nn.Module) -> bool:
    """Tell whether the (PEFT-wrapped) model's base was loaded in 4-bit or 8-bit."""
    inner: Any = unwrap_model(model)
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    return bool(
        getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False)
    )


# ------------------------------------------------------------------------- replicated modules


def _merged_view_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights under base checkpoint names with the active LoRA deltas added; model untouched.

    No merge/unmerge round trip that would drift the base weights in low precision, and no
    ``merge_and_unload`` copy of the model (slow, and a second full copy in memory). Adapters
    with no ``get_delta_weight`` (DoRA, other tuners) fall back to PEFT's ``merge`` / ``unmerge``.
    Tensors that share storage (tied embeddings) appear once, under their first name, which is
    the one vLLM's loaders expect (``model.embed_tokens.weight``).
    """
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
            out[_checkpoint_name(name)] = value
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


# ------------------------------------------------------------------------- 4-bit bases


def _dequantized_merge(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Merge by walking the modules: dequantize each base weight, add the LoRA delta.

    Works on any LoRA model (on a full-precision base ``dequantize_module_weight`` returns the
    weight unchanged), which is how it is tested on CPU against the merged view.
    """
    from peft.tuners.lora import LoraLayer
    from peft.utils.integrations import dequantize_module_weight

    base: Any = peft_model.get_base_model()  # type: ignore[operator]
    out: dict[str, torch.Tensor] = {}
    done: list[str] = []  # module prefixes whose tensors are already emitted

    def dequantized(module: torch.nn.Module) -> torch.Tensor:
        weight = dequantize_module_weight(module).detach()
        return weight.to(getattr(module, "compute_dtype", None) or weight.dtype)

    with torch.no_grad():
        for name, module in base.named_modules():
            if name.startswith(tuple(done)):
                # Inside a layer already emitted: a LoRA layer's own 4-bit ``base_layer`` (its
                # weight went out merged, under the layer's name) or its adapters. Emitting
                # it again would add ``<m>.base_layer.weight``, a name no checkpoint has.
                continue
            if isinstance(module, LoraLayer):
                lora_layer: Any = module  # peft's concrete layers define get_delta_weight
                layer = module.get_base_layer()
                weight = dequantized(layer)
                for adapter in module.active_adapters:
                    if adapter in module.lora_A and not module.merged:
                        weight = weight + lora_layer.get_delta_weight(adapter).to(weight.dtype)
            elif type(getattr(module, "weight", None)).__name__ in ("Params4bit", "Int8Params"):
                layer, weight = module, dequantized(module)
            else:
                continue
            out[f"{name}.weight"] = weight
            bias: Any = getattr(layer, "bias", None)
            if bias is not None:
                out[f"{name}.bias"] = bias.detach()
            done.append(name + ".")
        seen = {(t.untyped_storage().data_ptr(), t.storage_offset()) for t in out.values()}
        for name, tensor in base.state_dict().items():
            if ".lora_" in name or name.startswith(tuple(done)):
                continue
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
            if key in seen:
                continue  # a tied weight already emitted under its first name
            seen.add(key)
            out[name] = tensor.detach()
    return out


# ------------------------------------------------------------------------- sharded models


def is_sharded(model: torch.nn.Module) -> bool:
    """Tell whether this rank holds only shards of the parameters (FSDP1/2, DeepSpeed ZeRO-3)."""
    if type(model).__name__ == "FullyShardedDataParallel":
        return True
    return any(
        type(p).__name__ == "DTensor" or hasattr(p, "ds_id") or type(p).__name__ == "FlatParameter"
        for p in model.parameters()
    )


def full_state_dict(model: torch.nn.Module, *, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """Gather the model's complete state dict on every rank (or only rank 0) from its shards.

    DDP, FSDP1 and FSDP2 go through ``torch.distributed.checkpoint.state_dict.
    get_model_state_dict`` (full tensors, wrapper prefixes removed); DeepSpeed ZeRO-3 through
    ``deepspeed.zero.GatheredParameters``. Names are the unwrapped module's (``PeftModel`` names
    for a LoRA model: merge them with ``lora.merge_lora_state_dict``). With ``rank0_only`` the
    tensors land on rank 0's CPU and other ranks get ``{}`` (for saving); otherwise every rank
    gets them on its device (for each rank's colocated engine). Collective: call on all ranks.
    """
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        return _deepspeed_full_state_dict(model, rank0_only)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not (dist.is_available() and dist.is_initialized()):
        return {k: v.detach() for k, v in unwrap_model(model).state_dict().items()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
    state = get_model_state_dict(model, options=options)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _deepspeed_full_state_dict(model: torch.nn.Module, rank0_only: bool) -> dict[str, torch.Tensor]:
    """Gather ZeRO-3 partitions parameter by parameter (bounded peak memory), as TRL does."""
    import deepspeed

    module = unwrap_model(model)
    rank = dist.get_rank() if dist.is_initialized() else 0
    out: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters():
        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            if not rank0_only:
                out[name] = param.detach().clone()
            elif rank == 0:
                out[name] = param.detach().cpu().clone()
    for name, buffer in module.named_buffers():
        if not rank0_only or rank == 0:
            out[name] = buffer.detach().clone()
    return out


def merge_lora_state_dict(
    state: Mapping[str, torch.Tensor], scale: float, adapter: str = "default"
) -> dict[str, torch.Tensor]:
    """Merge LoRA tensors inside a full PEFT *state dict* (names as ``PeftModel.state_dict()``).

    For sharded training (FSDP, ZeRO-3) the gathered state dict is all there is on the syncing
    rank, not a module with LoRA layers. Each ``<m>.base_layer.weight`` becomes ``<m>.weight +
    scale * B @ A``; ``base_model.model.`` and ``lora_`` entries are dropped. ``scale`` is
    ``lora_scale`` of the adapter (uniform rank and alpha; rank/alpha patterns and DoRA are not
    handled here and ``apply_lora`` never creates them).
    """
    prefix = "base_model.model."
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        short = name[len(prefix) :] if name.startswith(prefix) else name
        if ".base_layer." in short:
            module = name[: name.index(".base_layer.")]
            short = short.replace(".base_layer.", ".")
            if name.endswith(".base_layer.weight"):
                lora_a = state.get(f"{module}.lora_A.{adapter}.weight")
                lora_b = state.get(f"{module}.lora_B.{adapter}.weight")
                if lora_a is not None and lora_b is not None:
                    delta = (lora_b.float() @ lora_a.float()) * scale  # (out, r) @ (r, in)
                    tensor = (tensor.float() + delta).to(tensor.dtype)
        out[short] = tensor
    return out
