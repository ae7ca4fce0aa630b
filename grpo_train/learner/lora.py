"""LoRA / QLoRA training through peft: adapters, the adapter-free KL reference, merged weights.

The pieces the trainer calls:

* ``apply_lora(model, settings)`` wraps the policy in a ``peft.PeftModel`` whose only trainable
  parameters are the LoRA matrices.
* ``reference_policy(model)`` is the KL reference: the same module with its adapter switched off
  (``PeftModel.disable_adapter``), so no second copy of the base model is kept in memory.
* ``weight_export.export_state_dict(model)`` (not here: one path for saving and engine sync)
  gives the base model's checkpoint names and tensors with the adapter folded in.
* ``save_adapter`` / ``load_adapter`` write and read adapter-only checkpoints (a few MB);
  ``save_merged`` writes a plain Hugging Face folder that transformers and vLLM load directly.

QLoRA (``use_qlora``) loads the frozen base in 4-bit NF4 with bitsandbytes, which needs a CUDA
GPU; on other machines it stops with a ``QLoraUnavailableError`` that says so.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpo_train.learner.weight_export import export_state_dict, is_quantized, lora_scale

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from grpo_train.learner.logprobs import HeadChoice
    from grpo_train.learner.micro_batches import MicroBatch


class QLoraUnavailableError(RuntimeError):
    """QLoRA was asked for where bitsandbytes 4-bit kernels cannot run (no CUDA or no package)."""


@dataclass(frozen=True)
class LoraSettings:
    """What to adapt and how; the ``lora_*`` names match the command-line / YAML options."""

    lora_r: int = 16
    """Rank of each adapter (``B @ A`` with ``A`` of shape (r, in), ``B`` of shape (out, r))."""
    lora_alpha: int = 32
    """Scale numerator: the update is ``lora_alpha / lora_r * B @ A``."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input. 0 keeps the GRPO importance ratio exactly 1 at mu = 1."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """``"all-linear"`` (every linear layer but the output head, the QLoRA paper's choice) or
    module names such as ``("q_proj", "v_proj")``."""
    use_qlora: bool = False
    """Load the frozen base in 4-bit NF4 (bitsandbytes, CUDA only) and train adapters over it."""

    def __post_init__(self) -> None:
        if self.lora_r < 1:
            raise ValueError(f"lora_r must be >= 1, got {self.lora_r}")
        if self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.lora_alpha} (common: 2 * lora_r)")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if isinstance(self.target_modules, str):
            if not self.target_modules.strip():
                raise ValueError("target_modules is empty; use 'all-linear' or module names")
        elif not self.target_modules or not all(
            isinstance(m, str) and m for m in self.target_modules
        ):
            raise ValueError(
                f"target_modules must be 'all-linear' or a non-empty tuple of module names, "
                f"got {self.target_modules!r}"
            )

    @property
    def scale(self) -> float:
        """The factor the adapter's ``B @ A`` is multiplied by."""
        return lora_scale(self.lora_r, self.lora_alpha)


# ---------------------------------------------------------------------------------------- QLoRA


def require_qlora() -> None:
    """Raise ``QLoraUnavailableError`` unless 4-bit bitsandbytes training can run here."""
    if not torch.cuda.is_available():
        raise QLoraUnavailableError(
            "use_qlora needs a CUDA GPU: bitsandbytes' 4-bit kernels do not run on this machine. "
            "Use plain LoRA (use_qlora: false) here."
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise QLoraUnavailableError("use_qlora needs bitsandbytes: pip install bitsandbytes")


def qlora_quantization_config(compute_dtype: torch.dtype = torch.bfloat16) -> Any:
    """Build the ``BitsAndBytesConfig`` of QLoRA (Dettmers et al., 2023): NF4, double quantization.

    Raises ``QLoraUnavailableError`` where it cannot run.
    """
    require_qlora()
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def qlora_compute_dtype(dtype: str, device: str) -> torch.dtype:
    """Return the dtype QLoRA's 4-bit layers compute in, for a policy at ``dtype`` on ``device``.

    The 4-bit weights are dequantized to it for each matmul. A bfloat16 policy computes in
    bfloat16; a float32 one too where the GPU has native bfloat16 (``models.loading.auto_dtype``)
    and in float32 on the others (V100, T4), which only emulate bfloat16: there a bfloat16
    compute dtype runs every layer's matmuls emulated (float16 would need loss scaling).

    >>> qlora_compute_dtype("bfloat16", "cuda:0"), qlora_compute_dtype("float32", "cpu")
    (torch.bfloat16, torch.float32)
    """
    from grpo_train.models.loading import auto_dtype

    chosen = auto_dtype(device) if dtype == "float32" else dtype
    resolved = getattr(torch, chosen)
    assert isinstance(resolved, torch.dtype)
    return resolved


def load_quantized_base(
    name_or_path: str,
    compute_dtype: torch.dtype = torch.bfloat16,
    device_index: int = 0,
    attn_implementation: str = "auto",
) -> PreTrainedModel:
    """Load a causal LM with 4-bit NF4 weights on GPU ``device_index`` (one per rank), for QLoRA."""
    from transformers import AutoModelForCausalLM

    from grpo_train.models.loading import attention_keywords

    config = qlora_quantization_config(compute_dtype)
    return AutoModelForCausalLM.from_pretrained(
        name_or_path,
        quantization_config=config,
        dtype=compute_dtype,
        device_map={"": device_index},
        **attention_keywords(attn_implementation),
    )


# ------------------------------------------------------------------------------------- adapters


def apply_lora(model: PreTrainedModel, settings: LoraSettings) -> PeftModel:
    """Wrap ``model`` with fresh LoRA adapters; only the adapter matrices stay trainable.

    With ``settings.use_qlora`` the model must have been loaded by ``load_quantized_base``;
    peft's ``prepare_model_for_kbit_training`` then casts the remaining non-quantized
    parameters (norms) to float32 for stable training. Gradient checkpointing is left to
    ``grpo_train.learner.memory.enable_gradient_checkpointing``.
    """
    from peft import LoraConfig, get_peft_model

    model = _prepare_base(model, settings)
    targets = (
        settings.target_modules
        if isinstance(settings.target_modules, str)
        else list(settings.target_modules)
    )
    config = LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as err:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(
            f"LoRA target_modules={settings.target_modules!r} do not fit this model: {err}"
        ) from err


def _prepare_base(model: PreTrainedModel, settings: LoraSettings) -> PreTrainedModel:
    """Check a QLoRA base is 4-bit and let peft cast its non-quantized parameters to float32."""
    if not settings.use_qlora:
        return model
    from peft import prepare_model_for_kbit_training

    require_qlora()
    if not is_quantized(model):
        raise ValueError(
            "use_qlora needs the base model loaded in 4-bit: "
            "grpo_train.learner.lora.load_quantized_base(path)"
        )
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def load_lora_policy(
    model: str,
    settings: LoraSettings,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    adapter_dir: str | Path | None = None,
    attn_implementation: str = "auto",
) -> tuple[PeftModel, PreTrainedTokenizerBase]:
    """Load the base policy and put LoRA on it: fresh adapters, or a saved adapter to resume.

    ``model`` is what ``--model`` takes (``models.resolve_model``); ``adapter_dir`` a folder
    written by ``save_adapter`` (a LoRA run's checkpoint ``model/`` folder, since a
    ``PeftModel``'s ``save_pretrained`` writes only the adapter). With ``use_qlora`` the base is
    loaded in 4-bit on the GPU of ``device`` (``"cuda:N"``) computing in ``qlora_compute_dtype``.
    ``attn_implementation`` is the base model's (``models.load_policy``).
    """
    from grpo_train.models.loading import load_policy, resolve_model

    tokenizer: PreTrainedTokenizerBase
    if settings.use_qlora:
        require_qlora()
        compute = qlora_compute_dtype(dtype, device)
        index = torch.device(device).index or 0
        path = resolve_model(model)
        base = load_quantized_base(path, compute, index, attn_implementation)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"  # as load_policy: batched generation needs it
    else:
        base, tokenizer = load_policy(model, dtype, device, attn_implementation)
    if adapter_dir is None:
        return apply_lora(base, settings), tokenizer
    return load_adapter(_prepare_base(base, settings), adapter_dir, is_trainable=True), tokenizer


def unwrap_peft(model: torch.nn.Module) -> PeftModel:
    """Find the ``PeftModel`` inside ``model``, through DDP / accelerate / FSDP1 wrappers."""
    from peft import PeftModel

    seen = model
    for _ in range(8):  # wrappers nest a few levels at most (DDP(FSDP(...)), compiled modules)
        if isinstance(seen, PeftModel):
            return seen
        inner = getattr(seen, "module", None) or getattr(seen, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            break
        seen = inner
    raise TypeError(
        f"expected a peft model (grpo_train.learner.lora.apply_lora), got {type(model).__name__}"
    )


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (tied weights counted once)."""
    params = list(model.parameters())  # parameters() already drops duplicates of tied weights
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


@contextlib.contextmanager
def reference_policy(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run ``model`` as the KL reference: the base weights, adapter switched off, no gradients.

    ``model`` may be wrapped (DDP, FSDP): the adapter is disabled on the ``PeftModel`` inside and
    the forward still goes through the wrapper, so sharded parameters are gathered as usual.
    The reference is then the initial policy exactly, as long as the base weights are frozen
    (true for LoRA). Yields ``model``.
    """
    peft_model = unwrap_peft(model)
    with torch.no_grad(), peft_model.disable_adapter():
        yield model


def reference_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float = 1.0,
    head: HeadChoice | None = None,
) -> torch.Tensor:
    """Per-token log-probabilities (B, C) of a micro-batch under the reference (adapter off)."""
    from grpo_train.learner.forward import token_logprobs
    from grpo_train.learner.logprobs import HeadChoice

    with reference_policy(model) as ref:
        return token_logprobs(ref, mb, temperature, head=head or HeadChoice())[0]


def save_adapter(
    model: torch.nn.Module,
    directory: str | Path,
    *,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    is_main_process: bool = True,
) -> Path:
    """Write an adapter-only checkpoint (``adapter_config.json`` + ``adapter_model.safetensors``).

    Under FSDP / ZeRO-3 pass the gathered full ``state_dict`` (``weight_export.full_state_dict``);
    peft keeps only the adapter's tensors from it. Only the main process writes.
    """
    out = Path(directory)
    peft_model = unwrap_peft(model)
    kwargs: dict[str, Any] = {} if state_dict is None else {"state_dict": dict(state_dict)}
    from grpo_train.models.loading import no_progress_bars

    with no_progress_bars():
        peft_model.save_pretrained(str(out), is_main_process=is_main_process, **kwargs)
    return out


def load_adapter(
    base_model: PreTrainedModel, directory: str | Path, *, is_trainable: bool = True
) -> PeftModel:
    """Put a saved adapter back on a freshly loaded base model (to resume or to evaluate)."""
    from peft import PeftModel

    path = Path(directory)
    if not (path / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{path} holds no adapter_config.json; not a saved LoRA adapter")
    return PeftModel.from_pretrained(base_model, str(path), is_trainable=is_trainable)


# ------------------------------------------------------------------------------- merged weights


def save_merged(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    directory: str | Path,
    *,
    dtype: torch.dtype | None = None,
    is_main_process: bool = True,
) -> Path:
    """Write the merged policy as a plain Hugging Face folder (config, safetensors, tokenizer).

    The folder loads with ``AutoModelForCausalLM.from_pretrained`` and in vLLM with no peft
    involved. The trainer's model is not modified (no ``merge_and_unload``). Sharded safetensors
    files are written by ``huggingface_hub.save_torch_state_dict`` (5 GB shards, as transformers).
    Under FSDP / ZeRO-3 it is collective: call it on every rank.
    """
    from huggingface_hub import save_torch_state_dict

    out = Path(directory)
    # Under FSDP / ZeRO-3 this gathers the shards onto rank 0's CPU (collective).
    state = export_state_dict(model, dtype=dtype, rank0_only=True)
    if not is_main_process:
        return out
    out.mkdir(parents=True, exist_ok=True)
    base: Any = unwrap_peft(model).get_base_model()
    config = copy.deepcopy(base.config)
    # The merged tensors are plain floats even when the trainer's base was 4-bit.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    if dtype is not None:
        config.dtype = dtype
    config.save_pretrained(out)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(out)
    save_torch_state_dict({k: _own_storage(v) for k, v in state.items()}, out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def _own_storage(tensor: torch.Tensor) -> torch.Tensor:
    """Return a contiguous tensor that covers its whole storage, as safetensors requires.

    Full tensors gathered from FSDP shards can be views into a larger buffer, which
    ``huggingface_hub`` refuses to save ("None is covering the entire storage").
    """
    tensor = tensor.contiguous()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone()
    return tensor


# ------------------------------------------------------------------- evaluating a LoRA checkpoint


def adapter_base_model(adapter_dir: str | Path) -> str:
    """Return the base model an adapter was trained on (its ``base_model_name_or_path``)."""
    path = Path(adapter_dir) / "adapter_config.json"
    try:
        base = json.loads(path.read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError) as err:
        raise FileNotFoundError(f"cannot read {path}: {err}") from err
    if not isinstance(base, str) or not base:
        raise FileNotFoundError(
            f"{path} names no base_model_name_or_path: cannot tell which model the adapter is for"
        )
    return base


def merged_checkpoint(adapter_dir: str | Path, cache: str | Path) -> Path:
    """Return a plain HF folder of base + adapter, merged once and cached under ``cache``.

    The base is the one the adapter's config names (a hub id or a local folder). vLLM and
    ``grpo eval`` then load it like any full checkpoint. The cache key is the adapter file's
    path, size and modification time, so a re-saved adapter is merged again.
    """
    import hashlib

    from grpo_train.models.loading import load_policy, resolve_model

    adapter = Path(adapter_dir).expanduser().resolve()
    weights = sorted(adapter.glob("adapter_model.*"))
    if not weights:
        raise FileNotFoundError(f"{adapter} holds adapter_config.json but no adapter_model.*")
    stat = weights[0].stat()
    key = hashlib.sha256(f"{adapter}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    out = Path(cache) / f"{adapter.parent.name}-{adapter.name}-{key[:12]}"
    if (out / "config.json").is_file():
        return out
    base_path = resolve_model(adapter_base_model(adapter))
    base, tokenizer = load_policy(base_path, "float32", "cpu")
    from transformers import AutoTokenizer

    if (adapter / "tokenizer_config.json").is_file():  # the run's tokenizer (its template)
        tokenizer = AutoTokenizer.from_pretrained(str(adapter))
    model = load_adapter(base, adapter, is_trainable=False)
    tmp = out.with_name(out.name + ".tmp")
    save_merged(model, tokenizer, tmp)
    tmp.replace(out)
    return out
