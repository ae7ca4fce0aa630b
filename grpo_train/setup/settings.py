"""Each component's settings, built once from the run's ``TrainConfig``.

The configuration stops here: the collector, the prompt draw, the automatic choices, the update,
the log-prob head, LoRA, the run folder and log, the training-time suites and the out-of-memory
advice each take a small frozen settings dataclass of their own (defined in their module), and
these functions are the one place that reads it from the whole configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from grpo_train.algorithm.objective import ObjectiveSettings
from grpo_train.collect.collector import CollectorSettings
from grpo_train.collect.learning_signal import AutoSettings
from grpo_train.collect.training_prompts import PromptSettings
from grpo_train.config import (
    DataConfig,
    TrainConfig,
    algorithm_notes,
)
from grpo_train.episodes.prompts import PromptFormat
from grpo_train.learner.logprobs import HeadChoice
from grpo_train.learner.lora import LoraSettings
from grpo_train.learner.update import UpdateSettings
from grpo_train.run.memory_advice import MemorySettings
from grpo_train.run.run_dir import RunFolder
from grpo_train.run.run_log import RunLogSettings, StartNotes, WandbSettings

if TYPE_CHECKING:
    from grpo_train.eval.training_suites import SuiteSettings
    from sandbox.remote import RemoteSettings


def update_settings(cfg: TrainConfig) -> UpdateSettings:
    """Return what ``grpo_update`` reads of a run's configuration, as plain values."""
    a = cfg.algorithm
    objective = ObjectiveSettings(
        beta=a.beta,
        epsilon_low=a.epsilon_low,
        epsilon_high=a.epsilon_high,
        loss_type=a.loss_type,
        importance_sampling_level=a.importance_sampling_level,
        max_completion_length=cfg.rollout.max_completion_length,
    )
    return UpdateSettings(
        objective=objective,
        mu=a.mu,
        temperature=cfg.rollout.temperature,
        micro_batch_tokens=cfg.optim.micro_batch_tokens,
        mask_truncated=a.mask_truncated,
        is_correction=a.is_correction,
        is_cap=a.is_cap,
    )


def sandbox_settings(cfg: TrainConfig) -> RemoteSettings | None:
    """Return the remote sandbox services the run scores code on (``None``: the local sandbox)."""
    from grpo_envs.code.backend import remote_settings

    s = cfg.sandbox
    return remote_settings(
        s.sandbox_backend,
        s.sandbox_urls,
        protocol=s.sandbox_protocol,
        token_env=s.sandbox_token_env,
        max_in_flight=s.sandbox_max_in_flight,
        retries=s.sandbox_retries,
        request_timeout_s=s.sandbox_request_timeout_s or None,
    )


def head_choice(cfg: TrainConfig) -> HeadChoice:
    """Return the log-prob head a run chooses (``optim.logprob_head``)."""
    return HeadChoice(cfg.optim.logprob_head, cfg.optim.fused_head_above_mib)


def lora_settings(cfg: TrainConfig) -> LoraSettings | None:
    """Return the run's LoRA settings, or None for full fine-tuning (``lora_r = 0``)."""
    p = cfg.policy
    if p.lora_r == 0:
        return None
    names = [m.strip() for m in p.target_modules.split(",") if m.strip()]
    targets: str | tuple[str, ...] = "all-linear" if names == ["all-linear"] else tuple(names)
    return LoraSettings(p.lora_r, p.lora_alpha, p.lora_dropout, targets, p.use_qlora)


def prompt_format_for(data: DataConfig) -> PromptFormat:
    """Return the prompt format a run's data settings ask for (training and ``grpo eval``)."""
    return PromptFormat(
        chat_template=data.chat_template,
        chat_template_kwargs=dict(data.chat_template_kwargs),
        system_prompt=data.system_prompt,
        prompt_template=data.prompt_template,
    )


def prompt_settings(data: DataConfig) -> PromptSettings:
    """Return what the prompt draw (``TrainingPrompts``) reads: split, curriculum, filter."""
    return PromptSettings(
        train_split=data.train_split,
        curriculum_threshold=data.curriculum_threshold,
        curriculum_window=data.curriculum_window,
        online_filtering=data.online_filtering,
        filter_retry_after=data.filter_retry_after,
    )


def auto_settings(cfg: TrainConfig) -> AutoSettings:
    """Return what ``curriculum=auto`` and ``dynamic_sampling=auto`` read (``AutoHeuristics``)."""
    return AutoSettings(
        dynamic_sampling=cfg.algorithm.dynamic_sampling,
        curriculum=cfg.data.curriculum,
        advantage_estimator=cfg.algorithm.advantage_estimator,
        temperature=cfg.rollout.temperature,
        num_generations=cfg.rollout.num_generations,
        curriculum_threshold=cfg.data.curriculum_threshold,
    )


def collector_settings(cfg: TrainConfig) -> CollectorSettings:
    """Return what a step's collection (``Collector``) reads: sampling, budgets, seeds, guards."""
    r = cfg.rollout
    return CollectorSettings(
        prompts_per_step=r.prompts_per_step,
        num_generations=r.num_generations,
        max_prompt_length=cfg.data.max_prompt_length,
        max_completion_length=r.max_completion_length,
        max_turn_tokens=r.max_turn_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        seed=cfg.run.seed,
        seed_per_prompt=r.seed_per_prompt,
        tensor_parallel=r.tensor_parallel,
        history_policy=r.history_policy,
        fatal_template_breaks=r.template_breaks == "error",
        dynamic_sampling_rounds=cfg.algorithm.dynamic_sampling_rounds,
        curriculum_threshold=cfg.data.curriculum_threshold,
        max_reward_errors=cfg.run.max_reward_errors,
        overlap_scoring=r.overlap_scoring,
    )


def suite_settings(cfg: TrainConfig) -> SuiteSettings:
    """Return what the benchmark suites evaluated during training read (``eval_suites``)."""
    from grpo_train.eval.training_suites import SuiteSettings

    return SuiteSettings(
        suites=cfg.data.eval_suites,
        size=cfg.data.eval_size,
        samples=cfg.data.eval_suite_samples,
        max_prompt_length=cfg.data.max_prompt_length,
        max_completion_length=cfg.rollout.max_completion_length,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
    )


def run_folder(cfg: TrainConfig) -> RunFolder:
    """Return what the run-folder checks read: the folder, resume / overwrite, the settings."""
    return RunFolder(
        path=Path(cfg.run.output_dir),
        resuming=bool(cfg.run.resume),
        overwrite=cfg.run.overwrite,
        sections=cfg.to_dict(),
    )


def run_log_settings(cfg: TrainConfig) -> RunLogSettings:
    """Return where the run's log writes beside its files: the progress bar, W&B."""
    r = cfg.run
    wandb = None
    if r.wandb:
        wandb = WandbSettings(
            project=r.wandb_project,
            entity=r.wandb_entity,
            run_name=r.wandb_run_name,
            tags=tuple(t.strip() for t in r.wandb_tags.split(",") if t.strip()),
            config=cfg.to_dict(),
        )
    return RunLogSettings(max_steps=r.max_steps, progress=r.progress, wandb=wandb)


def start_notes(cfg: TrainConfig) -> StartNotes:
    """Return what the run says about its algorithm settings when it starts.

    >>> start_notes(TrainConfig()).info[0][:13], start_notes(TrainConfig()).warnings
    ('beta=0, mu=1:', ())
    """
    info: tuple[str, ...] = ()
    if cfg.algorithm.beta == 0 and cfg.algorithm.mu == 1:  # TRL/verl users' FAQ
        info = (
            "beta=0, mu=1: the logged loss stays near 0 by design, the gradient does not "
            "(see 'Why is the loss 0?' in grpo_train/README.md); watch reward/mean",
        )
    return StartNotes(info=info, warnings=tuple(algorithm_notes(cfg)))


def memory_settings(cfg: TrainConfig) -> MemorySettings:
    """Return the settings that decide a run's GPU memory (``run.memory_advice``)."""
    from grpo_train.rollout import resolve_engine_name

    p, r = cfg.policy, cfg.rollout
    return MemorySettings(
        micro_batch_tokens=cfg.optim.micro_batch_tokens,
        gradient_checkpointing=p.gradient_checkpointing,
        lora_r=p.lora_r,
        dtype=p.dtype,
        max_completion_length=r.max_completion_length,
        colocated_vllm=resolve_engine_name(r.engine) == "vllm" and r.vllm_mode == "colocate",
        vllm_memory_fraction=r.vllm_memory_fraction,
        vllm_sleep_mode=r.vllm_sleep_mode,
        vllm_sync_bucket_mb=r.vllm_sync_bucket_mb,
        asynchronous=r.async_generation and r.max_staleness > 0,
        reference_copy=cfg.algorithm.beta > 0 and p.lora_r == 0,
        offload_reference=p.offload_reference,
    )
