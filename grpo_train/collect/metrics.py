"""The metrics a step computes besides the loss: rollout statistics, averages, memory peaks.

Rollout statistics (rewards per component and environment, group statistics, lengths), the
token-weighted averaging of per-micro-batch metrics, and this process's peak memory. The run log
(``grpo_train.run.run_log``) writes them.
"""

from __future__ import annotations

import resource
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from grpo_envs.types import Outcome
from grpo_train.algorithm.advantages import group_stats
from grpo_train.collect.score_failures import scoring_failed
from grpo_train.parallel import distributed
from grpo_train.run.throughput import step_throughput

if TYPE_CHECKING:
    from grpo_train.collect.groups import Group


class MetricSums:
    """Token-weighted averages of per-micro-batch metrics (``*_min`` / ``*_max`` keep extremes)."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._weights: dict[str, float] = defaultdict(float)
        self._extremes: dict[str, float] = {}

    def add(self, metrics: Mapping[str, float], tokens: float) -> None:
        """Add one micro-batch's metrics, weighted by its number of completion tokens."""
        for key, value in metrics.items():
            if key.endswith(("_min", "_max")):
                pick = min if key.endswith("_min") else max
                self._extremes[key] = pick(self._extremes.get(key, value), value)
            else:
                self._sums[key] += value * tokens
                self._weights[key] += tokens

    def merge(self, other: MetricSums) -> None:
        """Fold another rank's sums into these (averages stay token-weighted over both)."""
        for key, value in other._sums.items():
            self._sums[key] += value
            self._weights[key] += other._weights[key]
        for key, value in other._extremes.items():
            pick = min if key.endswith("_min") else max
            self._extremes[key] = pick(self._extremes.get(key, value), value)

    def merged_over_ranks(self) -> MetricSums:
        """Fold every other rank's sums into these and return them (collective).

        Exact on the main rank, which logs. World size 1: these sums as they are.
        """
        for other in distributed.gather_objects([self])[1:]:
            self.merge(other)
        return self

    def result(self) -> dict[str, float]:
        """Return the averages and extremes."""
        out = {k: v / self._weights[k] for k, v in self._sums.items() if self._weights[k] > 0}
        return {**out, **self._extremes}


def rollout_metrics(groups: Sequence[Group], env_names: Sequence[str]) -> dict[str, float]:
    """Return reward (overall, per component, per env), accuracy, group and length statistics."""
    stats = group_stats(torch.tensor([g.rewards for g in groups], dtype=torch.float64))
    scores = [s for g in groups for s in g.scores]
    completions = [c for g in groups for c in g.completions]
    lengths = [n for g in groups for n in g.sampled_lengths]  # sampled ids only
    m = {
        "reward/mean": stats.reward_mean,
        "reward/std": stats.reward_std,
        "group/reward_std": stats.group_std_mean,
        "group/frac_zero_std": stats.frac_zero_std,
        "accuracy": sum(s.correct for s in scores) / len(scores),
        # Failed scores (scorer raised, malformed reward, broken sandbox): left out of training.
        # Shares, like every rate beside them, so that steps of different sizes compare.
        "score/error_share": sum(scoring_failed(s) for s in scores) / len(scores),
        "score/dropped_group_share": sum(g.dropped for g in groups) / len(groups),
        "score/timeout_share": sum(s.outcome is Outcome.TIMEOUT for s in scores) / len(scores),
        # The sandbox itself failed (a local slot, or remote services: dead, hung, overloaded):
        # the part of error_share that is the sandbox's, not the scorer's.
        "score/sandbox_error_share": sum(s.outcome is Outcome.SANDBOX_ERROR for s in scores)
        / len(scores),
        "length/mean": sum(lengths) / len(lengths),
        "length/max": float(max(lengths)),
        "length/clipped_frac": sum(c.truncated for c in completions) / len(completions),
    }
    per_component: dict[str, list[float]] = defaultdict(list)
    per_env: dict[str, list[float]] = defaultdict(list)
    for g in groups:
        per_env[env_names[g.env_index]] += g.rewards
        for s in g.scores:
            for comp in s.components:
                per_component[comp.name].append(comp.value)
    m.update({f"reward/component/{k}": sum(v) / len(v) for k, v in per_component.items()})
    m.update({f"reward/env/{k}": sum(v) / len(v) for k, v in per_env.items()})
    return m


class RemoteSandboxCounts:
    """Per step: what the remote sandbox services of every rank did (``sandbox.remote``).

    ``step_metrics`` returns the requests, retries, failovers and failed jobs since its last call,
    summed over ranks (a collective: every rank calls it), as ``sandbox/*`` metrics; nothing for
    steps that sent no request (the local sandbox).
    """

    def __init__(self) -> None:
        from sandbox.remote import process_stats

        self._seen = process_stats()

    def step_metrics(self) -> dict[str, float]:
        """Return this step's ``sandbox/*`` counts (empty when no request was sent)."""
        from sandbox.remote import process_stats

        now = process_stats()
        step, self._seen = now.minus(self._seen), now
        requests, retries, failovers, failed = distributed.global_sum(
            step.requests, step.retries, step.failovers, step.failures
        )
        if not requests:
            return {}
        return {
            "sandbox/requests": requests,
            "sandbox/retries": retries,
            "sandbox/failovers": failovers,
            "sandbox/failed_jobs": failed,
        }


@dataclass(frozen=True)
class PeakMemory:
    """Peak memory of this process since start (or the last ``reset_peak_memory``)."""

    rss_mb: float
    """Maximum resident set size of the process in MiB (never reset by the OS)."""
    cuda_allocated_mb: float | None
    """``torch.cuda.max_memory_allocated`` in MiB; None without CUDA."""
    cuda_reserved_mb: float | None
    """``torch.cuda.max_memory_reserved`` in MiB (near nvidia-smi's); None without CUDA."""


def peak_memory() -> PeakMemory:
    """Read the process's peak host RSS and, with CUDA, the peak allocated / reserved GPU memory."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_mb = rss / (2**20 if sys.platform == "darwin" else 2**10)  # bytes on macOS, KiB on Linux
    if not torch.cuda.is_available():
        return PeakMemory(rss_mb, None, None)
    return PeakMemory(
        rss_mb,
        torch.cuda.max_memory_allocated() / 2**20,
        torch.cuda.max_memory_reserved() / 2**20,
    )


def reset_peak_memory() -> None:
    """Start a new CUDA peak-memory window (host RSS peaks cannot be reset)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory_mb() -> float:
    """Return the peak memory of this process in MiB: CUDA max allocated on GPU, max RSS on CPU."""
    peak = peak_memory()
    return peak.rss_mb if peak.cuda_allocated_mb is None else peak.cuda_allocated_mb


def step_metrics(
    sampled: Sequence[Group], times: Mapping[str, float], lr: float
) -> dict[str, float]:
    """Time split, throughput, peak memory, learning rate of one step.

    ``tokens_per_s``: this rank's sampled tokens per second; ``throughput/samples_per_s``
    and ``throughput/completion_tokens_per_s``: every rank's completions and their sampled
    tokens (an episode's environment ids are not counted; collective: every rank calls it).
    """
    total = sum(times.values())
    new_tokens = sum(sum(g.sampled_lengths) for g in sampled)
    samples = sum(len(g.completions) for g in sampled)
    m = {f"time/{k}": v for k, v in times.items()}
    m.update({"time/step": total, "tokens_per_s": new_tokens / max(total, 1e-9)})
    every_samples, every_tokens = distributed.global_sum(samples, new_tokens)
    m.update(step_throughput(int(every_samples), int(every_tokens), total))
    m.update({"memory/peak_mb": peak_memory_mb(), "lr": lr})
    return m
