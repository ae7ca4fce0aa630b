"""Exponential-moving-average reward baselines across steps (``advantage_estimator: ema``).

The group estimators (``grpo``, ``rloo``; ``advantages.py``) compare a completion with the other
completions of the same step's group. The EMA baseline compares it with what the policy earned on
the same prompt (or the same environment) in *earlier* steps: a running mean of the reward,
updated after each visit, that is part of the training state (saved in checkpoints, restored on
``--resume``, identical on every data-parallel rank because it is computed from the step's
gathered rewards).

What each baseline buys (the same three are documented in grpo_train/README.md):

- ``grpo``: ``r - mean(group)`` (DeepSeekMath, arXiv:2402.03300). No state; the default. A
  group whose rewards all agree gets advantage 0 (no gradient).
- ``rloo``: ``r_i - mean_{j != i} r_j`` (Ahmadian et al., arXiv:2402.14740): the baseline does
  not contain the completion's own reward, so the gradient estimate is unbiased; it matters with
  small groups (2-4) and ``scale_rewards: none``, where ``grpo`` shrinks every advantage by
  ``(G - 1) / G``.
- ``ema``: ``r - b`` with ``b`` a running mean of past rewards (REINFORCE with a moving-average
  reward baseline, Williams, "Simple statistical gradient-following algorithms", 1992), kept per
  prompt. It does not come from the current samples, so the gradient stays
  unbiased, and a group whose rewards all agree still learns when the prompt used to score
  differently (all 8 correct on a prompt that used to be solved half the time: +0.5 each). It helps
  when many groups have equal rewards (hard or easy tasks, small groups); it lags when the policy
  improves faster than about ``1 / (1 - ema_alpha)`` visits, so lower ``ema_alpha`` (0.9) for
  short runs or rare revisits, raise it (0.99) for long runs over a small dataset.

Keys: a prompt is known by its environment index and dataset id (``group_key``). A prompt seen
before uses its own baseline (prompts repeat when the run cycles over a finite training split);
a prompt seen for the first time uses its environment's baseline (procedural environments and
large datasets, where prompts rarely repeat, then get a per-environment baseline); the very first
step of an environment uses the group mean, as ``grpo`` does. After the advantages are computed,
each visited prompt's baseline moves towards its group mean (``b <- a * b + (1 - a) * mean``, or
``b = mean`` on the first visit) and each environment's towards the mean of its rewards in the
step (one update per step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from grpo_train.algorithm.advantages import (
    MIN_SCORED,
    ScaleRewards,
    masked_rewards,
    scale_centred,
    trainable_mask,
)

#: The most per-prompt baselines kept; beyond it the least recently visited are forgotten (a
#: procedural environment draws new prompts forever, and each forgotten one falls back to its
#: environment's baseline). 200,000 entries are a few tens of MB in a checkpoint at most.
MAX_PROMPT_BASELINES = 200_000


@dataclass(frozen=True)
class GroupKey:
    """What an EMA baseline is kept for: the group's prompt and its environment."""

    prompt: str
    env: str


def group_key(env_index: int, sample_id: str) -> GroupKey:
    """Return the baseline key of a prompt: its environment index and dataset id.

    >>> group_key(1, "add2-17")
    GroupKey(prompt='1/add2-17', env='1')
    """
    return GroupKey(prompt=f"{env_index}/{sample_id}", env=str(env_index))


@dataclass(frozen=True)
class EmaBaselines:
    """The running baselines: mean reward per prompt key and per environment key.

    Immutable: ``ema_advantages`` returns a new one. ``to_state`` / ``from_state`` convert to
    the plain dictionaries a checkpoint's ``trainer_state.pt`` holds (loadable with
    ``torch.load(weights_only=True)``).
    """

    prompts: Mapping[str, float] = field(default_factory=dict)
    """Prompt key -> baseline, least recently visited first."""
    envs: Mapping[str, float] = field(default_factory=dict)
    """Environment key -> baseline."""

    def baseline(self, key: GroupKey) -> float | None:
        """Return the baseline for ``key``: the prompt's, else its environment's, else None."""
        value = self.prompts.get(key.prompt)
        return self.envs.get(key.env) if value is None else value

    def to_state(self) -> dict[str, dict[str, float]]:
        """Return the baselines as plain dictionaries (for a checkpoint)."""
        return {"prompts": dict(self.prompts), "envs": dict(self.envs)}

    @classmethod
    def from_state(cls, state: Mapping[str, Mapping[str, float]] | None) -> EmaBaselines:
        """Rebuild from ``to_state``'s dictionaries (None or empty: no baseline yet)."""
        if not state:
            return cls()
        prompts = {str(k): float(v) for k, v in state.get("prompts", {}).items()}
        envs = {str(k): float(v) for k, v in state.get("envs", {}).items()}
        return cls(prompts, envs)


def check_alpha(alpha: float) -> None:
    """Raise ValueError unless ``0 < alpha < 1`` (0 keeps no history, 1 never updates)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(
            f"ema_alpha: {alpha}; must be in (0, 1): the weight of the old baseline at each "
            "update (0.9-0.99 is useful, 0.95 the default)"
        )


def ema_advantages(
    rewards: torch.Tensor,
    keys: Sequence[GroupKey],
    baselines: EmaBaselines,
    alpha: float = 0.95,
    scale_rewards: ScaleRewards | str = ScaleRewards.BATCH,
    eps: float = 1e-4,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, EmaBaselines]:
    """Advantages ``r - b`` of a (P, G) reward tensor against running baselines; and the update.

    ``keys``: one ``GroupKey`` per group (row of ``rewards``). ``b`` is the baseline *before*
    this step (see the module docstring for which one), so a completion's own reward is never in
    its baseline. ``valid``: as in ``advantages.compute_advantages`` (failed scores and groups
    with fewer than ``MIN_SCORED`` valid rewards get advantage 0 and update nothing).

    ``scale_rewards``: ``batch`` divides by the std of the step's valid rewards (+ ``eps``),
    ``none`` by nothing. ``group`` is refused: the group std is 0 for exactly the groups this
    baseline gives a signal to (all rewards equal), and dividing by ``eps`` would blow them up.

    >>> adv, new = ema_advantages(
    ...     torch.tensor([[1.0, 1.0]]), [group_key(0, "q")], EmaBaselines({"0/q": 0.5}),
    ...     alpha=0.9, scale_rewards="none")
    >>> adv, round(new.prompts["0/q"], 4), new.envs
    (tensor([[0.5000, 0.5000]]), 0.55, {'0': 1.0})
    """
    check_alpha(alpha)
    if rewards.ndim != 2 or rewards.shape[1] < MIN_SCORED:
        raise ValueError(
            f"rewards must have shape (prompts, group) with group >= {MIN_SCORED}, got "
            f"{tuple(rewards.shape)}"
        )
    if len(keys) != rewards.shape[0]:
        raise ValueError(f"{len(keys)} group keys for {rewards.shape[0]} groups; give one each")
    scale = ScaleRewards(scale_rewards)
    if scale is ScaleRewards.GROUP:
        raise ValueError(
            "scale_rewards: 'group' divides by each group's reward std, which is 0 for the "
            "equal-reward groups the ema baseline learns from; use 'batch' or 'none'"
        )
    ok = trainable_mask(torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid)
    r = masked_rewards(rewards, ok)
    counts = ok.sum(dim=1)
    means = r.sum(dim=1) / counts.clamp(min=1)
    base = torch.tensor(
        [
            float(means[p]) if (b := baselines.baseline(key)) is None else b
            for p, key in enumerate(keys)
        ],
        dtype=torch.float64,
    )
    centred = torch.where(ok, r - base[:, None], torch.zeros((), dtype=torch.float64))
    centred = scale_centred(centred, r, ok, scale, eps)
    return centred.float(), _updated(baselines, keys, r, ok, means, alpha)


def _updated(
    old: EmaBaselines,
    keys: Sequence[GroupKey],
    rewards: torch.Tensor,
    ok: torch.Tensor,
    means: torch.Tensor,
    alpha: float,
) -> EmaBaselines:
    """Move each visited prompt's and environment's baseline towards this step's mean reward."""
    prompts, envs = dict(old.prompts), dict(old.envs)
    env_sums: dict[str, tuple[float, int]] = {}
    for p, key in enumerate(keys):  # in group order: a prompt drawn twice in a step moves twice
        n = int(ok[p].sum())
        if n == 0:
            continue
        mean = float(means[p])
        previous = prompts.pop(key.prompt, None)  # re-inserted last: most recently visited
        prompts[key.prompt] = mean if previous is None else alpha * previous + (1 - alpha) * mean
        total, count = env_sums.get(key.env, (0.0, 0))
        env_sums[key.env] = (total + float(rewards[p][ok[p]].sum()), count + n)
    for env, (total, count) in env_sums.items():
        mean = total / count
        previous = envs.get(env)
        envs[env] = mean if previous is None else alpha * previous + (1 - alpha) * mean
    while len(prompts) > MAX_PROMPT_BASELINES:
        del prompts[next(iter(prompts))]
    return EmaBaselines(prompts, envs)
