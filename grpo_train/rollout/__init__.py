"""Rollout engines: sample groups of completions with their logprobs, take new weights in place.

``make_engine("auto", path)`` gives the vLLM engine when vLLM is importable, else the HF one;
``build_engine`` builds the one a training run's configuration asks for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from grpo_train.rollout.base import Completion, RolloutEngine, SamplingConfig
from grpo_train.rollout.vllm_engine import vllm_available

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from grpo_train.config import TrainConfig

EngineName = Literal["vllm", "hf", "auto"]
ENGINE_NAMES: tuple[str, ...] = ("vllm", "hf", "auto")

__all__ = [
    "ENGINE_NAMES",
    "Completion",
    "EngineName",
    "RolloutEngine",
    "SamplingConfig",
    "build_engine",
    "build_server_engine",
    "make_engine",
    "resolve_engine_name",
    "vllm_available",
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


def _cuda_available() -> bool:
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


def build_engine(
    config: TrainConfig, model_path: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> RolloutEngine:
    """Build the configured rollout engine (``auto``: vLLM when importable, else HF generate).

    The HF engine shares the trainer's module, so its weight sync is free (a sharded module: a
    copy loaded from ``model_path``); vLLM loads ``model_path`` and receives new weights through
    ``sync_weights`` after each update.
    """
    name = resolve_engine_name(config.rollout.engine)
    dtype = config.policy.dtype
    if name == "hf" and config.rollout.tensor_parallel > 1:
        raise ValueError(
            f"vllm_tensor_parallel_size: {config.rollout.tensor_parallel} needs the vllm engine, "
            "and engine auto found no vLLM here; install it (pip install 'grpo-kit[vllm]') or "
            "set vllm_tensor_parallel_size to 1"
        )
    if name == "hf":
        from grpo_train.learner.weight_export import is_sharded
        from grpo_train.parallel.distributed import every_rank_loads_weights

        if not is_sharded(model):
            return make_engine("hf", model_path, model=model, tokenizer=tokenizer, dtype=dtype)
        # A sharded (FSDP / ZeRO-3) policy cannot generate on one rank alone: its forwards
        # all-gather across ranks, and ranks decode different lengths (and only rank 0
        # evaluates). The engine then keeps its own full copy, refreshed by the weight sync.
        with every_rank_loads_weights():
            return make_engine("hf", model_path, tokenizer=tokenizer, dtype=dtype)
    if config.rollout.vllm_mode == "server":
        return build_server_engine(config, model)
    from grpo_train.parallel.distributed import vllm_colocate_kwargs

    # Under `accelerate launch` each rank's engine joins the job (external_launcher) with its
    # own sampling seed; a single process gets just the seed. With tensor parallelism vLLM
    # groups consecutive ranks into one engine, whose ranks must share the seed.
    extra: dict[str, Any] = dict(
        vllm_colocate_kwargs(config.run.seed, config.rollout.tensor_parallel)
    )
    if config.rollout.vllm_sleep_mode:
        extra["enable_sleep_mode"] = True
    extra["in_process"] = config.rollout.vllm_in_process
    return make_engine(
        "vllm",
        model_path,
        dtype=vllm_dtype_for(
            config.rollout.vllm_dtype,
            dtype,
            on_cpu=not _cuda_available(),
            cpu_bf16=cpu_has_native_bf16(),
        ),
        max_model_len=config.data.max_prompt_length + config.rollout.max_completion_length,
        gpu_memory_utilization=config.rollout.vllm_memory_fraction,
        cpu_kv_cache_gib=config.rollout.vllm_cpu_kv_cache_gib,
        **extra,
    )


def build_server_engine(config: TrainConfig, model: PreTrainedModel) -> RolloutEngine:
    """Connect to the ``grpo serve`` replicas of ``vllm_mode: server`` and load the policy.

    The replicas started from a model path of their own (the base model, or an older run's
    weights): the first sync, here, makes them serve this trainer's weights before the first
    step, which is also what resume needs. Collective when the policy is sharded.
    """
    import torch.distributed as dist

    from grpo_train.learner.weight_export import sync_rollout_weights
    from grpo_train.rollout.server_address import parse_server_urls
    from grpo_train.rollout.server_engine import ServerEngine

    main = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    engine = ServerEngine(
        parse_server_urls(config.rollout.vllm_server_urls),
        timeout_s=config.rollout.vllm_server_timeout_s,
        sync_address=config.rollout.vllm_sync_address,
        sync_backend=config.rollout.vllm_sync_backend,
        is_main=main,
        sync_timeout_s=config.rollout.vllm_sync_timeout_s,
        bucket_mb=config.rollout.vllm_sync_bucket_mb,
    )
    sync_rollout_weights(engine, model)
    return engine
