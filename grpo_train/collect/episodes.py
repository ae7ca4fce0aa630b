"""Multi-turn collection: a step's GRPO groups as groups of episodes per prompt.

When any training environment runs episodes of more than one turn (``grpo_envs.episode``), the
step's prompts are played as episodes with ``episodes.driver.generate_episodes`` (every live
episode advances together, one engine call per turn) and each episode becomes one GRPO row:
its token-exact training sequence (``Group.episodes``), the environment's ids masked out of the
loss, the sampled ids with their sampling logprobs, the episode's score as the reward.
Single-turn environments in the same step are one-turn episodes (``OneTurn``: the same score).
A run whose environments are all single-turn never comes here, so it computes what it always did.

Each environment reply is rendered after an anchor turn (``reply_render.ReplyRenderer``), so the
chat template never re-renders earlier turns. A reply it cannot render ends the episode
(``BreakPolicy.END``), with a warning the first time and ``episodes/broken_share`` in the step's
metrics (``template_breaks: error`` stops the run instead). Under ``history_policy: rerender``
the model is shown the template's rendering of the history; the GRPO row is the episode's first
training sequence (up to where the template's rendering diverged), and its later sequences are
extra rows of the batch trained with the episode's advantage (``RolloutBatch.row_of``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from grpo_envs.base import Environment
from grpo_envs.episode import Episodic, episodic
from grpo_envs.types import Sample
from grpo_train.collect.groups import Group
from grpo_train.episodes.driver import (
    STEP_WORKERS,
    EpisodeRenderer,
    EpisodeSettings,
    EpisodeStats,
    episode_row,
    generate_episodes,
    is_multi_turn,
    score_episodes,
)
from grpo_train.episodes.reply_render import HistoryPolicy
from grpo_train.episodes.tokens import BreakPolicy
from grpo_train.rollout.base import RolloutEngine, SamplingConfig

if TYPE_CHECKING:
    from grpo_train.episodes.prompts import PromptFormat


def collect_episode_groups(
    engine: RolloutEngine,
    tokenizer: object,
    prompt_format: PromptFormat,
    envs: Sequence[Environment],
    drawn: Sequence[tuple[Sample, int]],
    prompts: Sequence[Sequence[int]],
    samplings: Sequence[SamplingConfig],
    max_episode_tokens: int,
    times: dict[str, float],
    *,
    history: HistoryPolicy = HistoryPolicy.KEEP,
    fatal_breaks: bool = False,
) -> list[Group]:
    """Play and score the episodes of ``drawn`` (sample, env index) prompts, one group each.

    ``samplings``: one ``SamplingConfig`` for all prompts (one batched call per turn), or one
    per prompt (``seed_per_prompt``: each group's episodes batched on their own, so that its
    samples do not depend on how the step's prompts were split between ranks).
    """
    episodes: list[Episodic] = [episodic(env) for env in envs]
    renderer = EpisodeRenderer(tokenizer, prompt_format, history=history)
    settings = EpisodeSettings(
        max_episode_tokens, BreakPolicy.END, STEP_WORKERS, fatal_breaks=fatal_breaks
    )
    per_prompt = [episodes[env_index] for _, env_index in drawn]
    samples = [sample for sample, _ in drawn]
    t = time.perf_counter()
    if len(samplings) == 1:
        rollouts = generate_episodes(
            engine, renderer, per_prompt, samples, prompts, samplings[0], settings
        )
    else:
        rollouts = [
            generate_episodes(engine, renderer, [e], [s], [p], sampling, settings)[0]
            for e, s, p, sampling in zip(per_prompt, samples, prompts, samplings)
        ]
    times["generate"] += time.perf_counter() - t
    t = time.perf_counter()
    scores = score_episodes(per_prompt, rollouts)
    times["score"] += time.perf_counter() - t
    return [
        Group(
            sample,
            env_index,
            list(ids),
            [episode_row(r) for r in group],
            scores[k],
            episodes=tuple(group),
        )
        for k, ((sample, env_index), ids, group) in enumerate(zip(drawn, prompts, rollouts))
    ]


def episode_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """Return the step's episode metrics (``episodes/turns_mean``...); none single-turn."""
    rollouts = [r for g in groups for r in g.episodes]
    return EpisodeStats.of(rollouts).metrics() if rollouts else {}


__all__ = ["STEP_WORKERS", "collect_episode_groups", "episode_metrics", "is_multi_turn"]
