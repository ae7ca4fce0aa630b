"""Rollout collection: one rank's share of a step's prompts, generated and scored.

``Collector.sample_batch`` is steps (1)-(3) of the GRPO step (``trainer.py``): draw prompts
from ``TrainingPrompts`` (the sampler's order over each environment's current curriculum
stage), encode them (``episodes.prompts.encode_prompt``), generate ``num_generations``
completions each with the rollout engine, score them through the one guard
(``grpo_envs.wrappers.guarded_scores``; each prompt's group as soon as the engine reports it,
while the rest generates: ``scoring.ScoringStage``), refill with DAPO dynamic sampling when
asked, and build the immutable ``RolloutBatch`` the update reads, with the step's rollout
metrics. A step whose scorer looks broken (too many failed scores) stops the run
(``TrainingAborted``). Multi-turn steps collect episodes instead (``episodes``), unchanged by
``overlap_scoring``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from grpo_envs.types import Sample
from grpo_train.collect.batch import RolloutBatch
from grpo_train.collect.episodes import collect_episode_groups, episode_metrics, is_multi_turn
from grpo_train.collect.groups import MIN_SCORED, Group
from grpo_train.collect.metrics import RemoteSandboxCounts, rollout_metrics
from grpo_train.collect.score_failures import ScoreErrors
from grpo_train.collect.scoring import ScoringStage
from grpo_train.collect.training_prompts import TrainingPrompts
from grpo_train.episodes.driver import EpisodeRenderer
from grpo_train.episodes.prompts import PromptFormat, encode_prompt
from grpo_train.episodes.reply_render import HistoryPolicy
from grpo_train.parallel import distributed
from grpo_train.rollout.base import Completion, GroupDone, RolloutEngine, SamplingConfig
from grpo_train.run.checkpoint import latest_checkpoint
from grpo_train.run.run_log import logger
from grpo_train.run.stop import TrainingAborted, pause_point

#: Seeds of a step's first generation round: ``run seed x RUN_STRIDE + step x STEP_STRIDE``.
RUN_STRIDE, STEP_STRIDE = 1_000_003, 101


def call_seed(run_seed: int, step: int, round_: int, width: int) -> int:
    """Return the base seed of a generation call; completion i of it takes base + i.

    Engines seed completion ``i`` of a call with ``base + i`` (vLLM: one generator per request
    and child), so two calls whose ranges ``[base, base + width)`` overlap would draw the same
    random numbers for different completions: correlated samples, and less exploration, where
    each step should draw fresh ones. A step's first round keeps the original stride (``run
    seed x 1,000,003 + step x 101``: runs and references made with it sample as before) while
    its completions fit in 101 seeds; wider steps (e.g. 16 prompts x 8) and dynamic sampling's
    refill rounds (whose ``+ round`` once shifted round 0's streams by one completion) draw a
    base from a hash of (run seed, step, round) in ``[2^61, 2^62)``, above every original seed,
    where two calls' ranges meet with negligible probability.

    >>> call_seed(3, 5, 0, 32) == 3 * 1_000_003 + 5 * 101
    True
    >>> wide = [call_seed(0, step, 0, 128) for step in range(3)]
    >>> min(abs(a - b) for a in wide for b in wide if a != b) > 128
    True
    >>> call_seed(0, 1, 1, 32) >= 2**61 and call_seed(0, 1, 1, 32) != call_seed(0, 1, 2, 32)
    True
    """
    if round_ == 0 and width <= STEP_STRIDE:
        return run_seed * RUN_STRIDE + step * STEP_STRIDE
    import numpy as np

    entropy = [run_seed % 2**64, step, round_]  # SeedSequence takes non-negative words
    words = np.random.SeedSequence(entropy).generate_state(1, np.uint64)
    return (1 << 61) | (int(words[0]) & ((1 << 61) - 1))


@dataclass(frozen=True)
class CollectorSettings:
    """What a step's collection reads of the run's configuration (``setup.settings`` builds it)."""

    prompts_per_step: int
    num_generations: int
    """Completions per prompt (the group size)."""
    max_prompt_length: int
    """Prompt tokens kept (the last ones) after the chat template."""
    max_completion_length: int
    """Tokens per completion; a multi-turn episode's whole budget."""
    max_turn_tokens: int
    """Multi-turn: tokens one model turn may sample (0: ``max_completion_length``)."""
    temperature: float
    top_p: float
    seed: int
    """The run's seed: each generation call's seed derives from it (``call_seed``)."""
    seed_per_prompt: bool
    """Seed each prompt's group with its own seed (split-independent sampling)."""
    tensor_parallel: int
    """Ranks per colocated engine (they generate their prompts together)."""
    history_policy: Literal["keep", "rerender"]
    """Multi-turn: what the model is shown at a later turn (``reply_render.HistoryPolicy``)."""
    fatal_template_breaks: bool
    """Multi-turn: a reply the chat template cannot render stops the run (else a warning)."""
    dynamic_sampling_rounds: int
    """DAPO dynamic sampling: extra generation rounds a step may draw."""
    curriculum_threshold: float
    """The training accuracy a curriculum stage moves up at (said in the log)."""
    max_reward_errors: float
    """The share of failed scores above which the scorer looks broken (the run stops)."""
    overlap_scoring: bool
    """Score each prompt's group as soon as the engine reports it done, while the rest still
    generates (``scoring.ScoringStage``); False: score the whole batch after generation."""


class Collector:
    """Draws, generates and scores a step's rollouts (this rank's share of them).

    Every rank holds the same sampler and draws the same prompts; ``rank`` picks this rank's
    contiguous share; counts are summed and statistics gathered over ranks
    (``distributed.global_sum`` / ``gather_objects``, collectives that cost nothing on one
    process).
    """

    def __init__(
        self,
        settings: CollectorSettings,
        prompts: TrainingPrompts,
        engine: RolloutEngine,
        tokenizer: Any,
        prompt_format: PromptFormat,
        rank: distributed.RankInfo,
        run_dir: Path,
    ) -> None:
        self.settings, self.prompts, self.env_names = settings, prompts, prompts.names
        self.engine = engine
        self.tokenizer, self.prompt_format = tokenizer, prompt_format
        self.rank, self.run_dir = rank, run_dir
        self.sandbox_counts = RemoteSandboxCounts()
        self.score_overlapped_s = 0.0
        """Scoring seconds of the current step that ran while generation was still going."""
        if any(is_multi_turn(env) for env in prompts.envs):
            # The chat template must extend episodes: refused here, before any generation.
            renderer = EpisodeRenderer(tokenizer, prompt_format)
            described = renderer.check()
            if described and rank.is_main:
                logger.info(
                    "multi-turn: %s; history policy %s",
                    described,
                    settings.history_policy,
                )

    def sample_batch(
        self, step: int, times: dict[str, float], dynamic_sampling: bool = False
    ) -> tuple[RolloutBatch, list[Group], dict[str, float]]:
        """Collect this rank's rollout batch; return it, every group sampled, and batch metrics.

        DAPO dynamic sampling (arXiv:2503.14476, 3.2) drops groups whose rewards all agree and
        refills the batch from the next prompts, for at most ``dynamic_sampling_rounds`` extra
        rounds. Every rank draws the same prompts and keeps its share, so counts are global sums.
        ``dynamic_sampling``: whether this step does (``learning_signal.AutoHeuristics`` decides:
        ``dynamic_sampling=on``, or ``auto`` once the learning-signal guard fired).
        """
        settings, m = self.settings, {}
        p_step = settings.prompts_per_step
        self.score_overlapped_s = 0.0
        sampled = self.collect(p_step, step, 0, times)
        groups, padding = sampled, False
        if dynamic_sampling:
            groups, rounds = [g for g in sampled if g.informative], 0
            kept = int(distributed.global_sum(len(groups))[0])
            while kept < p_step and rounds < settings.dynamic_sampling_rounds:
                rounds += 1
                more = self.collect(p_step - kept, step, rounds, times)
                sampled, groups = sampled + more, groups + [g for g in more if g.informative]
                kept = int(distributed.global_sum(len(groups))[0])
            m.update({"dynamic/groups_kept": float(kept), "dynamic/rounds": float(rounds)})
            if not groups and kept > 0 and sampled:
                # Every rank must run the same number of backward passes (DDP collectives):
                # a rank with nothing left trains on one dropped group with zero loss weight.
                groups, padding = [sampled[0]], True
        # Statistics describe the whole step's batch: every rank's groups, as one process.
        everything = distributed.gather_objects(sampled)
        m.update(rollout_metrics(everything, self.env_names))
        m.update(self.sandbox_counts.step_metrics())
        m.update(episode_metrics(everything))
        self._check_scores(step, everything)
        curriculum, moved = self.prompts.record(everything)
        m.update(curriculum)
        for where in moved if self.rank.is_main else ():
            threshold = settings.curriculum_threshold
            logger.info("curriculum: %s (training accuracy reached %g)", where, threshold)
        batch = RolloutBatch.from_groups(groups, settings.num_generations, padding)
        # Not a phase of the step (``times``): seconds of scoring hidden under "generate".
        m["time/score_overlapped"] = self.score_overlapped_s
        return batch, sampled, m

    def _check_scores(self, step: int, groups: Sequence[Group]) -> None:
        """Warn about failed scores (counts, first error); stop when the scorer looks broken.

        ``groups``: the whole step's batch (every rank's), so every rank decides the same.
        """
        errors = ScoreErrors.of(s for g in groups for s in g.scores)
        if not errors.failed:
            return
        dropped = sum(g.dropped for g in groups)
        limit = self.settings.max_reward_errors
        if errors.fraction > limit:
            last = latest_checkpoint(self.run_dir)
            raise TrainingAborted(
                f"step {step}: {errors.describe()}; above max_reward_errors={limit:g}, so the "
                "scorer looks broken and the step was not trained on. Fix the environment "
                "(`grpo envs score` scores a JSONL file of completions) or raise "
                "max_reward_errors; "
                + (f"resume from {last} with --resume" if last else "no checkpoint was written")
            )
        if self.rank.is_main:
            logger.warning(
                "step %d: %s; they are left out of their groups' baselines and the loss "
                "(%d group(s) dropped with fewer than %d scored completions)",
                step,
                errors.describe(),
                dropped,
                MIN_SCORED,
            )

    def collect(
        self, n_prompts: int, step: int, round_: int, times: dict[str, float]
    ) -> list[Group]:
        """Draw ``n_prompts`` prompts, generate ``num_generations`` completions each, score them.

        Every rank draws the same ``n_prompts`` prompts (same sampler, same seed) and keeps its
        contiguous share (``distributed.shard_bounds``); a group never spans two ranks. With
        ``vllm_tensor_parallel_size`` > 1 the ranks sharing an engine all generate (and score)
        their group's prompts in the same calls, as one engine must, and each keeps its own
        share (``distributed.generation_share``): no prompts need gathering, every rank has
        drawn them all.
        """
        drawn = self.prompts.draw(n_prompts)
        share = distributed.generation_share(
            n_prompts, self.rank.rank, self.rank.world_size, self.settings.tensor_parallel
        )
        groups = self._collect_range(drawn, share.generate, step, round_, times)
        return share.own(groups)

    def _collect_range(
        self,
        drawn: list[tuple[Sample, int]],
        bounds: tuple[int, int],
        step: int,
        round_: int,
        times: dict[str, float],
    ) -> list[Group]:
        """Generate and score the drawn prompts ``[start, stop)`` (seeded by global index)."""
        start, stop = bounds
        mine = drawn[start:stop]
        prompts = [self._encode(sample) for sample, _ in mine]
        if any(is_multi_turn(env) for env in self.prompts.envs):  # groups of episodes
            pause_point("generation", step)
            return collect_episode_groups(
                self.engine, self.tokenizer, self.prompt_format, self.prompts.envs, mine,
                prompts, self._samplings(len(prompts), step, round_, start, episodes=True),
                self.settings.max_completion_length, times,
                history=HistoryPolicy(self.settings.history_policy),
                fatal_breaks=self.settings.fatal_template_breaks,
            )  # fmt: skip
        # Each group is scored as soon as the engine reports it done (``overlap_scoring``):
        # "score" is then the wait for the last scores after generation ended.
        background = self.settings.overlap_scoring
        with ScoringStage(self.prompts.envs, mine, background) as scoring:
            t = time.perf_counter()
            pause_point("generation", step)
            results = self._generate(prompts, step, round_, start, scoring.submit)
            times["generate"] += time.perf_counter() - t
            t = time.perf_counter()
            pause_point("scoring", step)
            scores = scoring.finish(results)
            times["score"] += time.perf_counter() - t
        self.score_overlapped_s += scoring.overlapped_s
        return [
            Group(sample, env_index, ids, list(results[k]), scores[k])
            for k, ((sample, env_index), ids) in enumerate(zip(mine, prompts))
        ]

    def _encode(self, sample: Sample) -> list[int]:
        """Encode a prompt: its last ``max_prompt_length`` token ids (a warning when cut)."""
        limit = self.settings.max_prompt_length
        return encode_prompt(self.tokenizer, sample, self.prompt_format, limit).ids

    def _samplings(
        self, n_prompts: int, step: int, round_: int, start: int, episodes: bool = False
    ) -> list[SamplingConfig]:
        """Return the step's sampling: one for the call, or one per prompt (``seed_per_prompt``).

        A seed per (step, round) makes sampling independent of the past: resume is exact
        (``call_seed``). Ranks offset it by their first prompt's global index so they sample
        differently; with ``seed_per_prompt`` the seed is base + global prompt index:
        split-independent.
        """
        settings, n = self.settings, self.settings.num_generations
        width = settings.prompts_per_step * n
        seed = call_seed(settings.seed, step, round_, width) + start * n
        sampling = SamplingConfig(
            n=n,
            max_new_tokens=settings.max_completion_length,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=seed,
        )
        if episodes and settings.max_turn_tokens:  # a turn's cap within the episode's
            turn = min(settings.max_turn_tokens, settings.max_completion_length)
            sampling = replace(sampling, max_new_tokens=turn)
        if not settings.seed_per_prompt:
            return [sampling]
        base = seed - start * n
        return [replace(sampling, seed=base + (start + i) * n) for i in range(n_prompts)]

    def _generate(
        self, prompts: list[list[int]], step: int, round_: int, start: int, on_done: GroupDone
    ) -> list[list[Completion]]:
        """``num_generations`` completions per prompt, seeded by step, round and prompt index.

        ``on_done`` hears of each prompt's group as soon as it is done.
        """
        samplings = self._samplings(len(prompts), step, round_, start)
        if self.settings.seed_per_prompt:  # seed = base + global prompt index: split-independent
            results = []
            for k, (prompt, sampling) in enumerate(zip(prompts, samplings)):
                results.append(self.engine.generate([prompt], sampling)[0])
                on_done(k, results[-1])
            return results
        return self.engine.generate(prompts, samplings[0], on_done) if prompts else []
