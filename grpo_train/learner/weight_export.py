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

``export_stream(model)`` yields the same tensors one at a time, for engine syncs: a LoRA
layer's merged weight is computed when it is reached (never a merged copy of the model), and a
sharded FSDP2 model gathers one tensor at a time (every rank takes part, only the ranks that
``keep`` hold the result, and only until the consumer moves on), so a sync's extra memory is a
layer, not the float32 model. ``save_merged`` (checkpoints) and ``sync_rollout_weights``
(engines) both go through these, so what is saved and what the engine generates with are the
same tensors (``export_state_dict`` of a replicated model is ``dict(export_stream(model))``).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from grpo_train.parallel.distributed import unwrap_model

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
    else:
        state = dict(export_stream(model))
    if dtype is None:
        return state
    return {k: v.to(dtype) for k, v in state.items()}


def export_stream(
    model: torch.nn.Module, *, keep: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``export_state_dict(model)``'s tensors one at a time (module doc), without a copy.

    Collective for a sharded model: every rank consumes the whole stream in the same order;
    with ``keep`` False this rank takes part in the gathers and yields nothing (the servers'
    sender is another rank). A yielded tensor may be a view of the trainer's weights: use it
    before advancing the stream, and do not change it.
    """
    if is_sharded(model):
        scale = _model_lora_scale(model)
        stream = _sharded_stream(model, keep)
        yield from stream if scale is None else _merge_lora_stream(stream, scale)
    elif not keep:
        return
    elif is_quantized(model):
        yield from _dequantized_merge(unwrap_model(model))
    else:
        yield from _merged_view_stream(unwrap_model(model))


def sync_rollout_weights(engine: RolloutEngine, model: torch.nn.Module) -> int:
    """Push the policy's current weights into this rank's engine; collective when sharded.

    An engine that generates with the trainer's own module (the HF engine's default) has
    nothing to load. A sharded policy needs an engine with its own copy of the weights (vLLM, or
    ``HFEngine(model_path)``): every rank gathers (the all-gathers are collectives; a rank that
    skipped them would hang the others) and feeds its own engine. An engine that loads a
    stream (``StreamingEngine``: vLLM, the servers) gets ``export_stream``, one tensor at a
    time; the others a state dict. Returns the bytes handed to the engine (0 when it shares
    the module).
    """
    from grpo_train.rollout.base import StreamingEngine

    if engine.shares_weights(unwrap_model(model)):
        engine.sync_weights({})
        return 0
    if isinstance(engine, StreamingEngine):
        sent = [0]

        def counted(
            stream: Iterable[tuple[str, torch.Tensor]],
        ) -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in stream:
                sent[0] += tensor.numel() * tensor.element_size()
                yield name, tensor

        engine.sync_weight_stream(counted(export_stream(model, keep=engine.wants_weights)))
        return sent[0]
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


def _merged_view_stream(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Weights under base checkpoint names with the active LoRA deltas added; model untouched.

    No merge/unmerge round trip that would drift the base weights in low precision, and no
    ``merge_and_unload`` copy of the model (slow, and a second full copy in memory): each
    layer's delta is computed when its weight is reached, so one merged layer exists at a time.
    Adapters with no ``get_delta_weight`` (DoRA, other tuners) fall back to PEFT's ``merge`` /
    ``unmerge`` (the weights are then copied as they go: ``unmerge`` runs at the stream's end).
    Tensors that share storage (tied embeddings) appear once, under their first name, which is
    the one vLLM's loaders expect (``model.embed_tokens.weight``).
    """
    with torch.no_grad(), _merged_view(model) as (base, deltas, merged_in_place):
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
                value = value + deltas[name]().to(value.dtype)
            elif merged_in_place:
                value = value.clone()
            yield _checkpoint_name(name), value


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
) -> Iterator[tuple[torch.nn.Module, dict[str, Callable[[], torch.Tensor]], bool]]:
    """Yield the base module, the LoRA deltas to add and whether PEFT merged them in place.

    The deltas are keyed by base-layer weight name and computed when called.
    """
    try:
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft not installed: nothing can hold LoRA layers
        yield model, {}, False
        return
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    layers: list[tuple[str, Any]] = [
        (name, module)
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and not module.merged
    ]
    if all(_has_plain_delta(module) for _, module in layers):
        parts: dict[str, list[tuple[Any, str]]] = {}
        for mod_name, module in layers:
            for adapter in module.active_adapters:
                if adapter in module.lora_A or adapter in module.lora_embedding_A:
                    parts.setdefault(f"{mod_name}.base_layer.weight", []).append((module, adapter))
        yield (
            base,
            {key: functools.partial(_summed_delta, pairs) for key, pairs in parts.items()},
            False,
        )
        return
    # DoRA or a layer type without get_delta_weight: let PEFT merge in place and undo it after.
    for _, layer in layers:
        layer.merge()
    try:
        yield base, {}, True
    finally:
        for _, layer in layers:
            layer.unmerge()


def _summed_delta(pairs: list[tuple[Any, str]]) -> torch.Tensor:
    """Return the sum of ``module.get_delta_weight(adapter)`` over ``pairs``, in order."""
    total: torch.Tensor | None = None
    for module, adapter in pairs:
        delta = module.get_delta_weight(adapter)
        total = total + delta if total is not None else delta
    assert total is not None  # every key has a pair
    return total


def _has_plain_delta(module: Any) -> bool:
    """Tell whether ``W + get_delta_weight(adapter)`` is the merged weight for each adapter."""
    return hasattr(module, "get_delta_weight") and not any(
        module.use_dora.get(adapter, False) for adapter in module.active_adapters
    )


# ------------------------------------------------------------------------- 4-bit bases


def _dequantized_merge(peft_model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Merge by walking the modules: dequantize each base weight, add the LoRA delta.

    Works on any LoRA model (on a full-precision base ``dequantize_module_weight`` returns the
    weight unchanged), which is how it is tested on CPU against the merged view. One layer's
    dequantized weight exists at a time.
    """
    from peft.tuners.lora import LoraLayer
    from peft.utils.integrations import dequantize_module_weight

    base: Any = peft_model.get_base_model()  # type: ignore[operator]
    done: list[str] = []  # module prefixes whose tensors are already emitted
    seen: set[tuple[int, int]] = set()  # storages emitted (a tied weight goes out once)

    def dequantized(module: torch.nn.Module) -> torch.Tensor:
        weight = dequantize_module_weight(module).detach()
        return weight.to(getattr(module, "compute_dtype", None) or weight.dtype)

    def storage(tensor: torch.Tensor) -> tuple[int, int]:
        return (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()))

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
            seen.add(storage(weight))
            yield f"{name}.weight", weight
            bias: Any = getattr(layer, "bias", None)
            if bias is not None:
                seen.add(storage(bias))
                yield f"{name}.bias", bias.detach()
            done.append(name + ".")
        for name, tensor in base.state_dict().items():
            if ".lora_" in name or name.startswith(tuple(done)):
                continue
            key = storage(tensor)
            if key in seen:
                continue  # a tied weight already emitted under its first name
            seen.add(key)
            yield name, tensor.detach()


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
    for a LoRA model: merge them with ``merge_lora_state_dict``, below). With ``rank0_only`` the
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
    rank = dist.get_rank() if dist.is_initialized() else 0
    return dict(_deepspeed_stream(model, rank0_only, keep=not rank0_only or rank == 0))


def _deepspeed_stream(
    model: torch.nn.Module, rank0_only: bool, keep: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ZeRO-3 parameters gathered one at a time (every rank calls; ``keep``: this one's)."""
    import deepspeed

    module = unwrap_model(model)
    for name, param in module.named_parameters():
        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            if keep:
                value = param.detach().cpu().clone() if rank0_only else param.detach().clone()
        if keep:
            yield name, value
    for name, buffer in module.named_buffers():
        if keep:
            yield name, buffer.detach().clone()


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
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        if name.endswith(".base_layer.weight"):
            module = name[: name.index(".base_layer.")]
            lora_a = state.get(f"{module}.lora_A.{adapter}.weight")
            lora_b = state.get(f"{module}.lora_B.{adapter}.weight")
            if lora_a is not None and lora_b is not None:
                tensor = _merged_weight(tensor, lora_a, lora_b, scale)
        out[_merged_name(name)] = tensor
    return out


def _merged_name(name: str) -> str:
    """Return a PEFT state-dict name under the base checkpoint's name.

    >>> _merged_name("base_model.model.layers.0.q.base_layer.weight")
    'layers.0.q.weight'
    """
    prefix = "base_model.model."
    short = name[len(prefix) :] if name.startswith(prefix) else name
    return short.replace(".base_layer.", ".") if ".base_layer." in short else short


def _merged_weight(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float
) -> torch.Tensor:
    """Return ``base + scale * B @ A`` computed in float32, in ``base``'s dtype."""
    delta = (lora_b.float() @ lora_a.float()) * scale  # (out, r) @ (r, in)
    return (base.float() + delta).to(base.dtype)


def _merge_lora_stream(
    tensors: Iterable[tuple[str, torch.Tensor]], scale: float, adapter: str = "default"
) -> Iterator[tuple[str, torch.Tensor]]:
    """``merge_lora_state_dict`` over a stream: the same tensors, a layer held at a time.

    A base weight waits until its adapter's ``lora_A`` and ``lora_B`` have come (in a PEFT
    state dict they follow it); a base weight whose adapter never comes goes out unmerged at
    the end, as in ``merge_lora_state_dict``.
    """
    waiting: dict[str, torch.Tensor] = {}  # module -> its base weight
    factors: dict[str, dict[str, torch.Tensor]] = {}  # module -> {"A": ..., "B": ...}
    a_tail, b_tail = f".lora_A.{adapter}.weight", f".lora_B.{adapter}.weight"

    def ready(module: str) -> Iterator[tuple[str, torch.Tensor]]:
        got = factors.get(module, {})
        if module in waiting and "A" in got and "B" in got:
            base = waiting.pop(module)
            factors.pop(module)
            yield (
                _merged_name(f"{module}.base_layer.weight"),
                _merged_weight(base, got["A"], got["B"], scale),
            )

    for name, tensor in tensors:
        if ".lora_" in name:
            for tail, key in ((a_tail, "A"), (b_tail, "B")):
                if name.endswith(tail):
                    module = name[: -len(tail)]
                    factors.setdefault(module, {})[key] = tensor
                    yield from ready(module)
            continue
        if name.endswith(".base_layer.weight"):
            module = name[: name.index(".base_layer.")]
            waiting[module] = tensor
            yield from ready(module)
            continue
        yield _merged_name(name), tensor
    for module, base in waiting.items():
        yield _merged_name(f"{module}.base_layer.weight"), base


#: Wrapper modules whose names torch's ``get_model_state_dict`` leaves out of parameter names.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def _sharded_stream(model: torch.nn.Module, keep: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """Gather a sharded model's full tensors one at a time (collective: every rank, in order).

    FSDP2 (DTensor parameters): each tensor's ``full_tensor()`` all-gather, kept on this
    rank's device only when ``keep`` and only until the consumer moves on, so no rank holds
    the whole float32 model (``get_model_state_dict`` gathers every tensor first). ZeRO-3: one
    ``GatheredParameters`` at a time. FSDP1 flat parameters have no per-tensor gather here:
    the full state dict is gathered, as before.
    """
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        yield from _deepspeed_stream(model, rank0_only=False, keep=keep)
        return
    module = unwrap_model(model)
    if type(model).__name__ == "FullyShardedDataParallel" or any(
        type(p).__name__ == "FlatParameter" for p in model.parameters()
    ):
        state = full_state_dict(model)
        if keep:
            yield from state.items()
        return
    from torch.distributed.tensor import DTensor

    # A tied weight (embed_tokens / lm_head) is one parameter under two names: it goes out once,
    # under its first name, as the replicated export sends it. Decided from the module's
    # structure (the same on every rank), not from storage, which an empty shard does not have.
    param_of = {n: id(p) for n, p in module.named_parameters(remove_duplicate=False)}
    sent: set[int] = set()
    for name, tensor in module.state_dict().items():
        if not isinstance(tensor, torch.Tensor):
            continue
        if name in param_of:
            if param_of[name] in sent:
                continue
            sent.add(param_of[name])
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()
        if keep:
            for part in _WRAPPER_PARTS:
                name = name.replace(part, "")
            yield name, full
        del full
