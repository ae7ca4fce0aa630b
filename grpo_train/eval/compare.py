"""Compare two evaluation runs: per-task accuracy deltas, a test, and a confidence interval.

The unit of a comparison is the problem when both runs scored the same problems (same env and
sample ids), since completions of one problem are not independent of each other:

- one completion per problem in each run (binary outcomes): the exact McNemar test, a two-sided
  binomial (sign) test on the discordant problems (solved by one run only), and Newcombe's hybrid
  score interval for a difference of paired proportions ("Improved confidence intervals for the
  difference between binomial proportions based on paired data", Newcombe 1998, method 10);
- several completions per problem (per-problem success rates): the exact paired sign-flip
  permutation test of the mean per-problem difference (Fisher's randomization test; all
  ``2**m`` sign patterns of the ``m`` non-zero differences up to ``EXACT_SIGN_FLIPS``, seeded
  random ones beyond), and the interval between the k-th smallest and k-th largest of the
  ``2**n - 1`` subset means of the differences ("Using subsample values as typical values",
  Hartigan 1969), the interval that inverts the same test; above ``EXACT_SUBSETS`` problems a
  seeded paired bootstrap (percentile) interval, a large-sample method.

A paired test cannot reach p <= alpha with fewer than ``log2(1/alpha) + 1`` problems that changed
in the same direction (six at 95 %): with fewer shared problems the difference is reported as not
resolvable, whatever its size. Runs with no shared problems and one completion per problem fall
back to Newcombe's hybrid score interval for two independent proportions ("Interval estimation
for the difference between independent proportions", Newcombe 1998, method 10), which keeps its
coverage at small counts and at 0 % and 100 %. With several completions per problem the problem
stays the unit there too: a two-sample permutation test of the per-problem rates (exact while
the splits are few) and a bootstrap interval resampling each run's problems; with so few
problems that no split can be significant, the row is not resolvable.
"""

from __future__ import annotations

import itertools
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

EXACT_SIGN_FLIPS = 16
"""Up to this many non-zero paired differences the permutation test enumerates all sign patterns."""
EXACT_SUBSETS = 16
"""Up to this many shared problems the paired interval enumerates every subset mean."""


class CIMethod(StrEnum):
    """How a delta's test and confidence interval were computed."""

    MCNEMAR = "paired-mcnemar"
    """Exact McNemar test, Newcombe's paired score interval (one completion per problem)."""
    PAIRED_PERMUTATION = "paired-permutation"
    """Sign-flip permutation test, subset-mean interval (several completions per problem)."""
    PAIRED_BOOTSTRAP = "paired-permutation+bootstrap"
    """Sign-flip permutation test, bootstrap interval (more than ``EXACT_SUBSETS`` problems)."""
    BINOMIAL = "unpaired-newcombe"
    """No shared problems, one completion each: Newcombe's hybrid score interval."""
    UNPAIRED_PROBLEMS = "unpaired-permutation"
    """No shared problems, several completions per problem: the problem is the unit (its
    completions are not independent draws): a two-sample permutation test of the per-problem
    rates and a bootstrap interval that resamples problems within each run."""


@dataclass(frozen=True)
class TaskRates:
    """One task of one run: success rate per sample id, and the success/trial totals."""

    label: str
    rates: dict[str, float]
    """``env_id/sample_id`` -> fraction of that prompt's completions that succeeded."""
    successes: int
    trials: int
    completions: dict[str, int] | None = None
    """``env_id/sample_id`` -> how many completions of that prompt were scored (1 when absent)."""

    @property
    def accuracy(self) -> float:
        """Mean success over all completions."""
        return self.successes / self.trials

    def completions_of(self, sample: str) -> int:
        """How many completions of ``sample`` were scored."""
        return 1 if self.completions is None else self.completions[sample]


@dataclass(frozen=True)
class CompareRow:
    """The delta (B - A) of one task's accuracy, with its test and confidence interval."""

    label: str
    accuracy_a: float
    accuracy_b: float
    delta: float
    ci_low: float
    ci_high: float
    method: CIMethod
    num_samples: int
    """Shared problems (paired), the smaller run's problems (unpaired, several completions per
    problem) or the smaller run's completions (unpaired, one completion per problem)."""
    p_value: float | None = None
    """Two-sided p-value of the test; None for unpaired runs with one completion per problem
    (Newcombe's interval decides)."""
    confidence: float = 0.95
    min_detectable: float | None = None
    """Smallest |delta| the paired test could call significant with these problems; None when no
    difference can be (too few problems) or for unpaired runs."""
    resolvable: bool = True
    """False when no outcome at this sample size could be significant."""

    @property
    def significant(self) -> bool:
        """The test rejects no difference at 1 - confidence; without a test, the CI excludes 0."""
        if self.p_value is not None:
            return self.p_value <= 1 - self.confidence + 1e-12
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
            completions={sid: len(v) for sid, v in per_sample.items()},
        )
    return out


def min_changed_problems(confidence: float = 0.95) -> int:
    """Fewest problems that must all change in one direction for a paired test to reach p <= alpha.

    The smallest two-sided p-value of a sign test (or sign-flip test) on ``k`` non-zero
    differences is ``2 * 0.5**k``.

    >>> min_changed_problems(0.95)  # 2 * 0.5**5 = 0.0625 > 0.05, 2 * 0.5**6 = 0.03125
    6
    >>> min_changed_problems(0.99)  # 2 * 0.5**8 = 0.0078
    8
    """
    _check_confidence(confidence)
    alpha = 1 - confidence
    k = 1
    while 2 * 0.5**k > alpha + 1e-12:
        k += 1
    return k


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: a binomial(k, 1/2) test on the ``k`` discordant problems.

    >>> mcnemar_exact_p(0, 5)  # 2 * 0.5**5
    0.0625
    >>> mcnemar_exact_p(1, 6)  # 2 * (1 + 7) / 2**7
    0.125
    >>> mcnemar_exact_p(3, 3)
    1.0
    """
    if only_a < 0 or only_b < 0:
        raise ValueError(f"discordant counts must be >= 0, got {only_a}, {only_b}")
    k = only_a + only_b
    if k == 0:
        return 1.0
    tail = sum(math.comb(k, i) for i in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2**k)


def newcombe_paired_ci(
    both: int, only_a: int, only_b: int, neither: int, *, confidence: float = 0.95
) -> tuple[float, float, float]:
    """``p_b - p_a`` of paired binary outcomes and Newcombe's (1998) paired method-10 interval.

    ``both``/``neither``: problems both runs solved/failed; ``only_a``/``only_b``: problems only
    run A/B solved. The two Wilson intervals are combined with the correlation ``phi`` of the
    2x2 table, corrected as in the paper (0 when ``0 <= ad - bc <= n/2``).
    """
    n = both + only_a + only_b + neither
    if min(both, only_a, only_b, neither) < 0 or n == 0:
        raise ValueError(
            f"paired counts must be >= 0 with a positive total, got {both, only_a, only_b, neither}"
        )
    _check_confidence(confidence)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    pb, pa = (both + only_b) / n, (both + only_a) / n
    lb, ub = _wilson(both + only_b, n, z)
    la, ua = _wilson(both + only_a, n, z)
    margins = (both + only_b) * (only_a + neither) * (both + only_a) * (only_b + neither)
    cross = both * neither - only_b * only_a
    corrected = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = corrected / math.sqrt(margins) if margins > 0 else 0.0
    d = pb - pa
    low = d - math.sqrt(max(0.0, (pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa) + (ua - pa) ** 2))
    high = d + math.sqrt(
        max(0.0, (ub - pb) ** 2 - 2 * phi * (ub - pb) * (pa - la) + (pa - la) ** 2)
    )
    return d, max(-1.0, low), min(1.0, high)


def sign_flip_p(diffs: Sequence[float], *, resamples: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of ``mean(diffs) == 0``.

    Exact (every sign pattern of the non-zero differences) up to ``EXACT_SIGN_FLIPS`` of them;
    beyond, ``resamples`` seeded random patterns with the ``(1 + hits) / (1 + resamples)``
    estimate, which never understates p.

    >>> sign_flip_p([0.5, 0.5, 0.0])  # patterns of two: sums 1, 0, 0, -1; |sum| >= 1 in 2 of 4
    0.5
    >>> sign_flip_p([1.0, 1.0, 1.0, 1.0, 1.0])  # 2 of 32 patterns reach |sum| = 5
    0.0625
    """
    d = np.asarray(diffs, dtype=np.float64)
    nonzero = d[d != 0]
    if nonzero.size == 0:
        return 1.0
    observed = abs(nonzero.sum())
    tolerance = 1e-9 * max(1.0, float(np.abs(nonzero).sum()))
    if nonzero.size <= EXACT_SIGN_FLIPS:
        patterns = np.array(np.meshgrid(*[[1.0, -1.0]] * nonzero.size)).reshape(nonzero.size, -1)
        sums = np.abs(nonzero @ patterns)
        return float(np.mean(sums >= observed - tolerance))
    rng = np.random.default_rng(seed)
    hits = 0
    chunk = max(1, 2_000_000 // nonzero.size)
    for lo in range(0, resamples, chunk):
        signs = rng.choice([-1.0, 1.0], size=(min(chunk, resamples - lo), nonzero.size))
        hits += int(np.sum(np.abs(signs @ nonzero) >= observed - tolerance))
    return (1 + hits) / (1 + resamples)


def subset_mean_ci(diffs: Sequence[float], *, confidence: float = 0.95) -> tuple[float, float]:
    """Hartigan's (1969) interval for the mean of paired differences, from their subset means.

    The k-th smallest and k-th largest of the ``2**n - 1`` subset
    means, ``k = floor(alpha * 2**(n-1))``, cover the center of a symmetric distribution
    with probability ``1 - 2k / 2**n``. With ``k == 0`` (fewer than ``min_changed_problems``
    differences) no interval narrower than the whole range exists: ``(-1, 1)``.

    >>> subset_mean_ci([0.5, 0.0, 0.0, 0.0, 0.0])  # 5 problems: k = floor(0.05 * 16) = 0
    (-1.0, 1.0)
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0 or d.size > EXACT_SUBSETS:
        raise ValueError(f"subset means need 1 to {EXACT_SUBSETS} differences, got {d.size}")
    _check_confidence(confidence)
    k = math.floor((1 - confidence) * 2 ** (d.size - 1) + 1e-9)
    if k == 0:
        return -1.0, 1.0
    members = (np.arange(1, 2**d.size)[:, None] >> np.arange(d.size)[None, :]) & 1
    means = np.sort((members @ d) / members.sum(axis=1))
    return float(means[k - 1]), float(means[-k])


def paired_bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean of ``b - a`` and its percentile bootstrap interval over paired items.

    A large-sample interval: below a few dozen items its coverage falls short of ``confidence``
    (``compare_rates`` uses it only above ``EXACT_SUBSETS`` problems).
    """
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
    low, high = _percentile_interval(np.concatenate(means), confidence)
    return float(diff.mean()), low, high


def _percentile_interval(boot: np.ndarray, confidence: float) -> tuple[float, float]:
    """Return the central ``confidence`` share of bootstrap estimates (percentile interval)."""
    alpha = 1.0 - confidence
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def two_sample_permutation_p(
    xs: Sequence[float], ys: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> float:
    """Two-sided p-value of ``mean(ys) == mean(xs)``: relabelling the pooled items at random.

    Exact (every split of the pooled items) while there are at most 20,000 splits; beyond,
    ``resamples`` seeded random splits with the ``(1 + hits) / (1 + resamples)`` estimate.

    >>> two_sample_permutation_p([0.0, 0.0], [1.0, 1.0])  # 2 of the 6 splits are as extreme
    0.3333333333333333
    """
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if x.size == 0 or y.size == 0:
        raise ValueError(f"a two-sample test needs items on both sides ({x.size}, {y.size})")
    pooled = np.concatenate([x, y])
    observed = abs(y.mean() - x.mean())
    tolerance = 1e-9 * max(1.0, float(np.abs(pooled).max()))
    total = pooled.sum()

    def gaps(y_sums: np.ndarray) -> np.ndarray:
        return np.abs(y_sums / y.size - (total - y_sums) / x.size)

    if math.comb(pooled.size, y.size) <= 20_000:
        splits = np.array(list(itertools.combinations(range(pooled.size), y.size)))
        return float(np.mean(gaps(pooled[splits].sum(axis=1)) >= observed - tolerance))
    rng = np.random.default_rng(seed)
    sums = np.array(
        [pooled[rng.permutation(pooled.size)[: y.size]].sum() for _ in range(resamples)]
    )
    return (1 + int(np.sum(gaps(sums) >= observed - tolerance))) / (1 + resamples)


def two_sample_bootstrap_ci(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``mean(ys) - mean(xs)`` and its percentile bootstrap interval, items resampled per side."""
    _check_confidence(confidence)
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boot = y[rng.integers(0, y.size, size=(resamples, y.size))].mean(axis=1) - x[
        rng.integers(0, x.size, size=(resamples, x.size))
    ].mean(axis=1)
    low, high = _percentile_interval(boot, confidence)
    return float(y.mean() - x.mean()), low, high


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


def _paired_row(
    label: str,
    a: TaskRates,
    b: TaskRates,
    shared: list[str],
    *,
    confidence: float,
    resamples: int,
    seed: int,
) -> CompareRow:
    xa = [a.rates[s] for s in shared]
    xb = [b.rates[s] for s in shared]
    diffs = [vb - va for va, vb in zip(xa, xb, strict=True)]
    n = len(shared)
    need = min_changed_problems(confidence)
    most = max(max(a.completions_of(s), b.completions_of(s)) for s in shared)
    resolvable = n >= need
    min_detectable = need / (most * n) if resolvable else None
    binary = all(a.completions_of(s) == 1 and b.completions_of(s) == 1 for s in shared)
    if binary:
        only_a = sum(1 for va, vb in zip(xa, xb, strict=True) if va > vb)
        only_b = sum(1 for va, vb in zip(xa, xb, strict=True) if vb > va)
        both = sum(1 for va, vb in zip(xa, xb, strict=True) if va == vb == 1)
        delta, low, high = newcombe_paired_ci(
            both, only_a, only_b, n - both - only_a - only_b, confidence=confidence
        )
        p_value = mcnemar_exact_p(only_a, only_b)
        method = CIMethod.MCNEMAR
    else:
        p_value = sign_flip_p(diffs, resamples=resamples, seed=seed)
        if n <= EXACT_SUBSETS:
            delta = sum(diffs) / n
            low, high = subset_mean_ci(diffs, confidence=confidence)
            method = CIMethod.PAIRED_PERMUTATION
        else:
            delta, low, high = paired_bootstrap_ci(
                xa, xb, confidence=confidence, resamples=resamples, seed=seed
            )
            method = CIMethod.PAIRED_BOOTSTRAP
    return CompareRow(
        label, sum(xa) / n, sum(xb) / n, delta, low, high, method, n,
        p_value=p_value, confidence=confidence, min_detectable=min_detectable,
        resolvable=resolvable,
    )  # fmt: skip


def compare_rates(
    run_a: dict[str, TaskRates],
    run_b: dict[str, TaskRates],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> list[CompareRow]:
    """One row per task present in both runs (in run A's order)."""
    _check_confidence(confidence)
    shared_tasks = [label for label in run_a if label in run_b]
    if not shared_tasks:
        raise ValueError(f"the runs share no task: A has {sorted(run_a)}, B has {sorted(run_b)}")
    rows = []
    for label in shared_tasks:
        a, b = run_a[label], run_b[label]
        shared = sorted(set(a.rates) & set(b.rates))
        if shared:
            rows.append(
                _paired_row(
                    label, a, b, shared, confidence=confidence, resamples=resamples, seed=seed
                )
            )
            continue
        if a.trials > len(a.rates) or b.trials > len(b.rates):
            rows.append(
                _unpaired_problems_row(
                    label, a, b, confidence=confidence, resamples=resamples, seed=seed
                )
            )
            continue
        delta, low, high = newcombe_ci(
            a.successes, a.trials, b.successes, b.trials, confidence=confidence
        )
        # Not resolvable when even 0 % against 100 % leaves zero inside the interval.
        _, extreme_low, _ = newcombe_ci(0, a.trials, b.trials, b.trials, confidence=confidence)
        rows.append(
            CompareRow(
                label, a.accuracy, b.accuracy, delta, low, high,
                CIMethod.BINOMIAL, min(a.trials, b.trials), confidence=confidence,
                resolvable=extreme_low > 0,
            )
        )  # fmt: skip
    return rows


def _unpaired_problems_row(
    label: str, a: TaskRates, b: TaskRates, *, confidence: float, resamples: int, seed: int
) -> CompareRow:
    """Different problems, several completions each: the per-problem rates are the items."""
    xs, ys = list(a.rates.values()), list(b.rates.values())
    delta, low, high = two_sample_bootstrap_ci(
        xs, ys, confidence=confidence, resamples=resamples, seed=seed
    )
    p = two_sample_permutation_p(xs, ys, resamples=resamples, seed=seed)
    # The smallest p any outcome can reach: the observed split alone among all splits, twice.
    floor = min(1.0, 2 / math.comb(len(xs) + len(ys), len(ys)))
    return CompareRow(
        label, a.accuracy, b.accuracy, delta, low, high, CIMethod.UNPAIRED_PROBLEMS,
        min(len(xs), len(ys)), p_value=p, confidence=confidence,
        resolvable=floor <= 1 - confidence + 1e-12,
    )  # fmt: skip


def _pp(value: float) -> str:
    return f"{100 * value:+.1f}"


def compare_table(rows: Sequence[CompareRow], name_a: str, name_b: str) -> str:
    """Render the deltas as a markdown table, in percentage points."""
    lines = [
        f"| suite | A: {name_a} % | B: {name_b} % | delta (B-A) pp | CI | p | method | problems |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " *" if r.significant else ""
        p_text = "-" if r.p_value is None else f"{r.p_value:.3g}"
        size = f"{r.num_samples}" if r.p_value is not None else f"{r.num_samples} completions"
        lines.append(
            f"| {r.label} | {100 * r.accuracy_a:.1f} | {100 * r.accuracy_b:.1f} | "
            f"{_pp(r.delta)}{mark} | [{_pp(r.ci_low)}, {_pp(r.ci_high)}] | {p_text} | "
            f"{r.method.value} | {size} |"
        )
    return "\n".join(lines)


def compare_notes(rows: Sequence[CompareRow]) -> list[str]:
    """List what the table can and cannot claim: the significance rule, each unresolvable row."""
    if not rows:
        return []
    level = f"{100 * rows[0].confidence:g}%"
    alpha = f"{1 - rows[0].confidence:.3g}"
    need = min_changed_problems(rows[0].confidence)
    notes = [
        f"* significant at {level}: rows with a p-value p <= {alpha}; unpaired rows with one "
        "completion per problem: Newcombe's interval lies on one side of 0"
    ]
    for r in rows:
        if not r.resolvable and r.method is CIMethod.UNPAIRED_PROBLEMS:
            notes.append(
                f"{r.label}: not resolvable with {r.num_samples} problems per run (different "
                f"problems in each): no split of so few problems is significant at {level}; "
                "evaluate more problems, or the same problems in both runs"
            )
        elif not r.resolvable and r.p_value is not None:
            notes.append(
                f"{r.label}: not resolvable with {r.num_samples} problems: a paired test at "
                f"{level} needs at least {need} problems that changed in the same direction, "
                "whatever the delta; evaluate more problems"
            )
        elif not r.resolvable:
            notes.append(
                f"{r.label}: not resolvable with {r.num_samples} completions per run: even "
                f"0% against 100% is not significant at {level}"
            )
        elif not r.significant and r.min_detectable is not None:
            notes.append(
                f"{r.label}: no significant difference; the smallest delta this test can "
                f"detect with {r.num_samples} problems is {100 * r.min_detectable:.1f} pp "
                f"({need} problems changing in one direction)"
            )
    return notes


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
