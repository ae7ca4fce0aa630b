"""Multi-task training: several environments mixed into one weighted stream.

``WeightedOrder`` is the one definition of that stream (which environment and row the k-th draw
gives); ``MixtureEnv`` materialises its first ``size`` draws as one environment's dataset (for
TRL, verl and other trainers that take one dataset), and ``grpo train`` draws from it step by
step (``grpo_train.collect.training_prompts.PromptSampler``, resumable from a checkpoint).

Each row keeps its environment in the ``env_id`` column, so ``MixtureEnv.score`` dispatches to the
right scorer and ``per_env_metrics`` reports accuracy per environment. Row ids are prefixed with the
environment id (``math/add2-v0:train-3``) to stay unique across environments.

Example:
    >>> mix = MixtureEnv.from_ids({"math/add2-v0": 3, "math/countdown-v0": 1}, size=8,
    ...                           env_kwargs={"train_size": 16, "test_size": 4})
    >>> sorted(set(mix.dataset("train")["env_id"]))
    ['math/add2-v0', 'math/countdown-v0']
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from grpo_envs.base import Environment
from grpo_envs.types import Outcome, Sample, Score
from grpo_envs.wrappers import guarded_score, guarded_scores

if TYPE_CHECKING:
    import datasets

SEPARATOR = ":"


class WeightedOrder:
    """A deterministic weighted draw of rows from several environments, endless and resumable.

    The k-th draw picks an environment with ``Random(seed * 1_000_003 + k)`` by weight, then that
    environment's next row in a permutation reshuffled every epoch from ``(seed, env, epoch)``.
    The whole state is two counters (``draws``, ``positions``): a run restored from them draws
    the rows the uninterrupted one would have drawn, and no epoch boundary ends the stream.

    >>> order = WeightedOrder([2, 3], [1.0, 1.0], seed=0)
    >>> draws = [order.next() for _ in range(10)]
    >>> sorted(row for env, row, epoch in draws if env == 1 and epoch == 0)
    [0, 1, 2]
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Sequence[float],
        seed: int,
        draws: int = 0,
        positions: Sequence[int] | None = None,
    ) -> None:
        """Draw from environments of ``sizes`` rows by ``weights``, resuming at the counters."""
        if not sizes or min(sizes) < 1:
            raise ValueError(
                f"every environment needs at least one training row, got sizes {list(sizes)}"
            )
        self.sizes, self.weights, self.seed = list(sizes), list(weights), seed
        self.draws = draws
        self.positions = list(positions) if positions is not None else [0] * len(sizes)

    def next(self) -> tuple[int, int, int]:
        """Return the next (environment index, row index, epoch of that environment); advance."""
        pick = random.Random(self.seed * 1_000_003 + self.draws)
        env = pick.choices(range(len(self.sizes)), self.weights)[0]
        epoch, offset = divmod(self.positions[env], self.sizes[env])
        order = np.random.default_rng([self.seed, env, epoch]).permutation(self.sizes[env])
        self.draws += 1
        self.positions[env] += 1
        return env, int(order[offset]), epoch

    def restart(self, env: int, size: int) -> None:
        """Draw environment ``env``'s rows anew from ``size`` rows (a new curriculum stage)."""
        if size < 1:
            raise ValueError(f"environment {env}: the new stage has no training rows")
        self.sizes[env], self.positions[env] = size, 0


@dataclass(frozen=True)
class EnvMetrics:
    """Per-environment summary of a batch of scores."""

    count: int
    mean_reward: float
    accuracy: float
    outcomes: Mapping[str, int]


def per_env_metrics(env_ids: Sequence[str], scores: Sequence[Score]) -> dict[str, EnvMetrics]:
    """Group ``scores`` by their samples' ``env_id``: mean reward, accuracy, outcome counts."""
    if len(env_ids) != len(scores):
        raise ValueError(f"{len(env_ids)} env ids for {len(scores)} scores")
    groups: dict[str, list[Score]] = defaultdict(list)
    for env_id, score in zip(env_ids, scores):
        groups[env_id].append(score)
    return {
        env_id: EnvMetrics(
            count=len(group),
            mean_reward=math.fsum(s.reward for s in group) / len(group),
            accuracy=sum(s.correct for s in group) / len(group),
            outcomes=dict(Counter(s.outcome.value for s in group)),
        )
        for env_id, group in sorted(groups.items())
    }


class MixtureEnv(Environment):
    """A weighted mixture of environments.

    ``dataset("train")`` is the first ``size`` draws of ``WeightedOrder`` (the order ``grpo train``
    draws its prompts in), with ``#k`` appended to the ids of an environment's epoch ``k`` > 0.
    Other splits are the concatenation of every
    member's split
    (evaluation wants every row, and per-env metrics make the mix irrelevant there).
    """

    def __init__(
        self,
        envs: Mapping[str, Environment],
        weights: Mapping[str, float] | None = None,
        *,
        size: int | None = None,
        seed: int = 0,
    ) -> None:
        """Mix ``envs`` (env_id -> environment) with ``weights`` (default: equal)."""
        if not envs:
            raise ValueError("a mixture needs at least one environment")
        weights = dict(weights) if weights is not None else dict.fromkeys(envs, 1.0)
        unknown = set(weights) - set(envs)
        if unknown or any(not (w >= 0 and math.isfinite(w)) for w in weights.values()):
            raise ValueError(f"weights must be finite, >= 0 and name member envs; got {weights}")
        if sum(weights.values()) <= 0:
            raise ValueError("at least one weight must be positive")
        self.envs = dict(envs)
        for env_id, env in self.envs.items():
            env.env_id = env.env_id or env_id
        self.weights = {k: float(weights.get(k, 0.0)) for k in envs}
        self.size, self.seed = size, seed
        common = set.intersection(*(set(e.splits) for e in self.envs.values()))
        self.splits = tuple(s for s in ("train", "test", "validation") if s in common) or tuple(
            sorted(common)
        )
        if not self.splits:
            raise ValueError("the mixed environments share no split")
        self._cache: dict[str, datasets.Dataset] = {}

    @classmethod
    def from_ids(
        cls,
        weights: Mapping[str, float],
        *,
        size: int | None = None,
        seed: int = 0,
        env_kwargs: Mapping[str, object] | None = None,
    ) -> MixtureEnv:
        """Build every member with ``grpo_envs.make(env_id, **env_kwargs)``."""
        from grpo_envs.registration import make

        envs = {env_id: make(env_id, **dict(env_kwargs or {})) for env_id in weights}
        return cls(envs, weights, size=size, seed=seed)

    def dataset(self, split: str = "train") -> datasets.Dataset:
        """Return the mixed rows of ``split`` (see the class docstring)."""
        if split not in self.splits:
            raise ValueError(f"mixture has no split {split!r}; splits: {list(self.splits)}")
        if split not in self._cache:
            import datasets  # here, not at import: a trainer-only machine may lack it

            self._cache[split] = datasets.Dataset.from_list(self._rows(split))
        return self._cache[split]

    def _rows(self, split: str) -> list[dict[str, object]]:
        members = {k: self.envs[k].dataset(split) for k in self.envs}
        if split != "train":
            return [self._tag(k, row, 0) for k, ds in members.items() for row in ds]
        active = [k for k in self.envs if self.weights[k] > 0]
        total = self.size if self.size is not None else sum(len(members[k]) for k in active)
        order = WeightedOrder(
            [len(members[k]) for k in active], [self.weights[k] for k in active], self.seed
        )
        rows = []
        for _ in range(total):
            env, row, epoch = order.next()
            rows.append(self._tag(active[env], members[active[env]][row], epoch))
        return rows

    @staticmethod
    def _tag(env_id: str, row: Mapping[str, object], epoch: int) -> dict[str, object]:
        tagged = dict(row)
        tagged["env_id"] = env_id
        tagged["id"] = f"{env_id}{SEPARATOR}{row['id']}" + (f"#{epoch}" if epoch else "")
        return tagged

    def _member(self, sample: Sample | Mapping[str, object]) -> tuple[Environment, Sample] | Score:
        try:
            parsed = Sample.from_row(sample)
        except (ValueError, TypeError, KeyError) as exc:
            return Score.failure(Outcome.ERROR, f"bad sample: {exc}")
        env = self.envs.get(parsed.env_id)
        if env is None:
            return Score.failure(
                Outcome.ERROR,
                f"sample env_id {parsed.env_id!r} is not in this mixture {sorted(self.envs)}",
            )
        original = parsed.id.split(SEPARATOR, 1)[-1].split("#", 1)[0]
        return env, Sample(original, parsed.prompt, parsed.answer, parsed.env_id, parsed.metadata)

    def score(self, completion: str, sample: Sample | Mapping[str, object]) -> Score:
        """Score with the environment named by the sample's ``env_id``."""
        found = self._member(sample)
        if isinstance(found, Score):
            return found
        env, member_sample = found
        return guarded_score(env, completion, member_sample)

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample | Mapping[str, object]],
        *,
        workers: int | None = None,
        timeout_s: float | None = None,
    ) -> list[Score]:
        """Score per member environment (each with its own ``score_batch``); input order kept."""
        if len(completions) != len(samples):
            raise ValueError(f"{len(completions)} completions for {len(samples)} samples")
        results: list[Score | None] = [None] * len(completions)
        groups: dict[str, list[tuple[int, Sample]]] = defaultdict(list)
        for i, sample in enumerate(samples):
            found = self._member(sample)
            if isinstance(found, Score):
                results[i] = found
            else:
                groups[found[1].env_id].append((i, found[1]))
        for env_id, items in groups.items():
            scores = guarded_scores(
                self.envs[env_id],
                [completions[i] for i, _ in items],
                [s for _, s in items],
                workers=workers,
                timeout_s=timeout_s,
            )
            for (i, _), score in zip(items, scores):
                results[i] = score
        return [r if r is not None else Score.failure(Outcome.ERROR, "not scored") for r in results]

    def reference_completion(self, sample: Sample) -> str | None:
        """Return the member environment's reference completion."""
        found = self._member(sample)
        return None if isinstance(found, Score) else found[0].reference_completion(found[1])
