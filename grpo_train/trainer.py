"""The GRPO training loop, readable top to bottom.

Each step: (1) sample prompts -> (2) generate a group of completions per prompt with the rollout
engine -> (3) score them with the environment -> (4) group-relative advantages -> (5) clipped
policy-gradient updates (mu of them, micro-batched) -> (6) sync the new weights into the engine ->
(7) log, evaluate, checkpoint. The math lives in ``advantages.py`` and ``loss.py``, prompt groups
in ``groups.py``, run management in ``checkpoint.py`` and ``logging.py``.
"""

from __future__ import annotations

import math
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import numpy as np
import torch

from grpo_envs.base import Environment
from grpo_envs.types import Sample
from grpo_train.advantages import compute_advantages
from grpo_train.checkpoint import (
    MODEL_DIR,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from grpo_train.config import TrainConfig
from grpo_train.groups import (
    Group,
    PromptSampler,
    build_engine,
    check_splits,
    encode_prompt,
    safe_scores,
)
from grpo_train.logging import (
    MetricSums,
    RunLogger,
    logger,
    peak_memory_mb,
    rollout_metrics,
    sample_records,
)
from grpo_train.loss import (
    grpo_loss,
    loss_share,
    make_micro_batches,
    pad_rows,
    token_logprobs,
    truncated_is_weights,
)
from grpo_train.rollout.base import RolloutEngine, SamplingConfig


class TrainingAborted(RuntimeError):
    """Too many updates in a row had a NaN/inf loss or gradient; the last checkpoint is kept."""


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


class Trainer:
    """GRPO on one or more environments: ``Trainer(config).train()`` runs the whole thing.

    ``env`` and ``engine`` may be injected (tests, custom environments); otherwise they are built
    from ``config`` (``grpo_envs.make`` per ``config.data.env`` entry, ``build_engine``).
    """

    def __init__(
        self,
        config: TrainConfig,
        env: Environment | Sequence[Environment] | None = None,
        engine: RolloutEngine | None = None,
    ) -> None:
        from transformers import get_scheduler

        from grpo_train.models import load_policy, resolve_model

        self.cfg = cfg = config
        self.run_dir = Path(cfg.run.output_dir)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if env is None:
            import grpo_envs

            env = [grpo_envs.make(e.id, **e.kwargs) for e in cfg.data.env]
        self.envs = [env] if isinstance(env, Environment) else list(env)
        self.env_names = [e.env_id or type(e).__name__ for e in self.envs]
        check_splits(self.envs, self.env_names, cfg.data)
        same = len(cfg.data.env) == len(self.envs)
        weights = [e.weight for e in cfg.data.env] if same else [1.0] * len(self.envs)
        self.train_rows = [e.dataset(cfg.data.train_split) for e in self.envs]
        self.resume_from = self._resume_path()
        torch.manual_seed(cfg.run.seed)
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        base_model = resolve_model(cfg.policy.model)
        model_path = str(self.resume_from / MODEL_DIR) if self.resume_from else base_model
        self.model, self.tokenizer = load_policy(model_path, cfg.policy.dtype, self.device)
        if cfg.policy.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        # The KL reference is the initial policy, and exists only when it is used (beta > 0).
        self.ref_model = None
        if cfg.algorithm.beta > 0:
            self.ref_model = load_policy(base_model, cfg.policy.dtype, self.device)[0]
            self.ref_model.eval().requires_grad_(False)
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=o.learning_rate,
            betas=(o.adam_beta1, o.adam_beta2),
            weight_decay=o.weight_decay,
        )
        schedule = "constant_with_warmup" if o.lr_scheduler == "constant" else o.lr_scheduler
        total_updates = max(1, cfg.run.max_steps * cfg.algorithm.mu)
        self.scheduler = get_scheduler(schedule, self.optimizer, o.warmup_steps, total_updates)
        self.start_step, sampler_state = 0, None
        if self.resume_from:
            state = load_checkpoint(
                self.resume_from, optimizer=self.optimizer, scheduler=self.scheduler
            )
            self.start_step, sampler_state = state.step, state.sampler
        sizes = [len(rows) for rows in self.train_rows]
        self.sampler = PromptSampler(sizes, weights, cfg.run.seed, sampler_state)
        self.engine = (
            engine
            if engine is not None
            else build_engine(cfg, model_path, self.model, self.tokenizer)
        )
        self._stop_signal: int | None = None
        self._bad_updates = 0

    def _resume_path(self) -> Path | None:
        resume = self.cfg.run.resume
        if not resume:
            return None
        path = latest_checkpoint(self.run_dir) if resume == "latest" else Path(resume)
        if path is None:
            logger.warning(
                "resume=latest: no checkpoint in %s; starting from scratch", self.run_dir
            )
        return path

    def train(self) -> TrainResult:
        """Run up to ``max_steps`` steps (from the resumed step), evaluating before and after."""
        cfg, run, t0 = self.cfg, self.cfg.run, time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg.save(self.run_dir / "config.yaml")
        log = RunLogger(self.run_dir, cfg, start_step=self.start_step)
        # Handlers can only be installed from the main thread; elsewhere Ctrl-C is the caller's.
        in_main = threading.current_thread() is threading.main_thread()
        signals = (signal.SIGINT, signal.SIGTERM) if in_main else ()
        handlers = {s: signal.signal(s, self._on_signal) for s in signals}
        step, last_ckpt, acc_before, acc_after = self.start_step, None, None, None
        if cfg.algorithm.beta == 0 and cfg.algorithm.mu == 1:  # TRL/verl users' FAQ: "loss is 0"
            logger.info(
                "beta=0, mu=1: the logged loss stays near 0 by design, the gradient does not "
                "(see 'Why is the loss 0?' in grpo_train/README.md); watch reward/mean"
            )
        if self.start_step >= run.max_steps:  # never train 0 steps silently (a TRL resume bug)
            logger.warning("resumed at step %d >= max_steps: nothing to do", self.start_step)
        try:
            if self.start_step == 0 and cfg.data.eval_size > 0:
                before = self.evaluate()
                acc_before = before["eval/accuracy"]
                log.log_eval(0, before)
            while step < run.max_steps and self._stop_signal is None:
                step += 1
                metrics = self.train_step(step, log)
                last = step == run.max_steps
                if cfg.data.eval_size > 0 and (
                    last or (run.eval_every and step % run.eval_every == 0)
                ):
                    metrics.update(self.evaluate())
                    acc_after = metrics["eval/accuracy"] if last else None
                log.log_step(step, metrics)
                if last or (run.save_every and step % run.save_every == 0):
                    last_ckpt = self.save(step)
            if self._stop_signal is not None and last_ckpt != checkpoint_path(self.run_dir, step):
                log.write(f"signal {self._stop_signal}: saving step {step} and stopping")
                last_ckpt = self.save(step)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            log.close()
        interrupted = self._stop_signal is not None
        wall = time.perf_counter() - t0
        return TrainResult(self.run_dir, step, acc_before, acc_after, wall, interrupted, last_ckpt)

    def train_step(self, step: int, log: RunLogger) -> dict[str, float]:
        """Run one step (generate, score, advantages, update, sync) and return its metrics."""
        cfg, a, m = self.cfg, self.cfg.algorithm, {}
        times: dict[str, float] = defaultdict(float)
        # (1)-(3) Prompts -> a group of completions each -> scores. DAPO dynamic sampling
        # (arXiv:2503.14476, 3.2) drops groups whose rewards all agree and refills the batch from
        # the next prompts, for at most `dynamic_sampling_rounds` extra rounds.
        sampled = self.collect(cfg.rollout.prompts_per_step, step, 0, times)
        groups = sampled
        if a.dynamic_sampling:
            groups, rounds = [g for g in sampled if g.informative], 0
            while len(groups) < cfg.rollout.prompts_per_step and rounds < a.dynamic_sampling_rounds:
                rounds += 1
                more = self.collect(cfg.rollout.prompts_per_step - len(groups), step, rounds, times)
                sampled, groups = sampled + more, groups + [g for g in more if g.informative]
            m.update({"dynamic/groups_kept": float(len(groups)), "dynamic/rounds": float(rounds)})
        m.update(rollout_metrics(sampled, self.env_names))

        # (4)-(5) Group-relative advantages, then the clipped policy-gradient updates.
        t = time.perf_counter()
        advantages = torch.zeros(0, cfg.rollout.num_generations)
        if groups:
            rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float64)  # (P, G)
            advantages = compute_advantages(rewards, a.advantage_estimator, a.scale_rewards)
            m.update(self.update(groups, advantages.flatten()))
        else:
            logger.warning("step %d: every group had equal rewards; no update", step)
        times["train"] = time.perf_counter() - t

        # (6) Push the new weights into the rollout engine.
        t = time.perf_counter()
        self.engine.sync_weights(self.model)
        times["sync"] = time.perf_counter() - t

        # (7) Time split, throughput, memory, sample completions.
        total = sum(times.values())
        new_tokens = sum(len(c.token_ids) for g in sampled for c in g.completions)
        m.update({f"time/{k}": v for k, v in times.items()})
        m.update({"time/step": total, "tokens_per_s": new_tokens / max(total, 1e-9)})
        m.update({"memory/peak_mb": peak_memory_mb(), "lr": self.scheduler.get_last_lr()[0]})
        if cfg.run.log_every_samples and step % cfg.run.log_every_samples == 0 and groups:
            name = self.env_names[groups[0].env_index]
            log.log_samples(sample_records(step, groups[0], name, advantages[0].tolist()))
        return m

    def collect(
        self, n_prompts: int, step: int, round_: int, times: dict[str, float]
    ) -> list[Group]:
        """Draw ``n_prompts`` prompts, generate ``num_generations`` completions each, score them."""
        cfg, groups = self.cfg, []
        for _ in range(n_prompts):
            env_index, row = self.sampler.next()
            sample = Sample.from_row(self.train_rows[env_index][row])
            ids, cut = encode_prompt(self.tokenizer, sample, cfg.data.max_prompt_length)
            if cut:
                logger.warning(
                    "prompt %s is longer than max_prompt_length=%d tokens: kept its last tokens",
                    sample.id,
                    cfg.data.max_prompt_length,
                )
            groups.append(Group(sample, env_index, ids))
        t = time.perf_counter()
        # A seed per (step, round) makes sampling independent of the past: resume is exact.
        sampling = SamplingConfig(
            n=cfg.rollout.num_generations,
            max_new_tokens=cfg.rollout.max_completion_length,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            seed=cfg.run.seed * 1_000_003 + step * 101 + round_,
        )
        for g, completions in zip(
            groups, self.engine.generate([g.prompt_ids for g in groups], sampling)
        ):
            g.completions = completions
        times["generate"] += time.perf_counter() - t
        t = time.perf_counter()
        for index, env in enumerate(self.envs):
            mine = [g for g in groups if g.env_index == index]
            texts = [c.text for g in mine for c in g.completions]
            scores = safe_scores(env, texts, [g.sample for g in mine for _ in g.completions])
            for k, g in enumerate(mine):
                g.scores = scores[k * len(g.completions) : (k + 1) * len(g.completions)]
        times["score"] += time.perf_counter() - t
        return groups

    def update(self, groups: list[Group], advantages: torch.Tensor) -> dict[str, float]:
        """Run ``mu`` clipped policy-gradient updates on the groups' completions; return metrics."""
        cfg, a = self.cfg, self.cfg.algorithm
        rows = [(g.prompt_ids, c) for g in groups for c in g.completions]
        batches = make_micro_batches(
            [p for p, _ in rows],
            [list(c.token_ids) for _, c in rows],
            cfg.optim.micro_batch_tokens,
            self.tokenizer.pad_token_id,
        )
        # DAPO overlong filtering: truncated completions get no loss (their reward is unreliable).
        keep = torch.tensor([0.0 if a.mask_truncated and c.truncated else 1.0 for _, c in rows])
        total_tokens = int(sum(len(c.token_ids) * float(keep[i]) for i, (_, c) in enumerate(rows)))
        old: dict[int, torch.Tensor] = {}  # micro-batch -> trainer logprobs before any update
        sums, loss_total, grad_norm = MetricSums(), 0.0, 0.0
        self.model.train()
        for iteration in range(a.mu):
            loss_total = 0.0
            for k, mb in enumerate(batches):
                mask = mb.completion_mask.float() * keep[list(mb.rows)].unsqueeze(1)  # (B, C)
                tokens = float(mask.sum())
                first = iteration == 0
                logprobs, entropy = token_logprobs(
                    self.model, mb, cfg.rollout.temperature, with_entropy=first
                )
                if first:  # before the first update the current policy is the "old" one
                    old[k] = logprobs.detach()
                if entropy is not None:
                    sums.add({"entropy": float((entropy * mask).sum() / max(tokens, 1.0))}, tokens)
                ref, weights = None, None
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref = token_logprobs(self.ref_model, mb, cfg.rollout.temperature)[0]
                if a.is_correction:
                    sampled = pad_rows([rows[i][1].logprobs for i in mb.rows], mask.shape[1])
                    weights, is_metrics = truncated_is_weights(old[k], sampled, mask, a.is_cap)
                    if first:
                        sums.add(is_metrics, tokens)
                loss, metrics = grpo_loss(
                    logprobs,
                    old[k],
                    advantages[list(mb.rows)],
                    mask,
                    ref_logprobs=ref,
                    beta=a.beta,
                    epsilon_low=a.epsilon_low,
                    epsilon_high=a.epsilon_high,
                    loss_type=a.loss_type,
                    max_completion_length=cfg.rollout.max_completion_length,
                    importance_weights=weights,
                )
                # Each micro-batch's loss is a mean over its own tokens/sequences; weighting by
                # its share makes the accumulated gradient that of the whole batch.
                share = loss_share(a.loss_type, mask, total_tokens, len(rows))
                (loss * share).backward()
                loss_total += float(loss.detach()) * share
                if iteration == a.mu - 1:
                    sums.add(metrics, tokens)
            grad_norm = self.optimizer_step(loss_total)
        return {**sums.result(), "loss": loss_total, "grad_norm": grad_norm}

    def optimizer_step(self, loss: float) -> float:
        """Clip and step; skip (and count) an update whose loss or gradient is not finite."""
        max_norm = self.cfg.optim.max_grad_norm or float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            self._bad_updates = 0
        else:
            self._bad_updates += 1
            logger.warning(
                "non-finite loss (%s) or grad norm (%s): update skipped (%d in a row)",
                loss,
                grad_norm,
                self._bad_updates,
            )
        self.optimizer.zero_grad(set_to_none=True)
        if self._bad_updates >= self.cfg.run.max_bad_steps:
            raise TrainingAborted(
                f"{self._bad_updates} updates in a row had a non-finite loss or gradient; stopped "
                f"with the last good checkpoint {latest_checkpoint(self.run_dir)} intact. "
                "Try a lower learning_rate, dtype=float32, or a smaller max_grad_norm."
            )
        return grad_norm

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy, greedy, on the first ``eval_size`` rows of each environment."""
        cfg, out, correct, total = self.cfg, {}, 0, 0
        greedy = SamplingConfig(
            n=1, max_new_tokens=cfg.rollout.max_completion_length, temperature=0.0
        )
        for env, name in zip(self.envs, self.env_names):
            rows = env.dataset(cfg.data.eval_split)
            samples = [Sample.from_row(rows[i]) for i in range(min(cfg.data.eval_size, len(rows)))]
            prompts = [
                encode_prompt(self.tokenizer, s, cfg.data.max_prompt_length)[0] for s in samples
            ]
            texts = [group[0].text for group in self.engine.generate(prompts, greedy)]
            hits = sum(s.correct for s in safe_scores(env, texts, samples))
            out[f"eval/accuracy/{name}"] = hits / max(len(samples), 1)
            correct, total = correct + hits, total + len(samples)
        out["eval/accuracy"] = correct / max(total, 1)
        return out

    def save(self, step: int) -> Path:
        """Checkpoint the current state (model, optimizer, scheduler, RNG, data position)."""
        return save_checkpoint(
            self.run_dir,
            step,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            sampler=self.sampler.state(),
            config=self.cfg,
            keep_last=self.cfg.run.keep_last,
        )

    def close(self) -> None:
        """Free the rollout engine."""
        self.engine.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """First Ctrl-C / SIGTERM: finish the step, save, stop. A second one: stop at once."""
        if self._stop_signal is not None:
            raise KeyboardInterrupt
        self._stop_signal = signum
