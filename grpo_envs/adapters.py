"""Serve one environment to other trainers: TRL reward functions and verl's ``compute_score``.

TRL (checked against trl 1.16 ``GRPOTrainer._calculate_rewards``) calls each reward function as
``reward_func(prompts=..., completions=..., completion_ids=..., **columns, trainer_state=...,
log_extra=..., log_metric=...)``, where ``columns`` are every dataset column except ``prompt`` and
``completion``, each a list with one entry per completion; ``completions`` are strings, or lists of
message dicts for conversational datasets. It expects one float (or None) per completion.

verl's reward manager calls ``compute_score(data_source, solution_str, ground_truth,
extra_info=None)`` and accepts a float or a dict holding ``"score"`` (other numeric keys are
logged). Point ``custom_reward_function.path`` at this module and ``name`` at ``compute_score``:
``data_source`` must then be a registered environment id.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from grpo_envs.base import completion_text
from grpo_envs.types import Sample, Score

if TYPE_CHECKING:
    from grpo_envs.base import Environment


class TRLRewardFunc(Protocol):
    """TRL's reward-function signature."""

    __name__: str

    def __call__(self, completions: Sequence[object], **kwargs: object) -> list[float]:
        """One reward per completion."""
        ...


def _column(
    kwargs: Mapping[str, object], name: str, n: int, default: object = None
) -> list[object]:
    value = kwargs.get(name)
    if value is None:
        return [default] * n
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != n:
        raise ValueError(
            f"TRL passed column {name!r} that is not a list of {n} values (one per completion)"
        )
    return list(value)


def samples_from_trl_kwargs(n: int, kwargs: Mapping[str, object]) -> list[Sample]:
    """Rebuild the ``Sample`` of each completion from the columns TRL passes as kwargs."""
    if "answer" not in kwargs:
        raise ValueError(
            "the reward function needs the dataset column 'answer' (TRL passes every column as a "
            f"keyword argument; got {sorted(kwargs)}). Train on env.dataset(split) unchanged."
        )
    answers = _column(kwargs, "answer", n)
    ids = _column(kwargs, "id", n, "")
    env_ids = _column(kwargs, "env_id", n, "")
    metas = _column(kwargs, "metadata", n, "{}")
    prompts = _column(kwargs, "prompts", n, "")
    samples = []
    for i in range(n):
        prompt = prompts[i] if isinstance(prompts[i], str | list) else ""
        meta = metas[i] if isinstance(metas[i], str) else json.dumps(metas[i] or {})
        row = {
            "id": ids[i],
            "prompt": prompt,
            "answer": answers[i],
            "env_id": env_ids[i],
            "metadata": meta,
        }
        samples.append(Sample.from_row(row))
    return samples


class _BatchCache:
    """Scores the last batch once for several per-component reward functions."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.key: tuple[object, ...] | None = None
        self.scores: list[Score] = []

    def scores_for(
        self, completions: Sequence[object], kwargs: Mapping[str, object]
    ) -> list[Score]:
        # Keyed by content, not object identity: ids of freed lists get reused between steps.
        key = (
            tuple(completion_text(c) for c in completions),
            tuple(map(str, kwargs.get("answer") or ())),  # type: ignore[call-overload]
            tuple(map(str, kwargs.get("id") or ())),  # type: ignore[call-overload]
        )
        if key != self.key:
            samples = samples_from_trl_kwargs(len(completions), kwargs)
            self.scores = self.env.score_batch(list(completions), samples)  # type: ignore[arg-type]
            self.key = key
            log_metric = kwargs.get("log_metric")
            if callable(log_metric) and self.scores:
                accuracy = sum(s.correct for s in self.scores) / len(self.scores)
                log_metric(f"{self.env.env_id or 'env'}/accuracy", accuracy)
        return self.scores


def trl_reward_funcs(env: Environment, *, per_component: bool = False) -> list[TRLRewardFunc]:
    """TRL reward functions for ``env``.

    Args:
        env: the environment that scores.
        per_component: False (default): one function returning ``Score.reward``. True: one function
            per rubric component returning its raw value, each with a ``weight`` attribute; pass
            ``[f.weight for f in funcs]`` as ``GRPOConfig.reward_weights`` so that TRL's weighted
            sum equals ``Score.reward`` while logging each component separately.
    """
    cache = _BatchCache(env)
    base_name = (env.env_id or type(env).__name__).replace("/", "_").replace("-", "_")

    def total(completions: Sequence[object], **kwargs: object) -> list[float]:
        return [s.reward for s in cache.scores_for(completions, kwargs)]

    total.__name__ = base_name
    if not per_component:
        return [total]
    rubric = getattr(env, "rubric", None)
    if rubric is None:
        raise ValueError(f"{base_name}: per_component needs an environment with a rubric")
    funcs: list[TRLRewardFunc] = []
    for comp in rubric.components:
        funcs.append(_component_func(cache, comp.name, comp.weight, f"{base_name}_{comp.name}"))
    return funcs


def _component_func(cache: _BatchCache, name: str, weight: float, label: str) -> TRLRewardFunc:
    def component(completions: Sequence[object], **kwargs: object) -> list[float]:
        values = []
        for score in cache.scores_for(completions, kwargs):
            found = [c.value for c in score.components if c.name == name]
            values.append(found[0] if found else 0.0)  # a failed score has no components: 0
        return values

    component.__name__ = label
    component.weight = weight  # type: ignore[attr-defined]
    return component  # type: ignore[return-value]


# --- verl -------------------------------------------------------------------------------------


def verl_score(
    env: Environment,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, object] | None = None,
) -> dict[str, float]:
    """Score one verl item with ``env``: ``{"score": reward, "acc": 0/1}`` plus each component.

    ``extra_info`` may carry the row's ``id`` and ``metadata`` (dict or JSON string).
    """
    info = dict(extra_info or {})
    meta = info.get("metadata", {})
    row = {
        "id": str(info.get("id", info.get("index", ""))),
        "prompt": "",
        "answer": ground_truth,
        "env_id": env.env_id,
        "metadata": meta if isinstance(meta, str) else json.dumps(meta),
    }
    score = env._safe_score(solution_str, Sample.from_row(row))
    # verl stacks every key across the batch into arrays: keep them numeric and always present.
    result = {"score": float(score.reward), "acc": float(score.correct)}
    for comp in score.components:
        result[comp.name] = float(comp.value)
    return result


@functools.lru_cache(maxsize=64)
def _cached_env(env_id: str) -> Environment:
    from grpo_envs.registration import make

    return make(env_id)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, object] | None = None,
) -> dict[str, float]:
    """Verl's ``custom_reward_function`` entry: ``data_source`` names a registered environment."""
    return verl_score(_cached_env(data_source), solution_str, ground_truth, extra_info)


def to_verl_rows(env: Environment, split: str) -> list[dict[str, object]]:
    """Return ``env.dataset(split)`` as verl parquet rows (data_source, prompt, reward_model...)."""
    rows = []
    for row in env.dataset(split):
        rows.append(
            {
                "data_source": env.env_id,
                "prompt": row["prompt"],
                "ability": env.env_id.split("/", 1)[0] if env.env_id else "",
                "reward_model": {"style": "rule", "ground_truth": row["answer"]},
                "extra_info": {"id": row["id"], "metadata": row["metadata"], "split": split},
            }
        )
    return rows
