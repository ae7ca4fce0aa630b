"""Training samples: one group's completions of a step as rows of the run's ``samples.jsonl``.

On the first step, every ``log_every_samples`` steps and on the last step the trainer logs one
group (``run_log.samples_due``); ``sample_records`` makes its rows, which
``run_log.RunLogger.log_samples`` appends to the file.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo_train.episodes.records import CompletionRecord, RewardPart, TurnRecord

if TYPE_CHECKING:
    from grpo_train.collect.groups import Group


@dataclass(frozen=True)
class TrainingSample(CompletionRecord):
    """One completion of a training step, as logged to the run's ``samples.jsonl``.

    Not an evaluation record (``grpo_train.eval.records.SampleRecord``, a resumable result keyed
    by generation index): a training row says which step sampled it and the advantage it got.
    """

    step: int
    advantage: float
    finish_reason: str
    components: tuple[RewardPart, ...] = ()
    """Where the reward came from: the score's components (the reward is their weighted sum;
    empty where scoring failed, ``score_details`` then says why)."""
    score_details: Mapping[str, object] | None = None
    """What the scorer noted (extracted answer, failure reason, an episode's end and turns)."""


@dataclass(frozen=True, kw_only=True)
class EpisodeSample(TrainingSample):
    """A multi-turn training row: the episode turn by turn, and how it ended.

    ``completion`` stays a plain transcript (``[role]`` lines before the environment's replies,
    for grep); ``turns`` says who wrote what, with token counts and tool calls.
    """

    turns: tuple[TurnRecord, ...]
    episode_end: str
    """A ``grpo_envs.episode.EpisodeEnd`` value: ``done`` (the environment ended it) or the
    budget that cut it (``max_turns``, ``max_tokens``...)."""


def sample_records(
    step: int,
    group: Group,
    env_name: str,
    advantages: Sequence[float],
    episode_terms: Collection[str] = (),
) -> list[TrainingSample]:
    """Return the completions of one group as ``samples.jsonl`` records.

    Multi-turn groups give ``EpisodeSample`` rows (each turn, its tool calls, the scored turn);
    ``episode_terms`` names the score components computed over the whole episode (the rest
    judged the final turn).
    """
    from grpo_train.episodes.driver import episode_turns

    prompt = group.sample.prompt[-1].content if group.sample.prompt else ""
    rows: list[TrainingSample] = []
    for i, (c, s, adv) in enumerate(zip(group.completions, group.scores, advantages)):
        episode = group.episodes[i] if i < len(group.episodes) else None
        judged = "completion" if episode is None else "final_turn"
        parts = tuple(
            RewardPart(
                name=p.name,
                value=p.value,
                weight=p.weight,
                weighted=p.weighted,
                judged="episode" if p.name in episode_terms else judged,
            )
            for p in s.components
        )
        common = dict(
            env_id=env_name,
            sample_id=group.sample.id,
            prompt=prompt,
            completion=c.text,
            reward=s.reward,
            outcome=s.outcome.value,
            step=step,
            advantage=adv,
            finish_reason=c.finish_reason,
            components=parts,
            score_details=dict(s.details),
        )
        if episode is None:
            rows.append(TrainingSample(**common))  # type: ignore[arg-type]
        else:
            end = episode.state.end
            rows.append(
                EpisodeSample(
                    **common,  # type: ignore[arg-type]
                    turns=episode_turns(episode),
                    episode_end="" if end is None else end.value,
                )
            )
    return rows
