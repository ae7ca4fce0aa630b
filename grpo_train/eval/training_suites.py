"""Benchmark suites evaluated during training (``eval_suites`` in the trainer config).

The suites run on the trainer's engine, apart from the training environments' evaluation, so
``eval/accuracy`` (which curricula and ``target_accuracy`` read) keeps its meaning; each suite
logs ``eval/<suite>/avg@<n>`` (and its standard error, pass@k, maj@k), plus
``eval/suites/macro_avg``. Reasoning blocks are removed before grading, as ``grpo eval`` does.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from grpo_train.eval.protocols import ThinkingTags
from grpo_train.rollout.base import SamplingConfig

if TYPE_CHECKING:
    from grpo_train.config import TrainConfig
    from grpo_train.episodes.prompts import PromptFormat
    from grpo_train.eval.runner import AnyTokenizer, EvalTask
    from grpo_train.rollout.base import RolloutEngine


@functools.lru_cache(maxsize=4)
def suite_tasks(spec: str) -> tuple[EvalTask, ...]:
    """Build the tasks of a ``--suite``-style spec once per process (environments cache data)."""
    import grpo_envs
    from grpo_train.eval.runner import EvalTask
    from grpo_train.eval.suites import resolve_tasks

    tasks = resolve_tasks(spec)
    return tuple(
        EvalTask(t.label, grpo_envs.make(t.env_id, **t.kwargs), thinking=ThinkingTags())
        for t in tasks
    )


def suite_sampling(cfg: TrainConfig) -> SamplingConfig:
    """Greedy for one sample per problem, else the rollout temperature and top_p."""
    n = cfg.data.eval_suite_samples
    max_new = cfg.rollout.max_completion_length
    if n == 1:
        return SamplingConfig(n=1, temperature=0.0, max_new_tokens=max_new)
    return SamplingConfig(
        n=n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, max_new_tokens=max_new
    )


def evaluate_suites(
    engine: RolloutEngine,
    tokenizer: AnyTokenizer,
    cfg: TrainConfig,
    prompt_format: PromptFormat | None = None,
) -> dict[str, float]:
    """Evaluate ``cfg.data.eval_suites``; metrics without the aggregate ``eval/accuracy``."""
    from grpo_train.eval.runner import evaluate

    summary = evaluate(
        engine,
        tokenizer,
        list(suite_tasks(cfg.data.eval_suites)),
        split="test",
        limit=cfg.data.eval_size or None,
        sampling=suite_sampling(cfg),
        max_prompt_tokens=cfg.data.max_prompt_length,
        progress=False,
        prompt_format=prompt_format,
    )
    metrics = summary.metrics("eval")
    for aggregate in ("eval/accuracy", "eval/macro_avg"):
        metrics.pop(aggregate, None)
    metrics["eval/suites/macro_avg"] = sum(r.accuracy for r in summary.results) / len(
        summary.results
    )
    return metrics
