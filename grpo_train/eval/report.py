"""Per-task metrics from sample records, and the markdown table printed at the end of a run."""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from grpo_train.collect.score_failures import FAILED_OUTCOMES
from grpo_train.eval.metrics import (
    Equivalence,
    TieRule,
    avg_at_k,
    exact_equivalence,
    macro_average,
    maj_at_k,
    math_equivalence,
)
from grpo_train.eval.passk import mean_pass_at_k
from grpo_train.eval.records import SampleRecord

_FAILED_OUTCOME_VALUES = frozenset(o.value for o in FAILED_OUTCOMES)
#: Outcomes whose extracted text is no answer of the model's (it does not vote in maj@k).
_NO_ANSWER_OUTCOMES = frozenset({"unparsable", "error"})


def answer_equivalence(env_id: str) -> Equivalence | None:
    """How maj@k compares answers of an env: the math verifier, exact text, or None (no vote).

    Code answers are programs: two programs that differ in text may both pass, so code tasks get
    no majority vote. Countdown answers are expressions judged by evaluation, not compared.
    """
    if env_id.startswith("code/") or "countdown" in env_id:
        return None
    if env_id.startswith("math/"):
        return math_equivalence
    return exact_equivalence


@dataclass(frozen=True)
class SuiteResult:
    """Metrics of one task (one env within a suite) over the evaluated prompts."""

    label: str
    env_id: str
    num_prompts: int
    num_completions: int
    n: int
    """Completions per prompt."""
    greedy: bool
    """Temperature 0, n = 1: ``accuracy`` is greedy accuracy."""
    accuracy: float
    """Mean success over all completions (equals the unbiased pass@1)."""
    pass_at_k: Mapping[int, float]
    """Unbiased pass@k (Chen et al. 2021) for each requested k <= n."""
    mean_reward: float
    mean_completion_tokens: float
    truncation_rate: float
    outcome_counts: Mapping[str, int]
    strict_accuracy: float | None = None
    """Math: accuracy when only the required answer format counts (None: not a math task)."""
    flexible_accuracy: float | None = None
    """Math: accuracy with flexible answer extraction (None: not a math task)."""
    avg_se: float | None = None
    """Standard error of ``accuracy`` (avg@n) across prompts (``metrics.avg_at_k``)."""
    avg_se_sampling: float | None = None
    """The part of ``avg_se`` due to drawing only ``n`` completions per prompt."""
    maj_at_k: Mapping[int, float] = field(default_factory=dict)
    """maj@k (majority vote over equivalent extracted answers) for each k in 2..n reported."""

    @property
    def avg_at_n(self) -> float:
        """avg@n: the mean over prompts of the fraction of their n completions that succeed."""
        return self.accuracy

    def metrics(self) -> dict[str, float]:
        """Flat scalar metrics for a logger (keys without the task prefix)."""
        out: dict[str, float] = {
            "accuracy": self.accuracy,
            "mean_reward": self.mean_reward,
            "mean_completion_tokens": self.mean_completion_tokens,
            "truncation_rate": self.truncation_rate,
            # The share of completions whose scoring failed (scorer raised, malformed reward,
            # sandbox broke): a rate like the others here.
            "score_error_rate": sum(
                c for o, c in self.outcome_counts.items() if o in _FAILED_OUTCOME_VALUES
            )
            / max(1, self.num_completions),
        }
        out.update({f"pass@{k}": v for k, v in self.pass_at_k.items()})
        out[f"avg@{self.n}"] = self.accuracy
        if self.avg_se is not None:
            out[f"avg@{self.n}_se"] = self.avg_se
        out.update({f"maj@{k}": v for k, v in self.maj_at_k.items()})
        if self.strict_accuracy is not None:
            out["strict_accuracy"] = self.strict_accuracy
        if self.flexible_accuracy is not None:
            out["flexible_accuracy"] = self.flexible_accuracy
        return out

    def to_json(self) -> dict[str, object]:
        """JSON-ready form for ``summary.json``."""
        return {
            "label": self.label,
            "env_id": self.env_id,
            "num_prompts": self.num_prompts,
            "num_completions": self.num_completions,
            "n": self.n,
            "greedy": self.greedy,
            "accuracy": self.accuracy,
            "pass_at_k": {str(k): v for k, v in self.pass_at_k.items()},
            "mean_reward": self.mean_reward,
            "mean_completion_tokens": self.mean_completion_tokens,
            "truncation_rate": self.truncation_rate,
            "outcome_counts": dict(self.outcome_counts),
            "strict_accuracy": self.strict_accuracy,
            "flexible_accuracy": self.flexible_accuracy,
            f"avg@{self.n}": self.accuracy,
            "avg_se": self.avg_se,
            "avg_se_sampling": self.avg_se_sampling,
            "maj_at_k": {str(k): v for k, v in self.maj_at_k.items()},
        }


def summarize_task(
    label: str,
    env_id: str,
    records: Sequence[SampleRecord],
    *,
    n: int,
    ks: Sequence[int],
    greedy: bool,
    tie: TieRule = TieRule.SPLIT,
) -> SuiteResult:
    """Aggregate the records of one task; every prompt must have exactly ``n`` completions.

    avg@n and its standard errors, pass@k for each ``k <= n``, maj@k for each ``1 < k <= n``
    (tasks whose answers can be compared: ``answer_equivalence``).
    """
    if not records:
        raise ValueError(f"task {label!r} has no scored samples (empty split or --limit 0?)")
    by_prompt: dict[str, list[SampleRecord]] = defaultdict(list)
    for r in records:
        by_prompt[r.sample_id].append(r)
    incomplete = [sid for sid, rs in by_prompt.items() if len(rs) != n]
    if incomplete:
        raise ValueError(
            f"task {label!r}: {len(incomplete)} prompt(s) lack some of their n={n} completions, "
            f"e.g. {incomplete[0]!r}"
        )
    counts = [(n, sum(r.success for r in rs)) for rs in by_prompt.values()]
    total = len(records)
    ordered = [sorted(rs, key=lambda r: r.gen_index) for rs in by_prompt.values()]
    avg = avg_at_k([[r.success for r in rs] for rs in ordered])
    equivalent = answer_equivalence(env_id)
    maj: dict[int, float] = {}
    if equivalent is not None:
        # Each k re-clusters the same answers: compare each pair once.
        equivalent = functools.lru_cache(maxsize=65536)(equivalent)
        votes = [
            [(None if r.outcome in _NO_ANSWER_OUTCOMES else r.extracted, r.success) for r in rs]
            for rs in ordered
        ]
        maj = {k: maj_at_k(votes, k, equivalent, tie) for k in ks if 1 < k <= n}
    strict = [r.strict_correct for r in records if r.strict_correct is not None]
    flexible = [r.flexible_correct for r in records if r.flexible_correct is not None]
    return SuiteResult(
        label=label,
        env_id=env_id,
        num_prompts=len(by_prompt),
        num_completions=total,
        n=n,
        greedy=greedy,
        accuracy=sum(r.success for r in records) / total,
        pass_at_k={k: mean_pass_at_k(counts, k) for k in ks if k <= n},
        mean_reward=sum(r.reward for r in records) / total,
        mean_completion_tokens=sum(r.num_tokens for r in records) / total,
        truncation_rate=sum(r.truncated for r in records) / total,
        outcome_counts=dict(sorted(Counter(r.outcome for r in records).items())),
        strict_accuracy=sum(strict) / len(strict) if strict else None,
        flexible_accuracy=sum(flexible) / len(flexible) if flexible else None,
        avg_se=avg.se,
        avg_se_sampling=avg.se_sampling,
        maj_at_k=maj,
    )


def overall(results: Sequence[SuiteResult]) -> dict[str, float | int | None]:
    """Return the macro average of the tasks' avg@n (each counts once) and the micro average.

    ``micro`` weights every completion alike (``eval/accuracy``); ``macro`` is the "Avg" column of
    papers' tables, with ``sqrt(sum se^2) / S`` as its standard error.
    """
    macro = macro_average([(r.accuracy, r.avg_se) for r in results])
    total = sum(r.num_completions for r in results)
    return {
        "macro_avg": macro.value,
        "macro_avg_se": macro.se,
        "micro_avg": sum(r.accuracy * r.num_completions for r in results) / total,
        "num_tasks": macro.num_suites,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def markdown_table(results: Sequence[SuiteResult]) -> str:
    """Render a markdown table with one row per task; percentages for rates."""
    ks = sorted({k for r in results for k in r.pass_at_k})
    maj_ks = sorted({k for r in results for k in r.maj_at_k})
    header = ["suite", "prompts", "n", "avg@n %", "± se"]
    header += [f"pass@{k} %" for k in ks if k != 1]
    header += [f"maj@{k} %" for k in maj_ks]
    header += ["strict %", "flexible %", "mean tokens", "truncated %", "outcomes"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        row = [r.label, str(r.num_prompts), str(r.n), _pct(r.accuracy), _pct(r.avg_se)]
        row += [_pct(r.pass_at_k.get(k)) for k in ks if k != 1]
        row += [_pct(r.maj_at_k.get(k)) for k in maj_ks]
        row += [
            _pct(r.strict_accuracy),
            _pct(r.flexible_accuracy),
            f"{r.mean_completion_tokens:.1f}",
            _pct(r.truncation_rate),
            ", ".join(f"{o}={c}" for o, c in r.outcome_counts.items()),
        ]
        lines.append("| " + " | ".join(row) + " |")
    if len(results) > 1:
        avg = overall(results)
        row = ["overall (macro)", str(sum(r.num_prompts for r in results)), "-"]
        row += [_pct(avg["macro_avg"]), _pct(avg["macro_avg_se"])]
        lines.append("| " + " | ".join(row + ["-"] * (len(header) - len(row))) + " |")
    return "\n".join(lines)
