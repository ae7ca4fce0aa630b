"""Multi-task training: several environments mixed into one weighted stream.

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

import datasets

from grpo_envs.base import Environment
from grpo_envs.types import Outcome, Sample, Score
from grpo_envs.wrappers import guarded_score, guarded_scores

SEPARATOR = ":"


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

    ``dataset("train")`` draws ``size`` rows: each row's environment is drawn by weight with
    ``Random(seed)``, and each environment's rows are consumed in a per-seed shuffled order
    (cycling, with ``#k`` appended to repeated ids). Other splits are the concatenation of every
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
            self._cache[split] = datasets.Dataset.from_list(self._rows(split))
        return self._cache[split]

    def _rows(self, split: str) -> list[dict[str, object]]:
        members = {k: self.envs[k].dataset(split) for k in self.envs}
        if split != "train":
            return [self._tag(k, row, 0) for k, ds in members.items() for row in ds]
        rng = random.Random(f"mixture/{self.seed}")
        active = [k for k in self.envs if self.weights[k] > 0]
        total = self.size if self.size is not None else sum(len(members[k]) for k in active)
        orders = {k: rng.sample(range(len(members[k])), len(members[k])) for k in active}
        used: Counter[str] = Counter()
        rows = []
        for _ in range(total):
            k = rng.choices(active, weights=[self.weights[a] for a in active])[0]
            position = used[k]
            used[k] += 1
            order = orders[k]
            rows.append(
                self._tag(k, members[k][order[position % len(order)]], position // len(order))
            )
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
