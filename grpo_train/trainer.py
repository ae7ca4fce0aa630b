"""The GRPO training loop, readable top to bottom.

Each step (``Trainer.train_step``): (1) sample prompts -> (2) generate a group of completions
per prompt with the rollout engine -> (3) score them with the environment (``collect.py``, into
an immutable ``batch.RolloutBatch``) -> (4) group-relative advantages -> (5) clipped
policy-gradient updates (``update.grpo_update``, mu of them, micro-batched) -> (6) sync the new
weights into the engine -> (7) log, evaluate, checkpoint. The math lives in ``advantages.py`` and
``loss.py``, the data-parallel protocol in ``data_parallel.py``, start-up choices, policy loading
and resume checks in ``run_setup.py``, stopping on a signal in ``stop.py``, step metrics in
``metrics.py``, run management in ``checkpoint.py`` and ``run_log.py``.

Why over 500 lines: one class owns a run's whole life (the builders ``__init__`` calls, the run
loop with its signal, evaluation and checkpoint rules, what a stop does when the engine did not
survive it, and the step); what is its own concept (collection, stopping, watching the engine's
processes, metrics, the run log, policy loading) already lives elsewhere.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from grpo_envs.base import Environment
from grpo_train import data_parallel, distributed, memory, weight_export
from grpo_train.advantages import Estimator
from grpo_train.baselines import EmaBaselines, group_key
from grpo_train.batch import RolloutBatch
from grpo_train.checkpoint import (
    SamplerState,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    new_launch_id,
    read_manifest,
    save_checkpoint,
)
from grpo_train.collect import Collector
from grpo_train.config import ConfigError, TrainConfig
from grpo_train.groups import Group
from grpo_train.learning_signal import AutoHeuristics, Switch
from grpo_train.lora import reference_logprobs, save_merged
from grpo_train.loss import MicroBatch, token_logprobs
from grpo_train.metrics import step_metrics
from grpo_train.prompts import PromptFormat
from grpo_train.rollout import build_engine
from grpo_train.rollout.base import EngineDied, LostEngine, RolloutEngine, engine_asleep
from grpo_train.run_log import RunLogger, logger, open_run_log, read_metrics, sample_records
from grpo_train.run_setup import (
    apply_schedule_changes,
    build_optimizer,
    check_output_dir,
    check_resume,
    check_splits,
    curriculum_stages,
    init_path,
    load_run_policy,
    lora_settings,
    make_envs,
    resolve_auto,
    resume_path,
    run_identity,
)
from grpo_train.stop import StopRequest, pause_point
from grpo_train.throughput import TimeToTarget, run_throughput, time_to_target
from grpo_train.training_prompts import TrainingPrompts
from grpo_train.update import ClipAndStep, Policy, UpdateSettings, grpo_update

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class TrainResult:
    """What a finished (or interrupted) run reports."""

    run_dir: Path
    steps: int
    accuracy_before: float | None
    accuracy_after: float | None
    wall_s: float
    interrupted: bool
    last_checkpoint: Path | None
    time_to_target: TimeToTarget | None = None
    """When held-out accuracy first reached ``target_accuracy`` (or its best); main rank only."""
    throughput: dict[str, float] = field(default_factory=dict)
    """The run's ``throughput/samples_per_s`` and ``throughput/completion_tokens_per_s`` over
    its step time (main rank only)."""
    switches: tuple[Switch, ...] = ()
    """What ``curriculum=auto`` / ``dynamic_sampling=auto`` and the curriculum changed, and
    after which step (``learning_signal.AutoHeuristics``)."""


class Trainer:
    """GRPO on one or more environments: ``Trainer(config).train()`` runs the whole thing.

    ``env`` and ``engine`` may be injected (tests, custom environments); otherwise they are built
    from ``config`` (``grpo_envs.make`` per ``config.data.env`` entry, ``build_engine``).
    ``stop``: the stop request whose signal handlers the caller installed before the trainer
    was built (``grpo train`` does, so that a signal while loading is a stop like any other).

    A stop request that the rollout engine does not survive (its processes got the signal too,
    see ``stop.py``) is part of the stop: the policy, the optimizer and the data position live
    here, so the last completed step is saved without the engine. A step whose generation the
    engine did not finish is undone (``_undone``: its prompts are drawn again on resume); a step
    whose weight sync it did not finish is complete, and saved.
    """

    def __init__(
        self,
        config: TrainConfig,
        env: Environment | Sequence[Environment] | None = None,
        engine: RolloutEngine | None = None,
        stop: StopRequest | None = None,
    ) -> None:
        from grpo_train.models import resolve_model

        self.stop = stop or StopRequest()
        self.engine_failure: EngineDied | None = None
        """The engine died without a stop request: the run saves and ends with this error."""
        self._undone: SamplerState | None = None
        self._start_process(config)
        weights = self._build_envs(env)
        self.launch = new_launch_id()
        self.resume_from = resume_path(self.cfg, self.run_dir)
        init_from = init_path(self.cfg)
        torch.manual_seed(self.cfg.run.seed)
        random.seed(self.cfg.run.seed)
        np.random.seed(self.cfg.run.seed)
        base_model = resolve_model(self.cfg.policy.model)
        self.lora = lora_settings(self.cfg)
        self.identity = run_identity(self.cfg, base_model)
        self.saved = read_manifest(self.resume_from) if self.resume_from else None
        if self.resume_from is not None:
            check_resume(self.resume_from, self.saved, self.identity)
        model, model_path, base_model = self._build_policy(base_model, init_from)
        self.ref_model = self._build_reference(base_model)
        self.optimizer, self.scheduler = build_optimizer(self.cfg, model)
        self.policy = model  # the unwrapped module: engines, checkpoints, evaluation
        self.model: torch.nn.Module = model
        if self.distributed:  # DDP / FSDP / ZeRO wrappers; gradients reduced by them
            self.model, self.optimizer = self.accelerator.prepare(model, self.optimizer)
        self.dp = data_parallel.strategy(self.accelerator, self.model, self.distributed)
        sampler_state = self._resume_training_state()
        # What training draws: each environment's current curriculum stage, in a resumable order.
        stage_envs, starts = curriculum_stages(self.cfg, self.envs)
        self.prompts = TrainingPrompts(
            stage_envs, starts, self.env_names, weights, self.cfg.data, self.cfg.run.seed,
            sampler_state,
        )  # fmt: skip
        # curriculum=auto and dynamic_sampling=auto: their state, decisions and record.
        self.auto = AutoHeuristics(self.cfg, self.prompts, sampler_state, self.start_step)
        self.engine = engine if engine is not None else self._start_engine(model_path)
        if self.lora is not None and self.resume_from and not isinstance(self.engine, LostEngine):
            weight_export.sync_rollout_weights(self.engine, self.model)  # the resumed adapter
        self.learner = self._build_learner()
        self.settings = UpdateSettings.from_config(self.cfg)
        # Sharded models need accelerate's (collective) gradient norm.
        clip = self.accelerator.clip_grad_norm_ if self.distributed else None
        self.clip_and_step = ClipAndStep(
            self.model, self.optimizer, self.scheduler, self.cfg.optim, self.cfg.run.max_bad_steps,
            clip or torch.nn.utils.clip_grad_norm_, lambda: latest_checkpoint(self.run_dir),
        )  # fmt: skip
        self.collector = Collector(
            self.cfg, self.prompts, self.engine, self.tokenizer, self.prompt_format, self.rank,
            self.dp, self.run_dir,
        )  # fmt: skip

    def _start_engine(self, model_path: str) -> RolloutEngine:
        """Build the rollout engine; a ``LostEngine`` when a stop request came first or killed it.

        A single process stopped while loading does not start an engine only to close it (under
        a launch every rank starts its engine: vLLM's start is collective there).
        """
        pause_point("engine start")
        if self.stop.signum is not None and not self.distributed:
            return LostEngine("the run was stopped before its rollout engine started")
        try:
            return build_engine(self.cfg, model_path, self.policy, self.tokenizer)
        except Exception as err:
            if self.stop.signum is None:
                raise
            return LostEngine(f"the rollout engine stopped while starting ({type(err).__name__})")

    def _start_process(self, config: TrainConfig) -> None:
        """Resolve the config, check the run folder, start accelerate (the device, the ranks)."""
        from accelerate import Accelerator
        from accelerate.utils import DistributedType, InitProcessGroupKwargs

        from grpo_train.run_dir import check_run_dir, clear_run_dir, with_output_dir

        # `auto` choices become concrete here, so the run's config.yaml says what ran.
        self.cfg = cfg = with_output_dir(resolve_auto(config))
        check_run_dir(cfg)  # another run's folder: refused before anything loads
        self.prompt_format = PromptFormat.from_config(cfg.data)
        self.prompt_format.template_text()  # a missing template file fails now, not mid-run
        self.run_dir = Path(cfg.run.output_dir)
        check_output_dir(self.run_dir)
        distributed.check_launch()
        # accelerate reads `accelerate launch`'s settings (DDP / FSDP / DeepSpeed, the device);
        # a plain `python` run is one process on cuda:0 or the CPU. The process group's timeout
        # bounds every collective: a hung or stopped rank fails the others in that time.
        timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.run.collective_timeout_s))
        self.accelerator = Accelerator(kwargs_handlers=[timeout])
        self.distributed = self.accelerator.distributed_type != DistributedType.NO
        self.rank = distributed.rank_info()
        if self.rank.is_main:
            clear_run_dir(cfg)
        self.device = str(self.accelerator.device)
        if cfg.policy.use_qlora and torch.device(self.device).type != "cuda":
            raise ConfigError(
                f"use_qlora: QLoRA loads the base in 4-bit with bitsandbytes, which needs a CUDA "
                f"GPU, and this run is on {self.device}; drop --use_qlora (plain LoRA: --lora_r 16)"
            )
        if cfg.policy.num_threads:
            torch.set_num_threads(cfg.policy.num_threads)

    def _build_envs(self, env: Environment | Sequence[Environment] | None) -> list[float]:
        """Build (or take) the environments and their training rows; return their weights."""
        cfg = self.cfg
        self.envs = [env] if isinstance(env, Environment) else list(env or make_envs(cfg))
        self.env_names = [e.env_id or type(e).__name__ for e in self.envs]
        check_splits(self.envs, self.env_names, cfg.data)
        same = len(cfg.data.env) == len(self.envs)
        return [e.weight for e in cfg.data.env] if same else [1.0] * len(self.envs)

    def _build_policy(
        self, base_model: str, init_from: Path | None
    ) -> tuple[PreTrainedModel, str, str]:
        """Load the policy (and tokenizer); return it, the engine's start path and the base."""
        model, self.tokenizer, model_path, base_model = load_run_policy(
            self.cfg, self.lora, self.device, base_model, self.resume_from, init_from
        )
        # One prompt format for training and evaluation (grpo_train/prompts.py). A template
        # given by the run is also set on the tokenizer, so checkpoints carry it to `grpo eval`.
        template = self.prompt_format.template_text()
        if template is not None:
            self.tokenizer.chat_template = template
        if self.cfg.policy.gradient_checkpointing:
            memory.enable_gradient_checkpointing(model)
        return model, model_path, base_model

    def _build_reference(self, base_model: str) -> PreTrainedModel | None:
        """Load the KL reference: the initial policy, only when used (beta > 0).

        With LoRA it is the same module with the adapter switched off: no second copy.
        """
        from grpo_train.models import load_policy

        cfg = self.cfg
        if cfg.algorithm.beta <= 0 or self.lora is not None:
            return None
        ref_device = "cpu" if cfg.policy.offload_reference else self.device
        with distributed.every_rank_loads_weights():  # never prepared: needs real weights
            ref_model = load_policy(base_model, cfg.policy.dtype, ref_device)[0]
        ref_model.eval().requires_grad_(False)
        return ref_model

    def _resume_training_state(self) -> SamplerState | None:
        """Restore optimizer, scheduler and data position from the resumed checkpoint.

        After ``accelerator.prepare``: FSDP / DeepSpeed restore into the sharded state.
        """
        self.start_step = 0
        self.baselines = EmaBaselines()  # advantage_estimator=ema: the running reward baselines
        if not self.resume_from:
            return None
        state = load_checkpoint(
            self.resume_from,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            accelerator=self.accelerator if self.distributed else None,
        )
        self.start_step = state.step
        self.baselines = EmaBaselines.from_state(state.baselines)
        if self.rank.is_main:
            logger.info("resuming from %s (step %d)", self.resume_from, self.start_step)
        apply_schedule_changes(
            self.saved, self.cfg, self.optimizer, self.scheduler, self.start_step, self.rank.is_main
        )
        return state.sampler

    def _build_learner(self) -> Policy:
        """Return the policy as ``grpo_update`` sees it (module, pad id, autocast, reference)."""
        cfg = self.cfg
        # The update runs each group's prompt once (loss.token_logprobs, share_prompts): not
        # under DDP/FSDP wrappers (two forwards per backward) or gradient checkpointing (no cache).
        self.share_prompts = (
            cfg.optim.share_prompt_forward
            and not self.distributed
            and not cfg.policy.gradient_checkpointing
        )
        return Policy(
            model=self.model,
            pad_id=self.tokenizer.pad_token_id,
            device=self.device,
            share_prompts=self.share_prompts,
            autocast=self._autocast,
            reference=self._reference_logprobs if cfg.algorithm.beta > 0 else None,
        )

    def train(self) -> TrainResult:
        """Run up to ``max_steps`` steps (from the resumed step), evaluating before and after.

        Under ``accelerate launch`` every rank runs this; only the main rank evaluates, logs and
        writes files (the others get a logger that writes nothing).
        """
        cfg, run, t0 = self.cfg, self.cfg.run, time.perf_counter()
        main = self.rank.is_main
        log = open_run_log(cfg, self.run_dir, self.start_step, main, self.resume_from, self.launch)
        step, acc_before, acc_after = self.start_step, None, None
        last_ckpt = self.resume_from if self._resumed_here() else None
        stopped = False
        with self.stop.installed():  # the first Ctrl-C / SIGTERM: finish the step, save
            try:
                acc_before = self._accuracy_before(log)
                while step < run.max_steps and not self.stop.anywhere() and not self.engine_failure:
                    step += 1
                    metrics = self._step(step, log)
                    if metrics is None:  # undone: the engine died during its generation
                        step -= 1
                        break
                    last = step == run.max_steps
                    if last and self.distributed and not weight_export.is_sharded(self.model):
                        # Data-parallel replicas must agree exactly; 0.0 says DDP kept them in step.
                        metrics["dist/max_rank_diff"] = distributed.max_rank_difference(self.model)
                    if (
                        main
                        and cfg.data.eval_size > 0
                        and (last or (run.eval_every and step % run.eval_every == 0))
                    ):
                        pause_point("evaluation", step)
                        metrics.update(self._evaluate_if_engine())
                        acc_after = metrics.get("eval/accuracy") if last else None
                    # For accuracy against wall time: seconds since this launch began training,
                    # evaluations included.
                    metrics["time/elapsed"] = time.perf_counter() - t0
                    advice = self.auto.watch(step, metrics)
                    if advice is not None:  # said once, in one line: what ran, what to try
                        log.write(advice)
                    log.log_step(step, metrics)
                    if last or (run.save_every and step % run.save_every == 0):
                        last_ckpt = self.save(step)
                # The stop decision is global (a signal to any one rank stops all of them), and so
                # are the save (collective) and the reported "interrupted".
                stopped = self.stop.anywhere()
                if (stopped or self.engine_failure) and last_ckpt != checkpoint_path(
                    self.run_dir, step
                ):
                    why = self.stop.name if self.stop.signum else "stop on another rank"
                    if self.engine_failure:
                        why = "the rollout engine died"
                    log.write(f"{why}: saving step {step} and stopping")
                    last_ckpt = self.save(step)
                if self.lora is not None and cfg.policy.save_merged:
                    save_merged(
                        self.model, self.tokenizer, self.run_dir / "merged", is_main_process=main
                    )
            finally:
                log.close()
        if self.engine_failure is not None:
            raise self.engine_failure
        if self.distributed:
            # Ranks leave together, with no collective in flight: a rank that exited while gloo
            # still had work aborted once in C++ teardown ("terminate called without an active
            # exception", CI under FSDP). Only after a run that ended normally (a failed rank
            # must exit so that the launcher stops the others), and not destroy_process_group:
            # with gloo on torch 2.13 it deadlocked (its destructor joins a thread that waits
            # for the GIL).
            self.accelerator.wait_for_everyone()
        interrupted = stopped
        wall = time.perf_counter() - t0
        rows = read_metrics(self.run_dir) if main else []  # the whole run's, resumed launches too
        return TrainResult(
            self.run_dir,
            step,
            acc_before,
            acc_after,
            wall,
            interrupted,
            last_ckpt,
            time_to_target(rows, run.target_accuracy) if main else None,
            run_throughput(rows),
            tuple(self.auto.switches),
        )

    def _resumed_here(self) -> bool:
        """Whether the resumed checkpoint is this run's own at the start step (saved already)."""
        if self.resume_from is None:
            return False
        own = checkpoint_path(self.run_dir, self.start_step)
        return Path(self.resume_from).resolve() == own.resolve()

    def _accuracy_before(self, log: RunLogger) -> float | None:
        """Evaluate before training (main rank, step 0 only); a resumed step 0 reuses its row."""
        if not (self.start_step == 0 and self.cfg.data.eval_size > 0 and self.rank.is_main):
            return None
        old_row = [r for r in read_metrics(self.run_dir) if r.get("step") == 0]
        if self.resume_from is not None and old_row:
            return old_row[0].get("eval/accuracy")
        pause_point("evaluation", 0)
        before = self._evaluate_if_engine()
        if not before:
            return None
        log.log_eval(0, before)
        return before["eval/accuracy"]

    def _step(self, step: int, log: RunLogger) -> dict[str, float] | None:
        """``train_step``; None when the engine died before the update (the step is undone).

        The data position goes back to the step's start (``_undone``, what ``save`` writes), so
        that a resumed run draws the same prompts and ends with the same weights.
        """
        before = self.prompts.state()
        try:
            return self.train_step(step, log)
        except EngineDied as died:
            self._lose_engine(died)
            self._undone = before
            return None

    def _lose_engine(self, died: EngineDied) -> None:
        """Take the engine's death as part of a stop, or record it as the run's failure.

        Either way its leftovers are cleaned up now (processes, shared memory) and it is replaced
        by a ``LostEngine``. Under a launch a failure raises at once: the other ranks' engines
        live, and a rank that saved alone would wait for them in a collective.
        """
        with contextlib.suppress(Exception):
            self.engine.close()
        self.engine = self.collector.engine = LostEngine(died.cause)
        if self.stop.signum is not None:
            logger.info("the rollout engine ended with the %s: saving without it", self.stop.name)
            return
        if self.distributed:
            raise died
        self.engine_failure = died

    def _evaluate_if_engine(self) -> dict[str, float]:
        """``evaluate``; no metrics when the engine is gone (with a stop, or after a failure)."""
        if isinstance(self.engine, LostEngine):
            return {}
        try:
            return self.evaluate()
        except EngineDied as died:
            self._lose_engine(died)
            return {}

    def train_step(self, step: int, log: RunLogger) -> dict[str, float]:
        """Run one GRPO step (arXiv:2402.03300): rollouts, advantages, update, sync, metrics."""
        times = defaultdict[str, float](float)
        # (1)-(3) Prompts -> a group of generated, scored completions each (this rank's share).
        batch, sampled, m = self.collector.sample_batch(step, times, self.auto.dynamic_sampling)
        # (4) Advantages over the whole step's batch (every rank's groups).
        t = time.perf_counter()
        advantages = self.advantages(batch)
        # (5) Clipped policy-gradient updates (mu of them, micro-batched) on this rank's rows.
        pause_point("update", step)
        m.update(self.update(step, batch, advantages))
        times["train"] = time.perf_counter() - t
        # (6) Push the new weights into the rollout engine (merged LoRA, gathered shards).
        t = time.perf_counter()
        pause_point("weight sync", step)
        self.sync_weights()
        times["sync"] = time.perf_counter() - t
        m.update(getattr(self.engine, "sync_metrics", dict)())  # server mode: bytes, version
        # (7) Time split, throughput, memory; sample completions.
        m.update(step_metrics(sampled, times, self.dp, self.scheduler.get_last_lr()[0]))
        self._log_samples(step, batch, sampled, advantages, log)
        return m

    def update(self, step: int, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """``update.grpo_update`` on this rank's rows, with the engine asleep; its metrics."""
        if not self.dp.any(batch.rewards.numel() > 0):
            logger.warning("step %d: every group had equal rewards; no update", step)
            return {}
        # vLLM sleep mode (GPU): the engine's memory is free while the trainer needs it.
        with engine_asleep(self.engine):
            return grpo_update(
                self.learner, self.clip_and_step, batch, advantages, self.settings, self.dp
            )

    def sync_weights(self) -> None:
        """Load the policy's new weights into the rollout engine.

        An engine that dies here leaves the update standing: the step is complete without it.
        """
        try:
            weight_export.sync_rollout_weights(self.engine, self.model)
        except EngineDied as died:
            self._lose_engine(died)

    def _log_samples(
        self,
        step: int,
        batch: RolloutBatch,
        sampled: Sequence[Group],
        advantages: torch.Tensor,
        log: RunLogger,
    ) -> None:
        """Log one group's completions every ``log_every_samples`` steps."""
        every = self.cfg.run.log_every_samples
        if not (every and step % every == 0 and sampled):
            return
        # The first trained group; when dynamic sampling dropped every group (no signal), the
        # first sampled one with advantage 0, so that the log shows what the model wrote.
        trained = bool(batch.samples) and not batch.padding
        group = batch.samples[0] if trained else sampled[0]
        values = advantages[0].tolist() if trained else [0.0] * len(group.completions)
        log.log_samples(sample_records(step, group, self.env_names[group.env_index], values))

    def advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Return the (P, G) advantages of this rank's groups, computed over every rank's.

        ``grpo`` / ``rloo`` compare each completion with its group; ``ema`` with the running
        baselines of past steps (``baselines.ema_advantages``), which it then updates.
        """
        a = self.cfg.algorithm
        if a.advantage_estimator is not Estimator.EMA:
            return self.dp.advantages(
                batch.rewards, a.advantage_estimator, a.scale_rewards, batch.scored
            ).float()
        keys = [group_key(g.env_index, g.sample.id) for g in batch.samples]
        # A padding rank's group only keeps the collectives in step: it must not move a baseline.
        valid = batch.scored & (not batch.padding)
        advantages, self.baselines = self.dp.ema_advantages(
            batch.rewards, keys, self.baselines, a.ema_alpha, a.scale_rewards, valid
        )
        return advantages

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        """bf16 autocast: on CUDA for a bfloat16 run; on CPU only with ``cpu_autocast_bf16``."""
        if self.cfg.policy.cpu_autocast_bf16 and torch.device(self.device).type == "cpu":
            return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
        return memory.autocast(self.device, self.cfg.policy.dtype)

    def _reference_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """Per-token logprobs under the KL reference: the adapter switched off, or the copy."""
        temperature = self.cfg.rollout.temperature
        if self.lora is not None:
            return reference_logprobs(self.model, mb, temperature).float()
        assert self.ref_model is not None  # built in __init__ whenever beta > 0 without LoRA
        with torch.no_grad():
            if self.cfg.policy.offload_reference:
                with memory.on_device(self.ref_model, self.device) as ref:
                    return token_logprobs(ref, mb, temperature, False, self.share_prompts)[0]
            return token_logprobs(self.ref_model, mb, temperature, False, self.share_prompts)[0]

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy, greedy, on the first ``eval_size`` rows of each environment.

        Runs ``grpo_train.eval.evaluate`` with the running engine: ``eval/accuracy`` over all
        environments plus ``eval/<env id>/accuracy`` and ``pass@1`` per environment.
        """
        from grpo_train.eval import GREEDY, evaluate

        cfg = self.cfg
        summary = evaluate(
            self.engine,
            self.tokenizer,
            self.envs,
            split=cfg.data.eval_split,
            limit=cfg.data.eval_size,
            sampling=replace(GREEDY, max_new_tokens=cfg.rollout.max_completion_length),
            max_prompt_tokens=cfg.data.max_prompt_length,
            progress=False,
            prompt_format=self.prompt_format,
        )
        metrics = summary.metrics("eval")
        if cfg.data.eval_suites:  # benchmark suites: eval/<suite>/avg@n, kept out of eval/accuracy
            from grpo_train.eval.training_suites import evaluate_suites

            metrics.update(evaluate_suites(self.engine, self.tokenizer, cfg, self.prompt_format))
        return metrics

    def save(self, step: int) -> Path:
        """Checkpoint the current state (model, optimizer, scheduler, RNG, data position).

        Collective: every rank calls it (sharded weights are gathered onto rank 0 for the HF
        folder; FSDP / DeepSpeed optimizer shards go through ``accelerator.save_state``), the
        main rank writes the shared files. A LoRA run's ``model/`` folder holds only the adapter.
        """
        pause_point("checkpoint write", step)
        state = None
        if weight_export.is_sharded(self.model):
            state = weight_export.full_state_dict(self.model, rank0_only=True)
        return save_checkpoint(
            self.run_dir,
            step,
            model=self.policy,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            sampler=self.auto.saved_into(self._undone or self.prompts.state()),
            config=self.cfg,
            keep_last=self.cfg.run.keep_last,
            state_dict=state,
            accelerator=self.accelerator if self.distributed else None,
            identity=self.identity,
            launch=self.launch,
            baselines=self.baselines.to_state(),
        )

    def close(self) -> None:
        """Free the rollout engine."""
        self.engine.close()
