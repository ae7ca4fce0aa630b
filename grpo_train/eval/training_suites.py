"""Benchmark suites evaluated during training (``eval_suites`` in the trainer config).

The suites run on the trainer's engine, apart from the training environments' evaluation, so
``eval/accuracy`` (which curricula and ``target_accuracy`` read) keeps its meaning; each suite
logs ``eval/<suite>/avg@<n>`` (and its standard error, pass@k, maj@k), plus
``eval/suites/macro_avg``. Reasoning blocks are removed before grading, as ``grpo eval`` does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo_train.eval.protocols import ThinkingTags
from grpo_train.rollout.base import SamplingConfig

if TYPE_CHECKING:
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


@dataclass(frozen=True)
class SuiteSettings:
    """What the training-time suites read of the run's configuration.

    ``setup.settings`` builds it.
    """

    suites: str
    """``grpo eval`` suite names or env ids, comma-separated (``eval_suites``)."""
    size: int
    """Problems per suite, the first ones (``eval_size``); 0: all of them."""
    samples: int
    """Completions per problem: 1 is greedy (``eval_suite_samples``)."""
    max_prompt_length: int
    max_completion_length: int
    temperature: float
    """The rollout temperature, for more than one sample per problem."""
    top_p: float


def suite_sampling(settings: SuiteSettings) -> SamplingConfig:
    """Greedy for one sample per problem, else the rollout temperature and top_p."""
    n = settings.samples
    max_new = settings.max_completion_length
    if n == 1:
        return SamplingConfig(n=1, temperature=0.0, max_new_tokens=max_new)
    return SamplingConfig(
        n=n, temperature=settings.temperature, top_p=settings.top_p, max_new_tokens=max_new
    )


def evaluate_suites(
    engine: RolloutEngine,
    tokenizer: AnyTokenizer,
    settings: SuiteSettings,
    prompt_format: PromptFormat | None = None,
) -> dict[str, float]:
    """Evaluate ``settings.suites``; metrics without the aggregate ``eval/accuracy``."""
    from grpo_train.eval.runner import evaluate

    summary = evaluate(
        engine,
        tokenizer,
        list(suite_tasks(settings.suites)),
        split="test",
        limit=settings.size or None,
        sampling=suite_sampling(settings),
        max_prompt_tokens=settings.max_prompt_length,
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
