"""The rollout engine a run's ``TrainConfig`` asks for.

Colocated vLLM, hf, or ``grpo serve`` replicas: ``rollout.make_engine`` takes explicit
arguments; this module reads them from the configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_train import rollout
from grpo_train.config import (
    TrainConfig,
)
from grpo_train.learner import weight_export
from grpo_train.parallel import distributed
from grpo_train.rollout.base import RolloutEngine

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def build_engine(
    config: TrainConfig, model_path: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> RolloutEngine:
    """Build the configured rollout engine (``auto``: vLLM when importable, else HF generate).

    The HF engine shares the trainer's module, so its weight sync is free (a sharded module: a
    copy loaded from ``model_path``); vLLM loads ``model_path`` and receives new weights through
    ``sync_weights`` after each update.
    """
    name = rollout.resolve_engine_name(config.rollout.engine)
    dtype = config.policy.dtype
    if name == "hf" and config.rollout.tensor_parallel > 1:
        raise ValueError(
            f"vllm_tensor_parallel_size: {config.rollout.tensor_parallel} needs the vllm engine, "
            "and engine auto found no vLLM here; install it (pip install 'grpo-kit[vllm]') or "
            "set vllm_tensor_parallel_size to 1"
        )
    if name == "hf":
        rows = config.rollout.hf_max_batch_size
        if not weight_export.is_sharded(model):
            return rollout.make_engine(
                "hf", model_path, model=model, tokenizer=tokenizer, dtype=dtype, max_batch_size=rows
            )
        # A sharded (FSDP / ZeRO-3) policy cannot generate on one rank alone: its forwards
        # all-gather across ranks, and ranks decode different lengths (and only rank 0
        # evaluates). The engine then keeps its own full copy, refreshed by the weight sync.
        with distributed.every_rank_loads_weights():
            return rollout.make_engine(
                "hf", model_path, tokenizer=tokenizer, dtype=dtype, max_batch_size=rows
            )
    if config.rollout.vllm_mode == "server":
        return build_server_engine(config, model)
    # Under `accelerate launch` each rank's engine joins the job (external_launcher) with its
    # own sampling seed; a single process gets just the seed. With tensor parallelism vLLM
    # groups consecutive ranks into one engine, whose ranks must share the seed.
    extra: dict[str, Any] = dict(
        distributed.vllm_colocate_kwargs(config.run.seed, config.rollout.tensor_parallel)
    )
    if config.rollout.vllm_sleep_mode:
        extra["enable_sleep_mode"] = True
    extra["in_process"] = config.rollout.vllm_in_process
    # An engine whose workers run in processes of their own streams each sync in these buckets.
    extra["sync_bucket_mb"] = config.rollout.vllm_sync_bucket_mb
    extra["sync_timeout_s"] = config.rollout.vllm_sync_timeout_s
    return rollout.make_engine(
        "vllm",
        model_path,
        dtype=rollout.vllm_dtype_for(
            config.rollout.vllm_dtype,
            dtype,
            on_cpu=not rollout.cuda_available(),
            cpu_bf16=rollout.cpu_has_native_bf16(),
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
    weight_export.sync_rollout_weights(engine, model)
    return engine
