"""The GRPO training loop, readable top to bottom.

Each step: (1) sample prompts -> (2) generate a group of completions per prompt with the rollout
engine -> (3) score them with the environment -> (4) group-relative advantages -> (5) clipped
policy-gradient updates (mu of them, micro-batched) -> (6) sync the new weights into the engine ->
(7) log, evaluate, checkpoint. The math lives in ``advantages.py`` and ``loss.py``; run management
in ``checkpoint.py`` and ``logging.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import random
import signal
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import numpy as np
import torch

from grpo_envs.base import Environment
from grpo_envs.types import Outcome, Sample, Score
from grpo_train.advantages import compute_advantages, group_stats, informative_groups
from grpo_train.checkpoint import (
    MODEL_DIR,
    SamplerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from grpo_train.config import TrainConfig
from grpo_train.logging import RunLogger, SampleRecord, logger, peak_memory_mb
from grpo_train.loss import grpo_loss, loss_share, make_micro_batches, token_logprobs, truncated_is_weights
from grpo_train.rollout.base import Completion, RolloutEngine, SamplingConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TrainingAborted(RuntimeError):
    """Too many consecutive steps had a NaN/inf loss or gradient; the last good checkpoint stays."""


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


@dataclass
class Group:
    """One prompt and its scored completions."""

    sample: Sample
    env_index: int
    prompt_ids: list[int]
    completions: list[Completion]
    scores: list[Score] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        """The reward of each completion."""
        return [s.reward for s in self.scores]


class PromptSampler:
    """Deterministic, resumable prompt order over one or more weighted environments.

    The k-th draw picks an environment from ``Random(seed, k)`` by weight, then the environment's
    next row in a permutation reshuffled every epoch from ``(seed, epoch)``. Its whole state is two
    counters, saved in checkpoints.
    """

    def __init__(self, sizes: Sequence[int], weights: Sequence[float], seed: int, state: SamplerState | None = None):
        self.sizes, self.weights, self.seed = list(sizes), list(weights), seed
        state = state or SamplerState(0, tuple(0 for _ in sizes))
        self.draws, self.positions = state.draws, list(state.positions)

    def next(self) -> tuple[int, int]:
        """The next (environment index, row index)."""
        env = random.Random(self.seed * 1_000_003 + self.draws).choices(range(len(self.sizes)), self.weights)[0]
        epoch, offset = divmod(self.positions[env], self.sizes[env])
        order = np.random.default_rng([self.seed, env, epoch]).permutation(self.sizes[env])
        self.draws += 1
        self.positions[env] += 1
        return env, int(order[offset])

    def state(self) -> SamplerState:
        """The counters to save."""
        return SamplerState(self.draws, tuple(self.positions))


def encode_prompt(tokenizer: PreTrainedTokenizerBase, sample: Sample, max_len: int) -> tuple[list[int], bool]:
    """Chat-template token ids of a prompt, keeping the last ``max_len``; and whether it was cut."""
    text = tokenizer.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return (ids[-max_len:], True) if len(ids) > max_len else (ids, False)


def safe_scores(env: Environment, texts: Sequence[str], samples: Sequence[Sample]) -> list[Score]:
    """Score completions; any failure or malformed reward becomes reward 0 with outcome ``error``."""
    try:
        scores = env.score_batch(list(texts), list(samples))
    except Exception as exc:  # the contract says it never raises; guard the run anyway
        scores = [Score.failure(Outcome.ERROR, f"score_batch raised {type(exc).__name__}: {exc}")] * len(texts)
    if len(scores) != len(texts):
        scores = [Score.failure(Outcome.ERROR, f"score_batch returned {len(scores)} scores")] * len(texts)
    return [
        s if isinstance(s, Score) and math.isfinite(s.reward) else Score.failure(Outcome.ERROR, f"malformed score {s!r}")
        for s in scores
    ]


def build_engine(config: TrainConfig, model_path: str, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> RolloutEngine:
    """The configured rollout engine (``auto``: vLLM when importable, else HF generate).

    The HF engine shares the trainer's module, so its weight sync is free; vLLM loads
    ``model_path`` and receives new weights through ``sync_weights`` after each update.
    """
    name = config.rollout.engine
    if name == "auto":
        name = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if name == "hf":
        from grpo_train.rollout.hf import HFEngine

        return HFEngine(model, tokenizer)
    from grpo_train.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        model_path,
        dtype=config.policy.dtype,
        seed=config.run.seed,
        max_model_len=config.data.max_prompt_length + config.rollout.max_completion_length,
        gpu_memory_utilization=config.rollout.vllm_memory_fraction,
    )


class Trainer:
    """GRPO on one or more environments. ``Trainer(config).train()`` runs the whole thing.

    ``env`` and ``engine`` may be injected (tests, custom environments); otherwise they are built
    from ``config`` (``grpo_envs.make`` per ``config.data.env`` entry, ``rollout.make_engine``).
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
        self.weights = [e.weight for e in cfg.data.env] if len(cfg.data.env) == len(self.envs) else [1.0] * len(self.envs)
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
        # The KL reference is the initial policy, and only exists when it is used (beta > 0).
        self.ref_model = None
        if cfg.algorithm.beta > 0:
            self.ref_model = load_policy(base_model, cfg.policy.dtype, self.device)[0].eval().requires_grad_(False)
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2), weight_decay=o.weight_decay,
        )
        updates = max(1, cfg.run.max_steps * cfg.algorithm.mu)
        schedule = "constant_with_warmup" if o.lr_scheduler == "constant" else o.lr_scheduler
        self.scheduler = get_scheduler(schedule, self.optimizer, num_warmup_steps=o.warmup_steps, num_training_steps=updates)
        self.start_step, sampler_state = 0, None
        if self.resume_from:
            resumed = load_checkpoint(self.resume_from, optimizer=self.optimizer, scheduler=self.scheduler)
            self.start_step, sampler_state = resumed.step, resumed.sampler
        self.sampler = PromptSampler([len(r) for r in self.train_rows], self.weights, cfg.run.seed, sampler_state)
        self.engine = engine if engine is not None else build_engine(cfg, model_path, self.model, self.tokenizer)
        self._stop_signal: int | None = None
        self._bad_steps = 0

    def _resume_path(self) -> Path | None:
        resume = self.cfg.run.resume
        if not resume:
            return None
        path = latest_checkpoint(self.run_dir) if resume == "latest" else Path(resume)
        if path is None:
            logger.warning("resume=latest but %s has no checkpoint; starting from scratch", self.run_dir)
        return path

    # ----------------------------------------------------------------------------------- loop

    def train(self) -> TrainResult:
        """Run ``max_steps`` steps (from the resumed step), evaluating before and after."""
        cfg, t0 = self.cfg, time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg.save(self.run_dir / "config.yaml")
        log = RunLogger(self.run_dir, cfg, start_step=self.start_step)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        step, last_ckpt, acc_before, acc_after = self.start_step, None, None, None
        try:
            if self.start_step == 0 and cfg.data.eval_size > 0:
                before = self.evaluate()
                acc_before = before["eval/accuracy"]
                log.log_eval(0, before)
            while step < cfg.run.max_steps and self._stop_signal is None:
                step += 1
                metrics = self.train_step(step, log)
                if cfg.run.eval_every and step % cfg.run.eval_every == 0 and step < cfg.run.max_steps:
                    metrics.update(self.evaluate())
                if step == cfg.run.max_steps and cfg.data.eval_size > 0:
                    metrics.update(self.evaluate())
                    acc_after = metrics["eval/accuracy"]
                log.log_step(step, metrics)
                if (cfg.run.save_every and step % cfg.run.save_every == 0) or step == cfg.run.max_steps:
                    last_ckpt = self.save(step)
            if self._stop_signal is not None:
                log.write(f"signal {self._stop_signal} received: saving step {step} and stopping")
                last_ckpt = self.save(step)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            log.close()
        wall = time.perf_counter() - t0
        return TrainResult(self.run_dir, step, acc_before, acc_after, wall, self._stop_signal is not None, last_ckpt)

    def train_step(self, step: int, log: RunLogger) -> dict[str, float]:
        """One step: generate, score, compute advantages, update, sync; returns its metrics."""
        cfg, m = self.cfg, {}
        times: dict[str, float] = defaultdict(float)
        # (1)-(3) Sample prompts, generate a group for each, score; DAPO dynamic sampling drops
        # groups whose rewards all agree and refills from the next prompts (bounded rounds).
        groups = self.collect(cfg.rollout.prompts_per_step, step, 0, times)
        all_groups, rounds = list(groups), 0
        if cfg.algorithm.dynamic_sampling:
            groups = [g for g in groups if len(set(g.rewards)) > 1]
            while len(groups) < cfg.rollout.prompts_per_step and rounds < cfg.algorithm.dynamic_sampling_rounds:
                rounds += 1
                more = self.collect(cfg.rollout.prompts_per_step - len(groups), step, rounds, times)
                all_groups += more
                groups += [g for g in more if len(set(g.rewards)) > 1]
            m.update({"dynamic/groups_kept": len(groups), "dynamic/rounds": rounds})
        m.update(self.rollout_metrics(all_groups))

        # (4) Group-relative advantages.
        t = time.perf_counter()
        if groups:
            rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float64)  # (P, G)
            adv = compute_advantages(rewards, cfg.algorithm.advantage_estimator, cfg.algorithm.scale_rewards)
            m.update(self.update(groups, adv.flatten()))
        else:
            logger.warning("step %d: every group had equal rewards; no update this step", step)
        times["train"] += time.perf_counter() - t

        # (6) Push the new weights into the rollout engine.
        t = time.perf_counter()
        self.engine.sync_weights(self.model)
        times["sync"] = time.perf_counter() - t

        # (7) Timing, throughput, memory, samples.
        total = sum(times.values())
        new_tokens = sum(len(c.token_ids) for g in all_groups for c in g.completions)
        m.update({f"time/{k}": v for k, v in times.items()})
        m.update({"time/step": total, "tokens_per_s": new_tokens / max(total, 1e-9), "memory/peak_mb": peak_memory_mb()})
        m["lr"] = self.scheduler.get_last_lr()[0]
        if cfg.run.log_every_samples and step % cfg.run.log_every_samples == 0 and groups:
            log.log_samples(self.sample_records(step, groups[0], adv[0].tolist() if groups else []))
        return m

    def collect(self, n_prompts: int, step: int, round_: int, times: dict[str, float]) -> list[Group]:
        """Draw ``n_prompts`` prompts, generate ``num_generations`` completions each, score them."""
        cfg = self.cfg
        groups = []
        for _ in range(n_prompts):
            env_index, row = self.sampler.next()
            sample = Sample.from_row(self.train_rows[env_index][row])
            ids, cut = encode_prompt(self.tokenizer, sample, cfg.data.max_prompt_length)
            if cut:
                logger.warning("prompt %s is longer than max_prompt_length=%d tokens: kept its end", sample.id, cfg.data.max_prompt_length)
            groups.append(Group(sample, env_index, ids, []))
        t = time.perf_counter()
        # A seed per (step, round) makes sampling independent of everything before it: exact resume.
        sampling = SamplingConfig(
            n=cfg.rollout.num_generations, max_new_tokens=cfg.rollout.max_completion_length,
            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            seed=cfg.run.seed * 1_000_003 + step * 101 + round_,
        )
        outputs = self.engine.generate([g.prompt_ids for g in groups], sampling)
        times["generate"] += time.perf_counter() - t
        t = time.perf_counter()
        for g, completions in zip(groups, outputs):
            g.completions = completions
        for index, env in enumerate(self.envs):
            mine = [g for g in groups if g.env_index == index]
            texts = [c.text for g in mine for c in g.completions]
            scores = safe_scores(env, texts, [g.sample for g in mine for _ in g.completions])
            for k, g in enumerate(mine):
                g.scores = scores[k * len(g.completions) : (k + 1) * len(g.completions)]
        times["score"] += time.perf_counter() - t
        return groups

    def update(self, groups: list[Group], advantages: torch.Tensor) -> dict[str, float]:
        """(5) ``mu`` clipped policy-gradient updates on the groups' completions; returns metrics."""
        cfg, a = self.cfg, self.cfg.algorithm
        rows = [(g.prompt_ids, c) for g in groups for c in g.completions]
        batches = make_micro_batches(
            [p for p, _ in rows], [list(c.token_ids) for _, c in rows], cfg.optim.micro_batch_tokens, self.tokenizer.pad_token_id
        )
        keep = torch.tensor([0.0 if (a.mask_truncated and c.truncated) else 1.0 for _, c in rows])
        total_tokens = int(sum(len(c.token_ids) * keep[i] for i, (_, c) in enumerate(rows)))
        old: dict[int, torch.Tensor] = {}  # micro-batch -> trainer logprobs before the first update
        sums: dict[str, float] = defaultdict(float)
        self.model.train()
        for iteration in range(a.mu):
            loss_total = 0.0
            for k, mb in enumerate(batches):
                mask = mb.completion_mask.float() * keep[list(mb.rows)].unsqueeze(1)  # (B, C)
                logprobs, entropy = token_logprobs(self.model, mb, cfg.rollout.temperature, with_entropy=iteration == 0)
                if iteration == 0:  # before any update the current policy is the "old" one
                    old[k] = logprobs.detach()
                ref = None
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref = token_logprobs(self.ref_model, mb, cfg.rollout.temperature)[0]
                weights = None
                if a.is_correction:
                    sampled = _pad_logprobs([rows[i][1].logprobs for i in mb.rows], mask.shape[1])
                    weights, is_metrics = truncated_is_weights(old[k], sampled, mask, a.is_cap)
                    if iteration == 0:
                        _accumulate(sums, is_metrics, mask)
                loss, metrics = grpo_loss(
                    logprobs, old[k], advantages[list(mb.rows)], mask, ref_logprobs=ref, beta=a.beta,
                    epsilon_low=a.epsilon_low, epsilon_high=a.epsilon_high, loss_type=a.loss_type,
                    max_completion_length=cfg.rollout.max_completion_length, importance_weights=weights,
                )
                share = loss_share(a.loss_type, mask, total_tokens, len(rows))
                (loss * share).backward()
                loss_total += float(loss.detach()) * share
                if iteration == a.mu - 1:
                    _accumulate(sums, metrics, mask)
                if entropy is not None:
                    _accumulate(sums, {"entropy": float((entropy * mask).sum() / mask.sum().clamp(min=1))}, mask)
            grad_norm = self.optimizer_step(loss_total)
        out = {k: v / max(sums["_tokens_" + k], 1.0) for k, v in sums.items() if not k.startswith("_")}
        out.update({"loss": loss_total, "grad_norm": grad_norm})
        return out

    def optimizer_step(self, loss: float) -> float:
        """Clip, check for NaN/inf, step; skip the update (and count it) when anything is non-finite."""
        max_norm = self.cfg.optim.max_grad_norm or float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            self._bad_steps = 0
        else:
            self._bad_steps += 1
            logger.warning("non-finite loss (%s) or grad norm (%s): update skipped (%d in a row)", loss, grad_norm, self._bad_steps)
            if self._bad_steps >= self.cfg.run.max_bad_steps:
                self.optimizer.zero_grad(set_to_none=True)
                raise TrainingAborted(
                    f"{self._bad_steps} updates in a row had a non-finite loss or gradient; stopped. The last good "
                    f"checkpoint is {latest_checkpoint(self.run_dir)}. Try a lower learning_rate or dtype=float32."
                )
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # ------------------------------------------------------------------------- evaluation, io

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy with greedy decoding on the first ``eval_size`` rows of each env."""
        cfg, out, correct, total = self.cfg, {}, 0, 0
        greedy = SamplingConfig(n=1, max_new_tokens=cfg.rollout.max_completion_length, temperature=0.0, seed=0)
        for env in self.envs:
            rows = env.dataset(cfg.data.eval_split)
            samples = [Sample.from_row(rows[i]) for i in range(min(cfg.data.eval_size, len(rows)))]
            prompts = [encode_prompt(self.tokenizer, s, cfg.data.max_prompt_length)[0] for s in samples]
            texts = [group[0].text for group in self.engine.generate(prompts, greedy)]
            hits = sum(s.correct for s in safe_scores(env, texts, samples))
            out[f"eval/accuracy/{env.env_id or type(env).__name__}"] = hits / max(len(samples), 1)
            correct, total = correct + hits, total + len(samples)
        out["eval/accuracy"] = correct / max(total, 1)
        return out

    def rollout_metrics(self, groups: list[Group]) -> dict[str, float]:
        """Reward (overall, per component, per env), accuracy, group and length statistics."""
        m: dict[str, float] = {}
        stats = group_stats(torch.tensor([g.rewards for g in groups], dtype=torch.float64))
        m.update({"reward/mean": stats.reward_mean, "reward/std": stats.reward_std,
                  "group/reward_std": stats.group_std_mean, "group/frac_zero_std": stats.frac_zero_std})
        scores = [s for g in groups for s in g.scores]
        m["accuracy"] = sum(s.correct for s in scores) / len(scores)
        m["score/errors"] = sum(s.outcome is Outcome.ERROR for s in scores)
        components: dict[str, list[float]] = defaultdict(list)
        per_env: dict[str, list[float]] = defaultdict(list)
        for g in groups:
            name = self.envs[g.env_index].env_id or type(self.envs[g.env_index]).__name__
            per_env[name] += g.rewards
            for s in g.scores:
                for comp in s.components:
                    components[comp.name].append(comp.value)
        m.update({f"reward/component/{k}": sum(v) / len(v) for k, v in components.items()})
        m.update({f"reward/env/{k}": sum(v) / len(v) for k, v in per_env.items()})
        lengths = [len(c.token_ids) for g in groups for c in g.completions]
        m.update({"length/mean": sum(lengths) / len(lengths), "length/max": max(lengths),
                  "length/clipped_frac": sum(c.truncated for g in groups for c in g.completions) / len(lengths)})
        return m

    def sample_records(self, step: int, group: Group, advantages: list[float]) -> list[SampleRecord]:
        """The completions of one group, for ``samples.jsonl``."""
        prompt = group.sample.prompt[-1].content
        env_id = self.envs[group.env_index].env_id
        return [
            SampleRecord(step, env_id, group.sample.id, prompt, c.text, s.reward, s.outcome.value, adv, c.finish_reason)
            for c, s, adv in zip(group.completions, group.scores, advantages)
        ]

    def save(self, step: int) -> Path:
        """Checkpoint the current state (model, optimizer, scheduler, RNG, data position)."""
        return save_checkpoint(
            self.run_dir, step, model=self.model, tokenizer=self.tokenizer, optimizer=self.optimizer,
            scheduler=self.scheduler, sampler=self.sampler.state(), config=self.cfg, keep_last=self.cfg.run.keep_last,
        )

    def close(self) -> None:
        """Free the rollout engine."""
        self.engine.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_signal is not None:  # a second Ctrl-C: stop now, without saving
            raise KeyboardInterrupt
        self._stop_signal = signum


def _pad_logprobs(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """Sampling logprobs as a (B, width) tensor, zero-padded (the mask hides the padding)."""
    out = torch.zeros((len(rows), width))
    for b, lp in enumerate(rows):
        out[b, : len(lp)] = torch.tensor(list(lp), dtype=torch.float32)
    return out


def _accumulate(sums: dict[str, float], metrics: dict[str, float], mask: torch.Tensor) -> None:
    """Token-weighted running sums of per-micro-batch metrics (divided out in ``update``)."""
    tokens = float(mask.sum())
    for k, v in metrics.items():
        sums[k] += v * tokens
        sums["_tokens_" + k] += tokens
