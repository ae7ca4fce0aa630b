"""Building a training run: ``setup_run`` returns a frozen ``RunSetup`` of what it built.

``Trainer(config)`` (``trainer.py``) calls ``setup_run`` once; read top to bottom, it follows the
configuration through the whole start of a run: resolved choices and the run folder, the process,
environments, resume checks, the policy and its optimizer, the training state, the prompt order,
the rollout engine and what the update calls. Every step it takes is a plain function of the
configuration (and of the checkpoint being resumed) defined below it, tested and read on its own.

It is also where the configuration stops: every component takes a small settings dataclass of
its own (``CollectorSettings``, ``PromptSettings``, ``RunLogSettings``...), built from the
``TrainConfig`` by ``setup.settings`` (``collector_settings``...), and the rollout engine by
``setup.engines.build_engine``.

Why over 500 lines: the whole start of a run is one file, so that following the configuration
through it leaves this package only for the run folder's naming and checks (``run/run_dir.py``,
which ``grpo train`` uses too).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import torch

from grpo_envs.base import Environment, easier_versions
from grpo_envs.code.backend import check_sandbox_backend, use_remote_sandbox
from grpo_train.algorithm.baselines import EmaBaselines
from grpo_train.collect.learning_signal import AutoHeuristics
from grpo_train.collect.training_prompts import TrainingPrompts
from grpo_train.config import (
    RESUME_FIXED,
    ConfigError,
    DataConfig,
    PolicyConfig,
    TrainConfig,
    with_output_dir,
)
from grpo_train.episodes.prompts import PromptFormat
from grpo_train.learner import memory, weight_export
from grpo_train.learner.forward import output_layer, token_logprobs
from grpo_train.learner.logprobs import DEFAULT_HEAD, HeadChoice
from grpo_train.learner.lora import LoraSettings, reference_logprobs
from grpo_train.learner.micro_batches import ForwardCost, MicroBatch
from grpo_train.learner.update import ClipAndStep, Learner, UpdateSettings
from grpo_train.models.loading import attention_problem, auto_dtype
from grpo_train.parallel import distributed
from grpo_train.parallel.distributed import RankInfo
from grpo_train.rollout.base import LostEngine, RolloutEngine
from grpo_train.run.checkpoint import (
    MANIFEST_FILE,
    MODEL_DIR,
    STATE_FILE,
    CheckpointError,
    Manifest,
    RunIdentity,
    SamplerState,
    latest_checkpoint,
    load_checkpoint,
    model_identity,
    new_launch_id,
    offer_previous,
    read_manifest,
    resume_differences,
    verify_files,
)
from grpo_train.run.console import CONSOLE
from grpo_train.run.run_dir import clear_run_dir, other_run_problem
from grpo_train.run.run_log import logger
from grpo_train.run.stop import StopRequest, pause_point
from grpo_train.setup.engines import build_engine
from grpo_train.setup.settings import (
    auto_settings,
    head_choice,
    lora_settings,
    prompt_format_for,
    prompt_settings,
    run_folder,
    sandbox_settings,
    update_settings,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel


_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class RunSetup:
    """Everything ``setup_run`` built for a run, before its first step; nothing here is replaced.

    What changes while the run trains (the rollout engine, when it dies; the EMA baselines; the
    data position inside ``prompts``; the heuristics' state inside ``auto``) is the trainer's to
    track: ``engine`` and ``baselines`` are their values at the start.
    """

    cfg: TrainConfig
    """The configuration as it runs: ``auto`` choices concrete, ``output_dir`` set."""
    run_dir: Path
    prompt_format: PromptFormat
    """One prompt format for training and evaluation (``grpo_train.episodes.prompts``)."""
    accelerator: Any
    """accelerate's ``Accelerator``: the device, the ranks, the DDP / FSDP / ZeRO wrappers."""
    distributed: bool
    """Launched on several processes (``accelerate launch``, ``torchrun``)."""
    rank: RankInfo
    device: str
    envs: tuple[Environment, ...]
    env_names: tuple[str, ...]
    launch: str
    """This launch's id, recorded in the checkpoints it writes."""
    identity: RunIdentity
    """What the run trains (model, environments, settings), as a checkpoint manifest records it."""
    resume_from: Path | None
    saved: Manifest | None
    """The resumed checkpoint's manifest (None: a fresh start, or a checkpoint without one)."""
    start_step: int
    lora: LoraSettings | None
    model: PreTrainedModel
    """The policy's unwrapped module: what engines, checkpoints and evaluation read."""
    wrapped_model: torch.nn.Module
    """What forward and backward go through: the DDP / FSDP wrapper of ``model``, or ``model``."""
    tokenizer: Any
    ref_model: PreTrainedModel | None
    """The KL reference's own copy (``beta > 0`` without LoRA), else None."""
    optimizer: torch.optim.Optimizer
    scheduler: Any
    baselines: EmaBaselines
    """``advantage_estimator=ema``: the running reward baselines at the start."""
    prompts: TrainingPrompts
    """What training draws: each environment's current curriculum stage, in a resumable order."""
    auto: AutoHeuristics
    """``curriculum=auto`` and ``dynamic_sampling=auto``: their state, decisions and record."""
    engine: RolloutEngine
    """The rollout engine at the start (a ``LostEngine`` when a stop came first)."""
    learner: Learner
    """``model`` as ``update.grpo_update`` runs it."""
    settings: UpdateSettings
    clip_and_step: ClipAndStep


def setup_run(
    config: TrainConfig,
    env: Environment | Sequence[Environment] | None,
    engine: RolloutEngine | None,
    stop: StopRequest,
) -> RunSetup:
    """Build a run from its configuration, in order; ``env`` / ``engine`` may be injected.

    Resolve the configuration and check the run folder (before anything loads), start the
    process (device, ranks), build the environments and choose their sandbox (local or remote
    services), find the checkpoint to resume and check it,
    load the policy, its KL reference and optimizer, restore the training state, order the
    prompts, start the engine, and put together what the update calls.
    """
    from grpo_train.models.loading import resolve_model

    cfg, run_dir, prompt_format = _checked_config(config)
    accelerator, is_distributed, rank, device = _start_process(cfg)
    envs = [env] if isinstance(env, Environment) else list(env or make_envs(cfg))
    env_names = [e.env_id or type(e).__name__ for e in envs]
    check_splits(envs, env_names, cfg.data)
    # Where the code environments run programs, for this process (before anything heavy loads,
    # so that a missing token or a task the chosen service cannot judge fails at once).
    use_remote_sandbox(sandbox_settings(cfg))
    check_sandbox_backend(envs, cfg.data.train_split)
    same = len(cfg.data.env) == len(envs)
    weights = [e.weight for e in cfg.data.env] if same else [1.0] * len(envs)
    launch = new_launch_id()
    resume_from = resume_path(cfg, run_dir)
    init_from = init_path(cfg)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    base_model = resolve_model(cfg.policy.model)
    lora = lora_settings(cfg)
    identity = run_identity(cfg, base_model)
    saved = read_manifest(resume_from) if resume_from else None
    if resume_from is not None:
        check_resume(resume_from, saved, identity)
    model, tokenizer, model_path, base_model = load_run_policy(
        cfg, lora, device, base_model, resume_from, init_from
    )
    # A template given by the run is also set on the tokenizer, so checkpoints carry it to
    # `grpo eval`.
    template = prompt_format.template_text()
    if template is not None:
        tokenizer.chat_template = template
    if cfg.policy.gradient_checkpointing:
        memory.enable_gradient_checkpointing(model)
    ref_model = _load_reference(cfg, lora, device, base_model)
    optimizer, scheduler = build_optimizer(cfg, model)
    wrapped: torch.nn.Module = model
    if is_distributed:  # DDP / FSDP / ZeRO wrappers; gradients reduced by them
        distributed.set_deepspeed_micro_batch_size(accelerator)  # no dataloader to infer it
        wrapped, optimizer = accelerator.prepare(model, optimizer)
    start_step, baselines, sampler, switches = _restore_training_state(
        cfg, resume_from, saved, optimizer, scheduler, accelerator if is_distributed else None
    )
    stage_envs, starts = curriculum_stages(cfg, envs)
    prompts = TrainingPrompts(
        stage_envs, starts, env_names, weights, prompt_settings(cfg.data), cfg.run.seed, sampler
    )
    auto = AutoHeuristics(auto_settings(cfg), prompts, sampler, start_step, switches)
    if engine is None:
        engine = _start_engine(cfg, model_path, model, tokenizer, stop, is_distributed)
    if lora is not None and resume_from and not isinstance(engine, LostEngine):
        weight_export.sync_rollout_weights(engine, wrapped)  # the resumed adapter
    learner = _learner(
        cfg, wrapped, ref_model, tokenizer, device, lora, accelerator, is_distributed
    )
    # Sharded models need accelerate's (collective) gradient norm.
    clip = accelerator.clip_grad_norm_ if is_distributed else torch.nn.utils.clip_grad_norm_
    clip_and_step = ClipAndStep(
        wrapped, optimizer, scheduler, cfg.optim.max_grad_norm, cfg.run.max_bad_steps, clip,
        lambda: latest_checkpoint(run_dir),
        engine=distributed.engine_stepping_in_backward(accelerator) if is_distributed else None,
    )  # fmt: skip
    return RunSetup(
        cfg=cfg, run_dir=run_dir, prompt_format=prompt_format, accelerator=accelerator,
        distributed=is_distributed, rank=rank, device=device, envs=tuple(envs),
        env_names=tuple(env_names), launch=launch, identity=identity, resume_from=resume_from,
        saved=saved, start_step=start_step, lora=lora, model=model, wrapped_model=wrapped,
        tokenizer=tokenizer, ref_model=ref_model, optimizer=optimizer, scheduler=scheduler,
        baselines=baselines, prompts=prompts, auto=auto, engine=engine, learner=learner,
        settings=update_settings(cfg), clip_and_step=clip_and_step,
    )  # fmt: skip


def _checked_config(config: TrainConfig) -> tuple[TrainConfig, Path, PromptFormat]:
    """Resolve ``auto`` choices (so the run's config.yaml says what ran) and check the run folder.

    Another run's folder, an unwritable one or a missing template file fails here, before
    anything loads.
    """
    cfg = with_output_dir(resolve_auto(config))
    if problem := other_run_problem(run_folder(cfg)):
        raise ConfigError(problem)
    check_logprob_head(cfg)
    prompt_format = prompt_format_for(cfg.data)
    prompt_format.template_text()
    run_dir = Path(cfg.run.output_dir)
    check_output_dir(run_dir)
    return cfg, run_dir, prompt_format


def check_logprob_head(cfg: TrainConfig) -> None:
    """Refuse ``logprob_head: liger`` where Liger-Kernel is not installed, before anything loads."""
    from grpo_train.learner import liger_loss

    if cfg.optim.logprob_head == "liger" and not liger_loss.liger_installed():
        raise ValueError(liger_loss.MISSING)


def _start_process(cfg: TrainConfig) -> tuple[Any, bool, RankInfo, str]:
    """Start accelerate; return it, whether launched on several ranks, this rank and the device.

    accelerate reads ``accelerate launch``'s settings (DDP / FSDP / DeepSpeed, the device); a plain
    ``python`` run is one process on cuda:0 or the CPU. The main rank clears the run folder (an
    ``overwrite`` run).
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, InitProcessGroupKwargs

    if problem := distributed.launch_problem():
        raise ConfigError(problem)
    # The process group's timeout bounds every collective: a hung or stopped rank fails the
    # others in that time.
    timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.run.collective_timeout_s))
    accelerator = Accelerator(kwargs_handlers=[timeout])
    is_distributed = accelerator.distributed_type != DistributedType.NO
    rank = distributed.rank_info()
    device = str(accelerator.device)
    where = torch.device(device).type
    if problem := attention_problem(cfg.policy.attn_implementation, where, dtype=cfg.policy.dtype):
        raise ConfigError(problem)  # before the run folder is cleared: nothing lost
    if problem := distributed.set_deepspeed_gradient_clipping(accelerator, cfg.optim.max_grad_norm):
        raise ConfigError(problem)
    if rank.is_main:
        clear_run_dir(run_folder(cfg))
    if cfg.policy.use_qlora and torch.device(device).type != "cuda":
        raise ConfigError(
            f"use_qlora: QLoRA loads the base in 4-bit with bitsandbytes, which needs a CUDA "
            f"GPU, and this run is on {device}; drop --use_qlora (plain LoRA: --lora_r 16)"
        )
    if cfg.policy.num_threads:
        torch.set_num_threads(cfg.policy.num_threads)
    return accelerator, is_distributed, rank, device


def _load_reference(
    cfg: TrainConfig, lora: LoraSettings | None, device: str, base_model: str
) -> PreTrainedModel | None:
    """Load the KL reference: the initial policy, only when used (beta > 0).

    With LoRA it is the same module with the adapter switched off: no second copy. Otherwise a
    copy in the policy's parameter dtype (``parameter_dtype``), run under the same autocast: a
    bfloat16 copy of a float32-master policy keeps its residual stream and norms in bfloat16,
    and the KL is not 0 before the first update (SmolLM2-135M, 264 tokens: mean |log-prob
    difference| 0.016, largest 0.21, k3 KL 5.5e-4 per token, where a run's KL starts at 0).
    ``offload_reference`` keeps the copy in host RAM.
    """
    from grpo_train.models.loading import load_policy

    if cfg.algorithm.beta <= 0 or lora is not None:
        return None
    ref_device = "cpu" if cfg.policy.offload_reference else device
    with distributed.every_rank_loads_weights():  # never prepared: needs real weights
        ref_model = load_policy(
            base_model, parameter_dtype(cfg.policy), ref_device, cfg.policy.attn_implementation
        )[0]
    ref_model.eval().requires_grad_(False)
    return ref_model


def _restore_training_state(
    cfg: TrainConfig,
    resume_from: Path | None,
    saved: Manifest | None,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    accelerator: Any,
) -> tuple[int, EmaBaselines, SamplerState | None, tuple[tuple[int, str], ...] | None]:
    """Restore optimizer, scheduler and data position from the resumed checkpoint.

    Return the start step, the EMA baselines, the sampler state (None: a fresh start) and the
    automatic switches of the earlier launches (None: none recorded). After
    ``accelerator.prepare``: FSDP / DeepSpeed restore into the sharded state.
    """
    if not resume_from:
        return 0, EmaBaselines(), None, None
    state = load_checkpoint(
        resume_from, optimizer=optimizer, scheduler=scheduler, accelerator=accelerator
    )
    is_main = distributed.rank_info().is_main
    if is_main:
        logger.info("resuming from %s (step %d)", resume_from, state.step, extra=CONSOLE)
    apply_schedule_changes(saved, cfg, optimizer, scheduler, state.step, is_main)
    return state.step, EmaBaselines.from_state(state.baselines), state.sampler, state.switches


def _start_engine(
    cfg: TrainConfig,
    model_path: str,
    model: PreTrainedModel,
    tokenizer: Any,
    stop: StopRequest,
    is_distributed: bool,
) -> RolloutEngine:
    """Build the rollout engine; a ``LostEngine`` when a stop request came first or killed it.

    A single process stopped while loading does not start an engine only to close it (under
    a launch every rank starts its engine: vLLM's start is collective there).
    """
    pause_point("engine start")
    if stop.signum is not None and not is_distributed:
        return LostEngine("the run was stopped before its rollout engine started")
    try:
        return build_engine(cfg, model_path, model, tokenizer)
    except Exception as err:
        if stop.signum is None:
            raise
        return LostEngine(f"the rollout engine stopped while starting ({type(err).__name__})")


def _learner(
    cfg: TrainConfig,
    wrapped: torch.nn.Module,
    ref_model: PreTrainedModel | None,
    tokenizer: Any,
    device: str,
    lora: LoraSettings | None,
    accelerator: Any,
    is_distributed: bool,
) -> Learner:
    """Return the policy as ``grpo_update`` runs it (module, pad id, autocast, KL reference)."""
    # The update runs each group's prompt once (forward.token_logprobs, share_prompts): not
    # under DDP/FSDP wrappers (two forwards per backward) or gradient checkpointing (no cache).
    share_prompts = (
        cfg.optim.share_prompt_forward
        and not is_distributed
        and not cfg.policy.gradient_checkpointing
        and cfg.optim.packing != "on"
    )
    # Padding-free micro-batches wherever the shared-prompt forward does not run (it needs
    # padded rows: one prompt's keys/values repeated under each of its completions); where it
    # runs, each step takes whichever of the two runs fewer token positions.
    packing: Literal["always", "never", "when_cheaper"] = "never"
    if cfg.optim.packing == "on" or (cfg.optim.packing == "auto" and not share_prompts):
        packing = "always"
    elif cfg.optim.packing == "auto":
        packing = "when_cheaper"
    reference = None
    if cfg.algorithm.beta > 0:
        reference = KLReference(
            wrapped, ref_model, device, cfg.rollout.temperature, lora is not None,
            cfg.policy.offload_reference, share_prompts, head_choice(cfg),
        )  # fmt: skip
    head = head_choice(cfg)
    layer = output_layer(wrapped) if head.path == "liger" else None
    if head.path == "liger" and type(layer) is not torch.nn.Linear:
        what = "sharded by FSDP" if layer is None else f"a {type(layer).__name__}"
        raise ValueError(
            "logprob_head: liger runs the output layer as one weight matrix; this model's is "
            f"{what} (LoRA on lm_head, a quantized or sharded head): use logprob_head: auto"
        )
    return Learner(
        model=wrapped,
        pad_id=tokenizer.pad_token_id,
        device=device,
        share_prompts=share_prompts,
        autocast=functools.partial(training_autocast, cfg.policy, device),
        reference=reference,
        reference_resident=contextlib.nullcontext if reference is None else reference.resident,
        accelerator=accelerator,
        head=head,
        packing=packing,
        forward_cost=ForwardCost.of(getattr(getattr(wrapped, "module", wrapped), "config", None)),
    )


def parameter_dtype(policy: PolicyConfig) -> str:
    """Return the dtype the policy's weights are loaded in: float32 when they are all trained.

    Full fine-tuning keeps float32 master weights and computes in ``dtype`` under autocast
    (``training_autocast``), as mixed-precision training does ("Mixed Precision Training",
    arXiv 1710.03740). AdamW updates its parameters in place, and bfloat16 keeps 8 bits of
    mantissa: at a learning rate of 1e-6 an update is far below a bfloat16 weight's spacing and
    rounds away (5 steps changed 0.8% of a bfloat16 layer's weights, 100% of a float32 one's).
    Float32 parameters with autocast need no second copy in the optimizer and no change to the
    update; FSDP2 and DeepSpeed keep float32 masters of their own and take float32 weights as
    well. With LoRA only the adapters train, and peft keeps them in float32: the frozen base
    stays in ``dtype``.

    >>> parameter_dtype(PolicyConfig(dtype="bfloat16"))
    'float32'
    >>> parameter_dtype(PolicyConfig(dtype="bfloat16", lora_r=8))
    'bfloat16'
    """
    if policy.lora_r == 0 and policy.dtype == "bfloat16":
        return "float32"
    return policy.dtype


def training_autocast(
    policy: PolicyConfig, device: str
) -> contextlib.AbstractContextManager[object]:
    """Return the training forward's autocast: bf16 for a bfloat16 run, else none.

    On CUDA for any bfloat16 run; on CPU for bfloat16 full fine-tuning (float32 master weights,
    ``parameter_dtype``) or with ``cpu_autocast_bf16``.
    """
    on_cpu = torch.device(device).type == "cpu"
    masters = parameter_dtype(policy) != policy.dtype
    if on_cpu and (policy.cpu_autocast_bf16 or masters):
        return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
    return memory.autocast(device, policy.dtype)


@dataclass(frozen=True)
class KLReference:
    """Per-token logprobs under the KL reference: the adapter switched off, or the copy."""

    model: torch.nn.Module
    """The trained (possibly wrapped) module; with LoRA, run with its adapter switched off."""
    copy: PreTrainedModel | None
    """The reference's own weights (no LoRA); on the CPU between uses with ``offload``."""
    device: str
    temperature: float
    lora: bool
    offload: bool
    share_prompts: bool
    head: HeadChoice = DEFAULT_HEAD

    def resident(self) -> contextlib.AbstractContextManager[object]:
        """Keep an offloaded copy on the device while open: one move per update, not per call.

        The update computes every micro-batch's reference logprobs inside one of these, before
        its passes (15 GB each way per micro-batch and pass, for a 7B model in bfloat16, moved
        only once); calls inside find the copy on the device already and move nothing.
        """
        if self.offload and self.copy is not None:
            return memory.on_device(self.copy, self.device)
        return contextlib.nullcontext()

    def __call__(self, mb: MicroBatch) -> torch.Tensor:
        """Return the reference's (B, T) per-token logprobs of micro-batch ``mb``."""
        if self.lora:
            return reference_logprobs(self.model, mb, self.temperature, self.head).float()
        assert self.copy is not None  # loaded whenever beta > 0 without LoRA
        with torch.no_grad():
            if self.offload:
                with memory.on_device(self.copy, self.device) as ref:
                    return token_logprobs(
                        ref, mb, self.temperature, False, self.share_prompts, self.head
                    )[0]
            return token_logprobs(
                self.copy, mb, self.temperature, False, self.share_prompts, self.head
            )[0]


def resolve_auto(cfg: TrainConfig) -> TrainConfig:
    """Replace ``dtype: auto`` by bfloat16 on a GPU that supports it, else float32."""
    if cfg.policy.dtype != "auto":
        return cfg
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = replace(cfg.policy, dtype=auto_dtype(device))
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
    mount. The folders the probe created are removed again: a start that fails later (a missing
    data file, a model that does not load) leaves no empty run folder behind; the run log
    creates the folder once the run starts.
    """
    blocker = next((p for p in (run_dir, *run_dir.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(
            f"output_dir: {blocker} is a file, so {run_dir} cannot be a run folder; give "
            "another path (the folder is created)"
        )
    probe = run_dir / f".write-test-{os.getpid()}"
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise ConfigError(
            f"output_dir: cannot write in {run_dir} ({reason}); choose a writable folder"
        ) from None
    finally:
        for folder in created:  # deepest first; one that gained files meanwhile stays
            with contextlib.suppress(OSError):
                folder.rmdir()


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
    except FileNotFoundError as err:  # a data file (path=): not the run folder
        raise ConfigError(f"env: {env_id}: {err}") from None
    except TypeError as err:
        raise ConfigError(
            f"env: {env_id} does not accept kwargs {dict(kwargs)} ({err}); "
            f"`grpo envs show {env_id}` lists its arguments"
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
            # Training from scratch would silently throw away what the user meant to continue
            # (a mistyped folder, a run that never saved).
            raise CheckpointError(
                f"resume: {run_dir} holds no checkpoint to resume; check the folder "
                "(--output_dir), or drop --resume to start a new run there"
            )
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
    from grpo_train.models.loading import ModelNotAvailableError, load_policy

    saved = str(resume_from / MODEL_DIR) if resume_from else None
    base_model, adapter = _start_weights(lora, base_model, saved, init_from)
    try:
        if lora is not None:
            from grpo_train.learner.lora import load_lora_policy

            # A LoRA checkpoint's model/ folder holds only the adapter: load the base, then it.
            peft_model, tokenizer = load_lora_policy(
                base_model,
                lora,
                dtype=cfg.policy.dtype,
                device=device,
                adapter_dir=adapter,
                attn_implementation=cfg.policy.attn_implementation,
            )
            # A PeftModel forwards generate / save_pretrained / forward like the model it wraps.
            model = cast("PreTrainedModel", peft_model)
            model_path = base_model  # what a vLLM engine starts from; merged weights follow
        else:
            model_path = saved or base_model
            model, tokenizer = load_policy(
                model_path, parameter_dtype(cfg.policy), device, cfg.policy.attn_implementation
            )
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


# -------------------------------------------------------------- the components' settings
# Each component takes its own small settings; these build them from the run's configuration,
# the one place that reads it for them.


# -------------------------------------------------------------- the rollout engine
