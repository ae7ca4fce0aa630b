"""Rollout engines: sample groups of completions with their logprobs, take new weights in place.

``make_engine("auto", path)`` gives the vLLM engine when vLLM is importable, else the HF one.
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
    "make_engine",
    "vllm_available",
]


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
    if name not in ENGINE_NAMES:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_NAMES)}; got {name!r}")
    if name == "auto":
        name = "vllm" if vllm_available() else "hf"
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
