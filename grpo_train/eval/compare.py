"""Compare two evaluation runs: per-task accuracy deltas with confidence intervals.

When both runs scored the same samples (same env and sample ids) the interval comes from a seeded
paired bootstrap over those shared samples (the per-sample success rate of run B minus run A,
resampled with replacement; Efron & Tibshirani 1993, percentile interval). Pairing removes the
between-problem variance, which dominates on benchmarks of a few hundred problems. Runs with no
shared samples fall back to Newcombe's hybrid score interval for a difference of two independent
binomial proportions (Newcombe 1998, "Interval estimation for the difference between independent
proportions", method 10), which stays inside [-1, 1] and behaves at 0 % and 100 %.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from statistics import NormalDist

import numpy as np

from grpo_train.eval.records import SampleRecord, SampleStore
from grpo_train.eval.runner import SAMPLES_FILE, SUMMARY_FILE


class CIMethod(StrEnum):
    """How a delta's confidence interval was computed."""

    PAIRED_BOOTSTRAP = "paired-bootstrap"
    BINOMIAL = "binomial"


@dataclass(frozen=True)
class TaskRates:
    """One task of one run: success rate per sample id, and the success/trial totals."""

    label: str
    rates: dict[str, float]
    """``env_id/sample_id`` -> fraction of that prompt's completions that succeeded."""
    successes: int
    trials: int

    @property
    def accuracy(self) -> float:
        """Mean success over all completions."""
        return self.successes / self.trials


@dataclass(frozen=True)
class CompareRow:
    """The delta (B - A) of one task's accuracy, with its confidence interval."""

    label: str
    accuracy_a: float
    accuracy_b: float
    delta: float
    ci_low: float
    ci_high: float
    method: CIMethod
    num_samples: int
    """Shared samples (paired) or the smaller run's completions (binomial)."""

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        return self.ci_low > 0 or self.ci_high < 0


def load_run(run_dir: str | Path) -> dict[str, TaskRates]:
    """Read a run folder's ``samples.jsonl`` into per-task success rates."""
    path = Path(run_dir) / SAMPLES_FILE
    if not path.is_file():
        raise ValueError(
            f"{run_dir} is not an eval run folder (no {SAMPLES_FILE}); run `grpo eval --out` first"
        )
    return rates_from_records(SampleStore(path).records())


def rates_from_records(records: Sequence[SampleRecord]) -> dict[str, TaskRates]:
    """Group records by task and sample: the success rate of each prompt."""
    grouped: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        grouped[r.task][f"{r.env_id}/{r.sample_id}"].append(r.success)
    out = {}
    for label, per_sample in grouped.items():
        trials = sum(len(v) for v in per_sample.values())
        out[label] = TaskRates(
            label=label,
            rates={sid: sum(v) / len(v) for sid, v in per_sample.items()},
            successes=sum(sum(v) for v in per_sample.values()),
            trials=trials,
        )
    return out


def paired_bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean of ``b - a`` and its percentile bootstrap interval over paired items."""
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(
            f"paired bootstrap needs two equal, non-empty sequences ({len(a)}, {len(b)})"
        )
    _check_confidence(confidence)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1 (e.g. 10000), got {resamples}")
    diff = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    rng = np.random.default_rng(seed)
    # Resample in chunks so 10k resamples of a few thousand items stay small in memory.
    means = []
    chunk = max(1, 2_000_000 // len(diff))
    for lo in range(0, resamples, chunk):
        idx = rng.integers(0, len(diff), size=(min(chunk, resamples - lo), len(diff)))
        means.append(diff[idx].mean(axis=1))
    boot = np.concatenate(means)
    alpha = 1.0 - confidence
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(diff.mean()), float(low), float(high)


def _wilson(successes: int, trials: int, z: float) -> tuple[float, float]:
    p = successes / trials
    denom = 1 + z * z / trials
    center = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return center - half, center + half


def newcombe_ci(
    successes_a: int, trials_a: int, successes_b: int, trials_b: int, *, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Difference ``p_b - p_a`` of two independent proportions and Newcombe's hybrid interval."""
    if trials_a < 1 or trials_b < 1:
        raise ValueError("binomial interval needs at least one trial in each run")
    _check_confidence(confidence)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    pa, pb = successes_a / trials_a, successes_b / trials_b
    la, ua = _wilson(successes_a, trials_a, z)
    lb, ub = _wilson(successes_b, trials_b, z)
    d = pb - pa
    return d, d - math.hypot(pb - lb, ua - pa), d + math.hypot(ub - pb, pa - la)


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence}")


def compare_rates(
    run_a: dict[str, TaskRates],
    run_b: dict[str, TaskRates],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> list[CompareRow]:
    """One row per task present in both runs (in run A's order)."""
    shared_tasks = [label for label in run_a if label in run_b]
    if not shared_tasks:
        raise ValueError(f"the runs share no task: A has {sorted(run_a)}, B has {sorted(run_b)}")
    rows = []
    for label in shared_tasks:
        a, b = run_a[label], run_b[label]
        shared = sorted(set(a.rates) & set(b.rates))
        if shared:
            xa = [a.rates[s] for s in shared]
            xb = [b.rates[s] for s in shared]
            delta, low, high = paired_bootstrap_ci(
                xa, xb, confidence=confidence, resamples=resamples, seed=seed
            )
            rows.append(
                CompareRow(
                    label, sum(xa) / len(xa), sum(xb) / len(xb), delta, low, high,
                    CIMethod.PAIRED_BOOTSTRAP, len(shared),
                )
            )  # fmt: skip
        else:
            delta, low, high = newcombe_ci(
                a.successes, a.trials, b.successes, b.trials, confidence=confidence
            )
            rows.append(
                CompareRow(
                    label, a.accuracy, b.accuracy, delta, low, high,
                    CIMethod.BINOMIAL, min(a.trials, b.trials),
                )
            )  # fmt: skip
    return rows


def compare_table(rows: Sequence[CompareRow], name_a: str, name_b: str) -> str:
    """Render the deltas as a markdown table, in percentage points."""
    lines = [
        f"| suite | A: {name_a} % | B: {name_b} % | delta (B-A) pp | CI | method | samples |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " *" if r.significant else ""
        lines.append(
            f"| {r.label} | {100 * r.accuracy_a:.1f} | {100 * r.accuracy_b:.1f} | "
            f"{100 * r.delta:+.1f}{mark} | [{100 * r.ci_low:+.1f}, {100 * r.ci_high:+.1f}] | "
            f"{r.method.value} | {r.num_samples} |"
        )
    return "\n".join(lines)


def plot_deltas(rows: Sequence[CompareRow], path: str | Path, *, title: str = "") -> Path:
    """Bar chart of the deltas with their intervals as error bars, saved as PNG."""
    # The object-oriented API with an explicit Agg canvas: no global backend switch, no display.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(max(4.0, 1.2 * len(rows) + 2), 3.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(rows))
    deltas = np.array([100 * r.delta for r in rows])
    err = np.array(
        [[100 * (r.delta - r.ci_low) for r in rows], [100 * (r.ci_high - r.delta) for r in rows]]
    )
    colors = ["tab:green" if d > 0 else "tab:red" for d in deltas]
    ax.bar(x, deltas, yerr=err, capsize=4, color=colors)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, [r.label for r in rows], rotation=20, ha="right")
    ax.set_ylabel("accuracy delta (B - A), pp")
    ax.set_title(title or "accuracy delta with CI")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def compare_runs(
    run_a: str | Path,
    run_b: str | Path,
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> list[CompareRow]:
    """Compare two run folders (see the module docstring)."""
    return compare_rates(
        load_run(run_a), load_run(run_b), confidence=confidence, resamples=resamples, seed=seed
    )


def _summary_results(run_dir: str | Path) -> dict[str, dict[str, object]]:
    path = Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        return {}
    import json

    raw = json.loads(path.read_text())
    results = raw.get("results") if isinstance(raw, dict) else None
    if not isinstance(results, list):
        return {}
    return {str(r.get("label")): r for r in results if isinstance(r, dict)}


def _fmt(value: object, se: object = None) -> str:
    if not isinstance(value, int | float):
        return "-"
    text = f"{100 * value:.1f}"
    return text + (f" ± {100 * se:.1f}" if isinstance(se, int | float) else "")


def metric_table(run_a: str | Path, run_b: str | Path) -> str:
    """Both runs' avg@n (± its standard error), pass@k and maj@k per shared task, from summary.json.

    Empty when either run has no summary (an interrupted run).
    """
    a, b = _summary_results(run_a), _summary_results(run_b)
    shared = [label for label in a if label in b]
    if not shared:
        return ""
    lines = ["| suite | metric | A % | B % |", "|---|---|---|---|"]
    for label in shared:
        ra, rb = a[label], b[label]
        lines.append(
            f"| {label} | avg@n (n {ra.get('n')} / {rb.get('n')}) | "
            f"{_fmt(ra.get('accuracy'), ra.get('avg_se'))} | "
            f"{_fmt(rb.get('accuracy'), rb.get('avg_se'))} |"
        )
        for key, name in (("pass_at_k", "pass"), ("maj_at_k", "maj")):
            ka, kb = ra.get(key), rb.get(key)
            if not isinstance(ka, dict) or not isinstance(kb, dict):
                continue
            for k in sorted(set(ka) & set(kb), key=int):
                if name == "pass" and k == "1":
                    continue  # pass@1 is avg@n
                lines.append(f"| {label} | {name}@{k} | {_fmt(ka[k])} | {_fmt(kb[k])} |")
    return "\n".join(lines)
