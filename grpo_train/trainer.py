"""The GRPO training loop, readable top to bottom.

``Trainer(config)`` builds the run once (``setup.run.setup_run``, a frozen ``RunSetup`` of the
policy, tokenizer, optimizer, environments, prompts, engine, ...) and ``train()`` runs it. Each
step (``Trainer.train_step``) is one call per phase: (1)-(3) generate and score this rank's share
of the prompts (``collect.collector.Collector.sample_batch``, into an immutable
``collect.batch.RolloutBatch``) -> (4) group-relative advantages (``Trainer.advantages``) ->
(5) clipped policy-gradient updates (``Trainer.update`` -> ``learner.update.grpo_update``, mu of
them, micro-batched) -> (6) sync the new
weights into the engine (``Trainer.sync_weights``) -> (7) log. With ``async_generation`` the
rollouts of (1)-(3) come from a producer thread that generates the next steps' batches while
this one trains (``collect.pipeline.RolloutPipeline``: ``take``, and ``before_sync`` in (6)).
Around the step, ``train`` evaluates, hands the metrics to
``collect.learning_signal.AutoHeuristics`` and checkpoints. The math lives in
``algorithm/advantages.py`` and ``algorithm/objective.py``, the data-parallel collectives in
``parallel/distributed.py``, stopping on a signal in ``run/stop.py``, step metrics in
``collect/metrics.py``, run management in ``run/checkpoint.py`` and ``run/run_log.py``.

The trainer itself holds only what changes while the run trains: the rollout engine (replaced by
a ``LostEngine`` when it dies, ``_lose_engine``), the EMA baselines, and what a stop or an
engine failure left to save.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from grpo_envs.base import Environment
from grpo_train.algorithm.advantages import Estimator
from grpo_train.algorithm.baselines import group_key
from grpo_train.algorithm.global_advantages import global_advantages, global_ema_advantages
from grpo_train.collect.batch import RolloutBatch
from grpo_train.collect.collector import Collector
from grpo_train.collect.groups import Group
from grpo_train.collect.learning_signal import Switch
from grpo_train.collect.metrics import step_metrics
from grpo_train.collect.pipeline import RolloutPipeline, engine_idle
from grpo_train.collect.samples import sample_records
from grpo_train.config import ConfigError, TrainConfig
from grpo_train.learner import weight_export
from grpo_train.learner.lora import save_merged
from grpo_train.learner.update import grpo_update
from grpo_train.parallel import distributed
from grpo_train.rollout.base import EngineDied, LostEngine, RolloutEngine, engine_asleep
from grpo_train.run.checkpoint import SamplerState, checkpoint_path, read_rollouts, save_checkpoint
from grpo_train.run.run_log import (
    RunLogger,
    logger,
    open_run_log,
    read_metrics,
    samples_due,
)
from grpo_train.run.stop import StopRequest, pause_point
from grpo_train.run.throughput import TimeToTarget, elapsed_at, run_throughput, time_to_target
from grpo_train.setup.run import RunSetup, setup_run
from grpo_train.setup.settings import (
    collector_settings,
    run_log_settings,
    start_notes,
    suite_settings,
)


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
    start_step: int = 0
    """The step this launch resumed from (0 for a fresh run): it trained ``steps - start_step``."""
    earlier_wall_s: float = 0.0
    """Wall time of the earlier launches up to ``start_step`` (their ``time/elapsed``)."""

    @property
    def total_wall_s(self) -> float:
        """Wall time of the whole run, earlier launches included."""
        return self.earlier_wall_s + self.wall_s


class Trainer:
    """GRPO on one or more environments: ``Trainer(config).train()`` runs the whole thing.

    ``env`` and ``engine`` may be injected (tests, custom environments); otherwise they are built
    from ``config`` (``grpo_envs.make`` per ``config.data.env`` entry,
    ``setup.engines.build_engine``).
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
        self.stop = stop or StopRequest()
        self.setup: RunSetup = setup_run(config, env, engine, self.stop)
        """What the run is built from (``setup.run.setup_run``): fixed for the whole run."""
        # What changes while the run trains:
        self.engine = self.setup.engine
        """The rollout engine; a ``LostEngine`` once it died (``_lose_engine``)."""
        self.baselines = self.setup.baselines
        """``advantage_estimator=ema``: the running reward baselines, updated every step."""
        self.engine_failure: EngineDied | None = None
        """The engine died without a stop request: the run saves and ends with this error."""
        self._undone: SamplerState | None = None
        s = self.setup
        self.collector = Collector(
            collector_settings(s.cfg),
            s.prompts,
            self.engine,
            s.tokenizer,
            s.prompt_format,
            s.rank,
            s.run_dir,
        )
        self.pipeline = RolloutPipeline(
            self.collector,
            self._max_staleness(),
            s.cfg.run.max_steps,
            read_rollouts(s.resume_from) if s.resume_from is not None else (),
        )
        """Each step's rollouts: generated at once, or ahead by a producer (async_generation)."""

    def _max_staleness(self) -> int:
        """Return the run's staleness bound: 0 unless async_generation; refused where it fails."""
        s, r = self.setup, self.setup.cfg.rollout
        if not (r.async_generation and r.max_staleness > 0):
            return 0
        problem = None
        if s.distributed:  # sample_batch sums and gathers over ranks: main-thread collectives
            problem = (
                "a launched (multi-process) run is not supported (each step's rollout "
                "statistics are gathered over ranks while generating); run one process"
            )
        elif self.engine.shares_weights(weight_export.unwrap_model(s.wrapped_model)):
            problem = (
                "the hf engine samples with the trainer's own module, which the update "
                "changes under it; use --engine vllm (or vllm_mode server)"
            )
        if problem is None:
            return r.max_staleness
        self.engine.close()
        raise ConfigError(f"async_generation: {problem}, or drop --async_generation")

    def train(self) -> TrainResult:
        """Run up to ``max_steps`` steps (from the resumed step), evaluating before and after.

        Under ``accelerate launch`` every rank runs this; only the main rank evaluates, logs and
        writes files (the others get a logger that writes nothing).
        """
        s = self.setup
        cfg, run, t0 = s.cfg, s.cfg.run, time.perf_counter()
        main = s.rank.is_main
        log = open_run_log(
            run_log_settings(cfg),
            cfg.to_yaml(),
            start_notes(cfg),
            s.run_dir,
            s.start_step,
            main,
            s.resume_from,
            s.launch,
        )
        step, acc_before, acc_after = s.start_step, None, None
        # A resumed run continues its checkpoint's clock: time/elapsed is the run's.
        earlier = elapsed_at(self._resumed_rows(), s.start_step) if s.start_step > 0 else 0.0
        last_ckpt = s.resume_from if self._resumed_here() else None
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
                    if last and s.distributed and not weight_export.is_sharded(s.wrapped_model):
                        # Data-parallel replicas must agree exactly; 0.0 says DDP kept them in step.
                        metrics["dist/max_rank_diff"] = distributed.max_rank_difference(
                            s.wrapped_model
                        )
                    if (
                        self._evaluates
                        and cfg.data.eval_size > 0
                        and (last or (run.eval_every and step % run.eval_every == 0))
                    ):
                        pause_point("evaluation", step)
                        evaluated = self._evaluate_if_engine()
                        if main:  # the main's engine partners only take part
                            metrics.update(evaluated)
                            acc_after = metrics.get("eval/accuracy") if last else None
                    # For accuracy against wall time: seconds since the run began training,
                    # evaluations included.
                    metrics["time/elapsed"] = earlier + time.perf_counter() - t0
                    advice = s.auto.watch(step, metrics)
                    if advice is not None:  # said once, in one line: what ran, what to try
                        log.write(advice)
                    log.log_step(step, metrics)
                    if last or (run.save_every and step % run.save_every == 0):
                        last_ckpt = self.save(step)
                # The stop decision is global (a signal to any one rank stops all of them), and so
                # are the save (collective) and the reported "interrupted".
                stopped = self.stop.anywhere()
                if (stopped or self.engine_failure) and last_ckpt != checkpoint_path(
                    s.run_dir, step
                ):
                    why = self.stop.name if self.stop.signum else "stop on another rank"
                    if self.engine_failure:
                        why = "the rollout engine died"
                    log.write(f"{why}: saving step {step} and stopping")
                    last_ckpt = self.save(step)
                if s.lora is not None and cfg.policy.save_merged:
                    save_merged(
                        s.wrapped_model,
                        s.tokenizer,
                        s.run_dir / "merged",
                        is_main_process=main,
                    )
            finally:
                self.pipeline.close()
                log.close()
        if self.engine_failure is not None:
            raise self.engine_failure
        if s.distributed:
            # Ranks leave together, with no collective in flight: a rank that exited while gloo
            # still had work aborted once in C++ teardown ("terminate called without an active
            # exception", CI under FSDP). Only after a run that ended normally (a failed rank
            # must exit so that the launcher stops the others), and not destroy_process_group:
            # with gloo on torch 2.13 it deadlocked (its destructor joins a thread that waits
            # for the GIL).
            s.accelerator.wait_for_everyone()
        interrupted = stopped
        wall = time.perf_counter() - t0
        rows = read_metrics(s.run_dir) if main else []  # the whole run's, resumed launches too
        return TrainResult(
            s.run_dir,
            step,
            acc_before,
            acc_after,
            wall,
            interrupted,
            last_ckpt,
            time_to_target(rows, run.target_accuracy) if main else None,
            run_throughput(rows),
            tuple(s.auto.switches),
            s.start_step,
            earlier,
        )

    def _resumed_rows(self) -> list[dict[str, float]]:
        """Read the metric rows of the run the resumed checkpoint belongs to (its own folder)."""
        s = self.setup
        if s.resume_from is None:
            return []
        # A checkpoint is RUN_DIR/checkpoints/step-NNNNNN; resuming another run's checkpoint
        # reads that run's rows.
        owner = Path(s.resume_from).parent.parent
        rows = read_metrics(owner)
        return rows if rows else read_metrics(s.run_dir)

    def _resumed_here(self) -> bool:
        """Whether the resumed checkpoint is this run's own at the start step (saved already)."""
        s = self.setup
        if s.resume_from is None:
            return False
        own = checkpoint_path(s.run_dir, s.start_step)
        return Path(s.resume_from).resolve() == own.resolve()

    def _accuracy_before(self, log: RunLogger) -> float | None:
        """Evaluate before training (main rank, step 0); a resumed run reuses its step-0 row."""
        s = self.setup
        if s.resume_from is not None:
            old_row = [r for r in self._resumed_rows() if r.get("step") == 0]
            if old_row and old_row[0].get("eval/accuracy") is not None:
                return old_row[0]["eval/accuracy"]
        if not (s.start_step == 0 and s.cfg.data.eval_size > 0 and self._evaluates):
            return None
        pause_point("evaluation", 0)
        before = self._evaluate_if_engine()
        if not before or not s.rank.is_main:
            return None
        log.log_eval(0, before)
        return before["eval/accuracy"]

    def _step(self, step: int, log: RunLogger) -> dict[str, float] | None:
        """``train_step``; None when the engine died before the update (the step is undone).

        The data position goes back to the step's start (``_undone``, what ``save`` writes), so
        that a resumed run draws the same prompts and ends with the same weights.
        """
        before = self.setup.prompts.state()
        try:
            return self.train_step(step, log)
        except EngineDied as died:
            self._lose_engine(died)
            self._undone = self.pipeline.position() or before
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
        if self.setup.distributed:
            raise died
        self.engine_failure = died

    @property
    def _evaluates(self) -> bool:
        """Tell whether this rank runs the evaluation.

        The main rank does, and with a tensor-parallel engine the other ranks of its engine too
        (every shard takes part in each forward).
        """
        s = self.setup
        return s.rank.rank < s.cfg.rollout.tensor_parallel

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
        batch, sampled, m = self.pipeline.take(step, times, self.setup.auto.dynamic_sampling)
        # (4) Advantages over the whole step's batch (every rank's groups).
        t = time.perf_counter()
        advantages = self.advantages(batch)
        # (5) Clipped policy-gradient updates (mu of them, micro-batched) on this rank's rows.
        pause_point("update", step)
        m.update(self.update(step, batch, advantages))
        times["train"] = time.perf_counter() - t
        # (6) Push the new weights into the rollout engine (merged LoRA, gathered shards), once
        # the old weights generated their last batch (async_generation).
        m.update(self.await_producer(step, times))
        t = time.perf_counter()
        pause_point("weight sync", step)
        m.update(self.sync_weights())
        times["sync"] = time.perf_counter() - t
        # (7) Time split, throughput, memory; sample completions.
        m.update(step_metrics(sampled, times, self.setup.scheduler.get_last_lr()[0]))
        m.update(engine_idle(m))  # async_generation: the engine's idle seconds in the step
        self._log_samples(step, batch, sampled, advantages, log)
        return m

    def update(self, step: int, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """``update.grpo_update`` on this rank's rows, with the engine asleep; its metrics."""
        s = self.setup
        if not distributed.any_rank(batch.rewards.numel() > 0):
            logger.warning("step %d: every group had equal rewards; no update", step)
            return {}
        # vLLM sleep mode (GPU): the engine's memory is free while the trainer needs it.
        with engine_asleep(self.engine):
            return grpo_update(s.learner, s.clip_and_step, batch, advantages, s.settings)

    def await_producer(self, step: int, times: dict[str, float]) -> dict[str, float]:
        """Wait for the batches the engine's weights still generate (``RolloutPipeline``).

        An engine that dies meanwhile leaves the update standing, as in ``sync_weights``.
        """
        try:
            return self.pipeline.before_sync(step, times)
        except EngineDied as died:
            self._lose_engine(died)
            return {}

    def sync_weights(self) -> dict[str, float]:
        """Load the policy's new weights into the rollout engine; the sync's metrics.

        An engine that dies here leaves the update standing: the step is complete without it.
        Metrics: server mode's ``sync/bytes``, ``sync/seconds``, ``sync/version``; a colocated
        engine's ``sync/bytes`` (none when it shares the trainer's module).
        """
        if isinstance(self.engine, LostEngine):  # it died waiting for the producer
            return {}
        try:
            sent = weight_export.sync_rollout_weights(self.engine, self.setup.wrapped_model)
        except EngineDied as died:
            self._lose_engine(died)
            return {}
        server = getattr(self.engine, "sync_metrics", None)  # server mode: bytes, time, version
        if server is not None:
            return dict(server())
        return {"sync/bytes": float(sent)} if sent else {}

    def _log_samples(
        self,
        step: int,
        batch: RolloutBatch,
        sampled: Sequence[Group],
        advantages: torch.Tensor,
        log: RunLogger,
    ) -> None:
        """Log one group's completions on the first, every ``log_every_samples``-th, last step."""
        s = self.setup
        if not (sampled and samples_due(step, s.cfg.run.log_every_samples, s.cfg.run.max_steps)):
            return
        # The first trained group; when dynamic sampling dropped every group (no signal), the
        # first sampled one with advantage 0, so that the log shows what the model wrote.
        trained = bool(batch.samples) and not batch.padding
        group = batch.samples[0] if trained else sampled[0]
        values = advantages[0].tolist() if trained else [0.0] * len(group.completions)
        env = s.envs[group.env_index]
        # MultiTurnEnv's terms over the whole episode (a per-turn penalty); the rubric's judge
        # the final turn.
        terms = [t.name for t in getattr(env, "episode_components", ())]
        log.log_samples(sample_records(step, group, s.env_names[group.env_index], values, terms))

    def advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Return the (P, G) advantages of this rank's groups, computed over every rank's.

        ``grpo`` / ``rloo`` compare each completion with its group; ``ema`` with the running
        baselines of past steps (``baselines.ema_advantages``), which it then updates.
        """
        a = self.setup.cfg.algorithm
        if a.advantage_estimator is not Estimator.EMA:
            return global_advantages(
                batch.rewards, a.advantage_estimator, a.scale_rewards, local_valid=batch.scored
            ).local.float()
        keys = [group_key(g.env_index, g.sample.id) for g in batch.samples]
        # A padding rank's group only keeps the collectives in step: it must not move a baseline.
        valid = batch.scored & (not batch.padding)
        advantages, self.baselines = global_ema_advantages(
            batch.rewards, keys, self.baselines, a.ema_alpha, a.scale_rewards, valid
        )
        return advantages

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy, greedy, on the first ``eval_size`` rows of each environment.

        Runs ``grpo_train.eval.evaluate`` with the running engine: ``eval/accuracy`` over all
        environments plus ``eval/<env id>/accuracy`` and ``pass@1`` per environment.
        """
        from grpo_train.episodes.driver import STEP_WORKERS, EpisodeSettings
        from grpo_train.eval import GREEDY, evaluate

        s, cfg = self.setup, self.setup.cfg
        summary = evaluate(
            self.engine,
            s.tokenizer,
            s.envs,
            split=cfg.data.eval_split,
            limit=cfg.data.eval_size,
            sampling=replace(GREEDY, max_new_tokens=cfg.rollout.max_completion_length),
            max_prompt_tokens=cfg.data.max_prompt_length,
            progress=False,
            prompt_format=s.prompt_format,
            episodes=EpisodeSettings(  # multi-turn envs: bounded as the training episodes are
                cfg.rollout.max_completion_length,
                workers=STEP_WORKERS,
                max_turn_tokens=cfg.rollout.max_turn_tokens or None,
                fatal_breaks=cfg.rollout.template_breaks == "error",
            ),
        )
        metrics = summary.metrics("eval")
        if cfg.data.eval_suites:  # benchmark suites: eval/<suite>/avg@n, kept out of eval/accuracy
            from grpo_train.eval.training_suites import evaluate_suites

            metrics.update(
                evaluate_suites(self.engine, s.tokenizer, suite_settings(cfg), s.prompt_format)
            )
        return metrics

    def save(self, step: int) -> Path:
        """Checkpoint the current state (model, optimizer, scheduler, RNG, data position).

        Collective: every rank calls it (sharded weights are gathered onto rank 0 for the HF
        folder; FSDP / DeepSpeed optimizer shards go through ``accelerator.save_state``), the
        main rank writes the shared files. A LoRA run's ``model/`` folder holds only the adapter.
        """
        s = self.setup
        pause_point("checkpoint write", step)
        state = None
        if weight_export.is_sharded(s.wrapped_model):
            state = weight_export.full_state_dict(s.wrapped_model, rank0_only=True)
        return save_checkpoint(
            s.run_dir,
            step,
            model=s.model,
            tokenizer=s.tokenizer,
            optimizer=s.optimizer,
            scheduler=s.scheduler,
            sampler=s.auto.saved_into(
                self._undone or self.pipeline.position() or s.prompts.state()
            ),
            config_yaml=s.cfg.to_yaml(),
            keep_last=s.cfg.run.keep_last,
            state_dict=state,
            accelerator=s.accelerator if s.distributed else None,
            identity=s.identity,
            launch=s.launch,
            baselines=self.baselines.to_state(),
            switches=s.auto.record(),
            rollouts=self.pipeline.pending(),
        )

    def close(self) -> None:
        """Stop the rollout producer and free the rollout engine."""
        self.pipeline.close()
        self.engine.close()
