"""Rollout engines: sample groups of completions with their logprobs, take new weights in place.

``make_engine("auto", path)`` gives the vLLM engine when vLLM is importable, else the HF one
(``setup.engines.build_engine`` builds the one a training run's configuration asks for).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from grpo_train.rollout.base import Completion, RolloutEngine, SamplingConfig
from grpo_train.rollout.vllm_engine import vllm_available

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

EngineName = Literal["vllm", "hf", "auto"]
ENGINE_NAMES: tuple[str, ...] = ("vllm", "hf", "auto")

__all__ = [
    "ENGINE_NAMES",
    "Completion",
    "EngineName",
    "RolloutEngine",
    "SamplingConfig",
    "cpu_has_native_bf16",
    "cuda_available",
    "make_engine",
    "resolve_engine_name",
    "vllm_available",
    "vllm_dtype_for",
]


def resolve_engine_name(name: str) -> Literal["vllm", "hf"]:
    """Return the engine ``name`` means: ``auto`` is vLLM when importable, else HF.

    >>> resolve_engine_name("hf")
    'hf'
    """
    if name not in ENGINE_NAMES:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_NAMES)}; got {name!r}")
    if name == "auto":
        return "vllm" if vllm_available() else "hf"
    return "vllm" if name == "vllm" else "hf"


def make_engine(
    name: EngineName | str,
    model_path: str | Path,
    *,
    model: torch.nn.Module | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dtype: str = "auto",
    device: str = "auto",
    seed: int = 0,
    max_model_len: int = 2048,
    **engine_kwargs: Any,
) -> RolloutEngine:
    """Build a rollout engine by name.

    Args:
        name: ``"vllm"``, ``"hf"`` or ``"auto"`` (vLLM when importable, else HF).
        model_path: the model folder or hub id the engine starts from.
        model: HF only: share this module (the trainer's policy) instead of loading a copy;
            ``sync_weights`` is then free. Needs ``tokenizer``.
        tokenizer: HF only: the tokenizer to decode with (loaded from ``model_path`` if None).
        dtype: weight dtype: ``"float32"``, ``"bfloat16"`` or ``"auto"`` (vLLM: the
            checkpoint's; HF: bfloat16 on GPU, float32 on CPU).
        device: HF only: where a loaded copy goes (``"auto"``: the GPU when there is one).
        seed: vLLM only: the engine's sampler seed.
        max_model_len: vLLM only: prompt + completion tokens the engine reserves for.
        engine_kwargs: passed to the engine class (``HFEngine`` or ``VLLMEngine``).
    """
    name = resolve_engine_name(name)
    if name == "hf":
        from grpo_train.rollout.hf import HFEngine

        return HFEngine(
            model if model is not None else model_path,  # type: ignore[arg-type]
            tokenizer,
            dtype=dtype,
            device=device,
            **engine_kwargs,
        )
    from grpo_train.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        model_path, dtype=dtype, seed=seed, max_model_len=max_model_len, **engine_kwargs
    )


def cuda_available() -> bool:
    """Whether torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX-BF16)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def vllm_dtype_for(setting: str, policy_dtype: str, *, on_cpu: bool, cpu_bf16: bool) -> str:
    """Return the vLLM engine's weight dtype for ``vllm_dtype: setting`` beside this policy.

    ``auto``: bfloat16 for a float32 policy on a CPU with bfloat16 instructions, where decoding
    is bound by the bytes of weights each step reads (SmolLM2-135M: 5.1 s of generation a step
    against 10.1 s in float32, and no fewer points per step over 6 paired seeds); otherwise the
    policy's dtype (a policy at ``dtype: auto`` trains in float32 on a CPU).

    >>> vllm_dtype_for("auto", "float32", on_cpu=True, cpu_bf16=True)
    'bfloat16'
    >>> vllm_dtype_for("auto", "auto", on_cpu=True, cpu_bf16=False)  # emulated bf16 is slow
    'float32'
    >>> vllm_dtype_for("auto", "float32", on_cpu=False, cpu_bf16=True)  # GPU: the policy's
    'float32'
    >>> vllm_dtype_for("float32", "float32", on_cpu=True, cpu_bf16=True)
    'float32'
    """
    if setting != "auto":
        return setting
    policy = "float32" if on_cpu and policy_dtype == "auto" else policy_dtype
    if on_cpu and cpu_bf16 and policy == "float32":
        return "bfloat16"
    return policy
