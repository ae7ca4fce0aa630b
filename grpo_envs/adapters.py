"""Serve any environment to other trainers: TRL reward functions and verl's ``compute_score``.

Free functions over any ``Environment`` (built by ``make`` or by hand); scores go through the one
guard (``grpo_envs.wrappers.guarded_scores``), so a trainer never sees an exception or a NaN.

TRL (checked against trl 1.16 ``GRPOTrainer._calculate_rewards``) calls each reward function as
``reward_func(prompts=..., completions=..., completion_ids=..., **columns, trainer_state=...,
log_extra=..., log_metric=...)``, where ``columns`` are every dataset column except ``prompt`` and
``completion``, each a list with one entry per completion; ``completions`` are strings, or lists of
message dicts for conversational datasets. It expects one float (or None) per completion::

    from trl import GRPOConfig, GRPOTrainer
    from grpo_envs.adapters import trl_reward_funcs

    env = grpo_envs.make("math/dataset-v0", path="questions.jsonl")
    trainer = GRPOTrainer(model, reward_funcs=trl_reward_funcs(env),
                          train_dataset=env.dataset("train"), args=GRPOConfig(...))

verl (checked against verl's ``default_compute_score``, ``NaiveRewardManager``,
``BatchRewardManager`` and the experimental reward loop): write the rows with ``to_verl_rows``
and point ``custom_reward_function.path`` at this file (``grpo_envs/adapters.py``) with
``name: compute_score``. verl calls it per item as ``compute_score(data_source=...,
solution_str=..., ground_truth=..., extra_info=..., **extra)`` (the reward loop adds
``reward_router_address``, ``reward_model_tokenizer``; ``reward_kwargs`` adds more), or, with
``reward_manager: batch``, once per batch as ``compute_score(data_sources=..., solution_strs=...,
ground_truths=..., extra_infos=..., **reward_kwargs)``. Every row carries what rebuilds its
environment in verl's worker: ``data_source`` is the id (``module:id`` for an environment that a
module registers), and ``extra_info`` holds the entry point and the ``make`` arguments, so the
environment is scored exactly as it was built. Every result has the same keys (``VERL_KEYS``), so
environments of a mixture can share one batch (verl stacks each key into one array).

Multi-turn environments (episodes): ``grpo_train.episodes.adapters`` (TRL's ``rollout_func``,
verl's agent loop).
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from grpo_envs.base import completion_text
from grpo_envs.types import Outcome, Sample, Score
from grpo_envs.wrappers import guarded_scores

if TYPE_CHECKING:
    from grpo_envs.base import Environment
    from grpo_envs.env_spec import EnvSpec


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
            self.scores = guarded_scores(self.env, list(completions), samples)
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

#: The keys of every ``compute_score`` result: ``score`` (the reward), ``acc`` (1.0 for a success),
#: ``failed`` (1.0 when the scorer failed: error, timeout or sandbox error; not the model's fault).
VERL_KEYS = ("score", "acc", "failed")
_FAILED = frozenset({Outcome.ERROR, Outcome.TIMEOUT, Outcome.SANDBOX_ERROR})


def verl_result(score: Score) -> dict[str, float]:
    """Return a ``Score`` as verl's result dict (always the keys ``VERL_KEYS``, all numbers)."""
    return {
        "score": float(score.reward),
        "acc": float(score.correct),
        "failed": float(score.outcome in _FAILED),
    }


def env_reference(env: Environment) -> tuple[str, str, str]:
    """``(data_source, entry_point, kwargs_json)``: what rebuilds ``env`` in another process.

    ``data_source`` is the id, prefixed with the module to import (``module:id``) when the id is
    registered by a module that a fresh process would not import (see ``make``'s ``module:id``).
    """
    env_spec = env.spec
    if env_spec is None:
        raise ValueError(
            f"{env.env_id or type(env).__name__} was not built by grpo_envs.make, so another "
            "process cannot rebuild it; register it and build it with make(id, **kwargs)"
        )
    entry = env_spec.entry_point
    if isinstance(entry, str):
        entry_point = entry
    else:
        module, name = getattr(entry, "__module__", ""), getattr(entry, "__qualname__", "")
        if not module or module == "__main__" or "<" in name:
            raise ValueError(
                f"{env_spec.id}: its entry point {entry!r} is not importable from another process; "
                "define it at module level in an importable module (not __main__)"
            )
        entry_point = f"{module}:{name}"
    try:
        kwargs_json = json.dumps(env_spec.defaults, sort_keys=True)
    except TypeError as exc:
        raise ValueError(
            f"{env_spec.id}: make() arguments must be JSON values to travel in verl rows ({exc})"
        ) from exc
    module = entry_point.partition(":")[0]
    source = env_spec.id
    if not module.startswith("grpo_envs."):
        source = f"{module}:{env_spec.id}"
    return source, entry_point, kwargs_json


_ENVS: dict[tuple[str, str, str], Environment] = {}
_ENVS_LOCK = threading.Lock()


def env_from_reference(
    data_source: str, entry_point: str = "", kwargs_json: str = "{}"
) -> Environment:
    """Rebuild (once per process, then cached) the environment a verl row names.

    ``data_source`` may be ``module:id`` (the module is imported first, so that it registers its
    environments); when the id is not registered, ``entry_point`` and the JSON arguments build it.
    """
    key = (str(data_source), str(entry_point or ""), str(kwargs_json or "{}"))
    with _ENVS_LOCK:
        env = _ENVS.get(key)
    if env is not None:
        return env
    from grpo_envs.registration import EnvSpec, RegistryError, make, spec

    kwargs = json.loads(key[2])
    module, sep, env_id = key[0].rpartition(":")
    if sep:
        importlib.import_module(module)
    try:
        base: EnvSpec = spec(env_id)
    except RegistryError:
        if not key[1]:
            raise
        base = EnvSpec(env_id, key[1])
    env = make(base, **kwargs)
    with _ENVS_LOCK:
        return _ENVS.setdefault(key, env)


def _verl_sample(env: Environment, ground_truth: object, info: Mapping[str, object]) -> Sample:
    meta = info.get("metadata", {})
    row = {
        "id": str(info.get("id", info.get("index", ""))),
        "prompt": "",
        "answer": "" if ground_truth is None else str(ground_truth),
        "env_id": env.env_id,
        "metadata": meta if isinstance(meta, str) else json.dumps(meta or {}),
    }
    return Sample.from_row(row)


def _env_of(data_source: object, info: Mapping[str, object]) -> Environment:
    return env_from_reference(
        str(data_source),
        str(info.get("env_entry_point") or ""),
        str(info.get("env_kwargs") or "{}"),
    )


def verl_score(
    env: Environment,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, object] | None = None,
) -> dict[str, float]:
    """Score one verl item with ``env`` (see ``VERL_KEYS``)."""
    sample = _verl_sample(env, ground_truth, dict(extra_info or {}))
    return verl_result(guarded_scores(env, [solution_str], [sample])[0])


def compute_score(
    data_source: object = None,
    solution_str: object = None,
    ground_truth: object = None,
    extra_info: Mapping[str, object] | None = None,
    *,
    data_sources: Sequence[object] | None = None,
    solution_strs: Sequence[object] | None = None,
    ground_truths: Sequence[object] | None = None,
    extra_infos: Sequence[Mapping[str, object] | None] | None = None,
    **kwargs: object,
) -> dict[str, float] | list[dict[str, float]]:
    """Verl's ``custom_reward_function``: one item, or a batch (``data_sources=`` ...).

    Extra keywords from verl (``reward_router_address``, ``reward_kwargs`` entries) are accepted
    and ignored. Returns a dict with the keys ``VERL_KEYS``, or a list of them for the batch form.
    """
    if data_sources is not None:
        return compute_score_batch(
            data_sources=data_sources,
            solution_strs=solution_strs or [],
            ground_truths=ground_truths
            if ground_truths is not None
            else [None] * len(data_sources),
            extra_infos=extra_infos,
        )
    if data_source is None:
        raise TypeError("compute_score needs data_source (or data_sources= for a batch)")
    info = dict(extra_info or {})
    return verl_score(_env_of(data_source, info), str(solution_str), str(ground_truth), info)


def compute_score_batch(
    data_sources: Sequence[object],
    solution_strs: Sequence[object],
    ground_truths: Sequence[object],
    extra_infos: Sequence[Mapping[str, object] | None] | None = None,
    **kwargs: object,
) -> list[dict[str, float]]:
    """Verl's batch reward-manager form: each environment of the batch scores its items at once."""
    sources, texts, truths = list(data_sources), list(solution_strs), list(ground_truths)
    infos = [dict(i or {}) for i in extra_infos] if extra_infos is not None else [{}] * len(texts)
    if not len(sources) == len(texts) == len(truths) == len(infos):
        raise ValueError(
            f"batch of {len(sources)} data_sources, {len(texts)} solution_strs, {len(truths)} "
            f"ground_truths and {len(infos)} extra_infos: one of each per item"
        )
    results: list[dict[str, float] | None] = [None] * len(texts)
    groups: dict[int, tuple[Environment, list[int]]] = {}
    for i, (source, info) in enumerate(zip(sources, infos)):
        try:
            env = _env_of(source, info)
        except Exception as exc:  # an unknown id costs its items, named in the log, not the batch
            failure = Score.failure(Outcome.ERROR, f"cannot build {source!r}: {exc}"[:300])
            results[i] = verl_result(failure)
            continue
        groups.setdefault(id(env), (env, []))[1].append(i)
    for env, items in groups.values():
        samples = [_verl_sample(env, truths[i], infos[i]) for i in items]
        scores = guarded_scores(env, [texts[i] for i in items], samples)
        for i, score in zip(items, scores):
            results[i] = verl_result(score)
    return [
        r if r is not None else verl_result(Score.failure(Outcome.ERROR, "not scored"))
        for r in results
    ]


def to_verl_rows(env: Environment, split: str) -> list[dict[str, object]]:
    """Return ``env.dataset(split)`` as verl parquet rows (data_source, prompt, reward_model...).

    ``extra_info`` has the same keys for every environment (parquet needs one schema for a
    mixture): ``index``, ``id``, ``split``, ``metadata`` (JSON), ``env_entry_point`` and
    ``env_kwargs`` (JSON), which ``compute_score`` uses to rebuild the environment as it was built.
    """
    source, entry_point, kwargs_json = env_reference(env)
    rows = []
    for index, row in enumerate(env.dataset(split)):
        rows.append(
            {
                "data_source": source,
                "prompt": row["prompt"],
                "ability": env.env_id.split("/", 1)[0] if env.env_id else "",
                "reward_model": {"style": "rule", "ground_truth": row["answer"]},
                "extra_info": {
                    "index": index,
                    "id": row["id"],
                    "split": split,
                    "metadata": row["metadata"],
                    "env_entry_point": entry_point,
                    "env_kwargs": kwargs_json,
                },
            }
        )
    return rows
