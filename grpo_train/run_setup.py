"""Building a training run: configuration choices, the run folder, resume checks, optimizer.

The ``Trainer`` (``trainer.py``) calls these while it starts; each is a plain function of the
configuration (and of the checkpoint being resumed), so each is tested and read on its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from grpo_envs.base import Environment, easier_versions
from grpo_train.checkpoint import (
    MANIFEST_FILE,
    MODEL_DIR,
    STATE_FILE,
    CheckpointError,
    Manifest,
    RunIdentity,
    latest_checkpoint,
    model_identity,
    offer_previous,
    resume_differences,
    verify_files,
)
from grpo_train.config import RESUME_FIXED, ConfigError, DataConfig, TrainConfig
from grpo_train.lora import LoraSettings

if TYPE_CHECKING:
    from transformers import PreTrainedModel
from grpo_train.run_log import logger

_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def lora_settings(cfg: TrainConfig) -> LoraSettings | None:
    """Return the run's LoRA settings, or None for full fine-tuning (``lora_r = 0``)."""
    p = cfg.policy
    if p.lora_r == 0:
        return None
    names = [m.strip() for m in p.target_modules.split(",") if m.strip()]
    targets: str | tuple[str, ...] = "all-linear" if names == ["all-linear"] else tuple(names)
    return LoraSettings(p.lora_r, p.lora_alpha, p.lora_dropout, targets, p.use_qlora)


def resolve_auto(cfg: TrainConfig) -> TrainConfig:
    """Replace ``dtype: auto`` by bfloat16 on a GPU that supports it, else float32."""
    if cfg.policy.dtype != "auto":
        return cfg
    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    policy = replace(cfg.policy, dtype="bfloat16" if bf16 else "float32")
    return replace(cfg, policy=policy)


def run_identity(cfg: TrainConfig, base_model: str) -> RunIdentity:
    """Return what this configuration trains, as a checkpoint manifest records it."""
    p = cfg.policy
    lora = (
        None
        if p.lora_r == 0
        else {
            "r": p.lora_r,
            "alpha": p.lora_alpha,
            "dropout": p.lora_dropout,
            "target_modules": p.target_modules,
            "qlora": p.use_qlora,
        }
    )
    flat = {k: v for section in cfg.to_dict().values() for k, v in section.items()}
    plain = json.loads(json.dumps(flat, default=str))  # the form a manifest reads back
    return RunIdentity(model_identity(base_model, p.dtype, lora), plain["env"], plain)


def checkpoint_arg(name: str, value: str) -> Path:
    """Resolve ``--resume PATH`` / ``--init_from PATH``: a checkpoint, its model/, or a run."""
    path = Path(value).expanduser()
    if path.name == MODEL_DIR and (path.parent / STATE_FILE).exists():
        path = path.parent
    if (path / STATE_FILE).exists() or (path / MANIFEST_FILE).exists():
        return path
    if (path / "checkpoints").is_dir():
        found = latest_checkpoint(path)
        if found is not None:
            return found
        raise ConfigError(f"{name}: run folder {path} has no complete checkpoint yet")
    what = "does not exist" if not path.exists() else f"is not a checkpoint (no {STATE_FILE})"
    raise ConfigError(
        f"{name}: {path} {what}; give a checkpoint folder such as "
        "runs/NAME/checkpoints/step-000010, or a run folder"
        + (" (--resume alone continues output_dir's last checkpoint)" if name == "resume" else "")
    )


def check_output_dir(run_dir: Path) -> None:
    """Fail at start, naming the path, when the run folder cannot be created and written.

    Tried for real (a probe file), since permission bits say nothing for root or a read-only
    mount.
    """
    blocker = next((p for p in (run_dir, *run_dir.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(
            f"output_dir: {blocker} is a file, so {run_dir} cannot be a run folder; give "
            "another path (the folder is created)"
        )
    probe = run_dir / f".write-test-{os.getpid()}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise ConfigError(
            f"output_dir: cannot write in {run_dir} ({reason}); choose a writable folder"
        ) from None


def make_envs(cfg: TrainConfig) -> list[Environment]:
    """``grpo_envs.make`` each configured environment; a failure names the entry and the fix."""
    return [make_env(entry.id, entry.kwargs) for entry in cfg.data.env]


def make_env(env_id: str, kwargs: Mapping[str, object]) -> Environment:
    """``grpo_envs.make(env_id, **kwargs)``; a failure becomes a ``ConfigError`` with the fix."""
    import grpo_envs

    module = env_id.split(":", 1)[0] if ":" in env_id else None
    try:
        return grpo_envs.make(env_id, **kwargs)
    except ModuleNotFoundError as err:
        raise ConfigError(
            f"env: {env_id}: cannot import module {err.name or module!r}; put it on "
            "PYTHONPATH (or pip install it), or check the spelling of MODULE:ID"
        ) from None
    except TypeError as err:
        raise ConfigError(
            f"env: {env_id} does not accept kwargs {dict(kwargs)} ({err}); "
            "`grpo envs show ID` lists its arguments"
        ) from None
    except (KeyError, ValueError, ImportError, AttributeError) as err:
        text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
        raise ConfigError(f"env: {env_id}: {text}") from None


def curriculum_stages(
    cfg: TrainConfig, envs: Sequence[Environment]
) -> tuple[list[list[Environment]], list[int]]:
    """Each environment's curriculum stages (easiest first, itself last) and its starting stage.

    Stages are the env entry's ``stages`` (built with ``make``), else the easier versions the
    environment offers (``grpo_envs.easier_versions``). With ``curriculum: on``, or stages given
    by the user, training starts at the easiest; with ``auto`` an environment's own easier
    versions wait at the last stage until the learning-signal guard calls for them.
    """
    mode = cfg.data.curriculum
    entries = list(cfg.data.env) if len(cfg.data.env) == len(envs) else [None] * len(envs)
    stages, starts = [], []
    for env, entry in zip(envs, entries):
        easier: list[Environment] = []
        if mode != "off" and entry is not None and entry.stages:
            easier = [make_env(entry.id, {**entry.kwargs, **stage}) for stage in entry.stages]
            start_easy = True
        elif mode != "off":
            easier, start_easy = easier_versions(env), mode == "on"
        else:
            start_easy = False
        stages.append([*easier, env])
        starts.append(0 if start_easy else len(easier))
    return stages, starts


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW on the trainable parameters and the learning-rate schedule, per update."""
    from transformers import get_scheduler

    o = cfg.optim
    # The fused kernel (one pass over all parameters, CPU and CUDA since torch 2.4) instead
    # of a per-tensor loop: same update, about a tenth of the optimizer time on CPU.
    trainable = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.dtype in _FUSED_DTYPES for p in trainable)
    optimizer = torch.optim.AdamW(
        trainable,
        lr=o.learning_rate,
        betas=(o.adam_beta1, o.adam_beta2),
        weight_decay=o.weight_decay,
        fused=fused or None,
    )
    schedule = "constant_with_warmup" if o.lr_scheduler == "constant" else o.lr_scheduler
    total_updates = max(1, cfg.run.max_steps * cfg.algorithm.mu)
    # The scheduler is not handed to accelerate: its wrapper steps once per process per
    # update (it assumes the batch grows with the world), which would shift the schedule.
    return optimizer, get_scheduler(schedule, optimizer, o.warmup_steps, total_updates)


def resume_path(cfg: TrainConfig, run_dir: Path) -> Path | None:
    """Return the checkpoint to resume (integrity checked), or None for a fresh start."""
    resume = cfg.run.resume
    if not resume:
        return None
    if resume == "latest":
        path = latest_checkpoint(run_dir)
        if path is None:
            logger.warning("resume=latest: no checkpoint in %s; starting from scratch", run_dir)
            return None
    else:
        path = checkpoint_arg("resume", resume)
    verify_files(path)
    return path


def init_path(cfg: TrainConfig) -> Path | None:
    """Return the checkpoint ``init_from`` names (integrity checked), or None."""
    if not cfg.run.init_from:
        return None
    path = checkpoint_arg("init_from", cfg.run.init_from)
    verify_files(path)
    return path


def check_resume(path: Path, saved: Manifest | None, identity: RunIdentity) -> None:
    """Refuse a checkpoint saved with another model, environments or fixed settings."""
    if saved is None:
        logger.warning(
            "%s has no %s (written by an older grpo-kit): the model and settings are not "
            "checked against this configuration",
            path,
            MANIFEST_FILE,
        )
        return
    diffs = resume_differences(saved.identity, identity, RESUME_FIXED)
    if diffs:
        raise CheckpointError(
            f"cannot resume {path}: it was saved with other settings: "
            + "; ".join(diffs)
            + f". To continue that run, resume it with its own settings (grpo train --config "
            f"{path / 'config.yaml'} --resume {path}; only "
            "learning_rate, max_steps and the run/logging fields may change). To train with "
            f"the new settings from its weights, start a new run: --init_from {path} "
            "(step 0, fresh optimizer) with another output_dir"
        )


def apply_schedule_changes(
    saved: Manifest | None,
    cfg: TrainConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    start_step: int,
    is_main: bool,
) -> None:
    """Apply a learning_rate / max_steps changed on resume, and say what it does to the lr.

    The restored scheduler would keep the saved peak rate (its ``base_lrs``), and with a new
    ``max_steps`` a decaying schedule is recomputed over the new length from the resumed step
    on; both are stated in the log so a jump in the lr curve is never a surprise.
    """
    if saved is None:
        return
    old = saved.identity.config
    lr, steps = cfg.optim.learning_rate, cfg.run.max_steps
    old_lr, old_steps = old.get("learning_rate", lr), old.get("max_steps", steps)
    if old_lr == lr and old_steps == steps:
        return
    sched = scheduler
    before = sched.get_last_lr()[0]
    sched.base_lrs = [lr for _ in sched.base_lrs]
    for group, base, fn in zip(
        optimizer.param_groups,
        sched.base_lrs,
        sched.lr_lambdas,  # type: ignore[attr-defined]
    ):
        group["initial_lr"] = base
        group["lr"] = base * fn(sched.last_epoch)
    sched._last_lr = [g["lr"] for g in optimizer.param_groups]  # type: ignore[attr-defined]
    changes = []
    if old_lr != lr:
        changes.append(f"learning_rate {old_lr} -> {lr} (the schedule's peak)")
    if old_steps != steps:
        changes.append(
            f"max_steps {old_steps} -> {steps} (the {cfg.optim.lr_scheduler} schedule now "
            f"spans {steps} steps)"
        )
    if is_main:
        logger.warning(
            "changed on resume: %s; lr for step %d: %.3g (the saved schedule had %.3g)",
            ", ".join(changes),
            start_step + 1,
            sched.get_last_lr()[0],
            before,
        )


def check_splits(envs: Sequence[Environment], names: Sequence[str], data: DataConfig) -> None:
    """Fail early, with the fix, when an environment lacks the train or eval split."""
    wanted = [data.train_split] + ([data.eval_split] if data.eval_size else [])
    for env, name in zip(envs, names):
        if missing := [s for s in wanted if s not in env.splits]:
            raise ValueError(
                f"{name} has no split {missing} (it has {list(env.splits)}); set train_split / "
                "eval_split to one of them, or eval_size=0 to skip evaluation"
            )


def load_run_policy(
    cfg: TrainConfig,
    lora: LoraSettings | None,
    device: str,
    base_model: str,
    resume_from: Path | None,
    init_from: Path | None,
) -> tuple[PreTrainedModel, Any, str, str]:
    """Load the policy and tokenizer; return them, the engine's start path and the base model.

    From the resumed checkpoint, ``init_from``'s weights, or the base model; with LoRA the base
    plus an adapter. A checkpoint that cannot be loaded is named, with an older one to use.
    """
    from grpo_train.models import ModelNotAvailableError, load_policy

    saved = str(resume_from / MODEL_DIR) if resume_from else None
    base_model, adapter = _start_weights(lora, base_model, saved, init_from)
    try:
        if lora is not None:
            from grpo_train.lora import load_lora_policy

            # A LoRA checkpoint's model/ folder holds only the adapter: load the base, then it.
            peft_model, tokenizer = load_lora_policy(
                base_model, lora, dtype=cfg.policy.dtype, device=device, adapter_dir=adapter
            )
            # A PeftModel forwards generate / save_pretrained / forward like the model it wraps.
            model = cast("PreTrainedModel", peft_model)
            model_path = base_model  # what a vLLM engine starts from; merged weights follow
        else:
            model_path = saved or base_model
            model, tokenizer = load_policy(model_path, cfg.policy.dtype, device)
    except Exception as err:  # SafetensorError, OSError, ...: a damaged or foreign folder
        # A checkpoint without a manifest (older grpo-kit) is only checked by loading it.
        folder = resume_from or init_from
        if folder is None or isinstance(err, ModelNotAvailableError):
            raise
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
        raise CheckpointError(
            f"checkpoint {folder} is damaged: its {MODEL_DIR}/ weights cannot be loaded "
            f"({type(err).__name__}: {first}). {offer_previous(folder)}"
        ) from None
    return model, tokenizer, model_path, base_model


def _start_weights(
    lora: LoraSettings | None, base_model: str, saved: str | None, init_from: Path | None
) -> tuple[str, str | None]:
    """Return the base model and adapter folder a run starts from (``init_from`` changes them)."""
    adapter = saved
    if init_from is None:
        return base_model, adapter
    # A new run from a checkpoint's weights (fresh optimizer).
    is_adapter = (init_from / MODEL_DIR / "adapter_config.json").is_file()
    if is_adapter and lora is None:
        raise ConfigError(
            f"init_from: {init_from} holds a LoRA adapter, and this run trains every "
            "weight; set the same lora_r / lora_alpha / target_modules, or start from "
            "a merged folder (save_merged) with --model"
        )
    if is_adapter:
        adapter = str(init_from / MODEL_DIR)
    else:
        base_model = str(init_from / MODEL_DIR)  # these weights are the new start
    logger.info("starting a new run from the weights of %s", init_from)
    return base_model, adapter
