"""Per-task metrics from sample records, and the markdown table printed at the end of a run."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from grpo_train.eval.passk import mean_pass_at_k
from grpo_train.eval.records import SampleRecord
from grpo_train.score_failures import FAILED_OUTCOMES

_FAILED_OUTCOME_VALUES = frozenset(o.value for o in FAILED_OUTCOMES)


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

    def metrics(self) -> dict[str, float]:
        """Flat scalar metrics for a logger (keys without the task prefix)."""
        out: dict[str, float] = {
            "accuracy": self.accuracy,
            "mean_reward": self.mean_reward,
            "mean_completion_tokens": self.mean_completion_tokens,
            "truncation_rate": self.truncation_rate,
            # Completions whose scoring failed (scorer raised, malformed reward, sandbox broke).
            "score_errors": float(
                sum(c for o, c in self.outcome_counts.items() if o in _FAILED_OUTCOME_VALUES)
            ),
        }
        out.update({f"pass@{k}": v for k, v in self.pass_at_k.items()})
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
        }


def summarize_task(
    label: str,
    env_id: str,
    records: Sequence[SampleRecord],
    *,
    n: int,
    ks: Sequence[int],
    greedy: bool,
) -> SuiteResult:
    """Aggregate the records of one task; every prompt must have exactly ``n`` completions."""
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
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def markdown_table(results: Sequence[SuiteResult]) -> str:
    """Render a markdown table with one row per task; percentages for rates."""
    ks = sorted({k for r in results for k in r.pass_at_k})
    header = ["suite", "prompts", "n", "acc %"]
    header += [f"pass@{k} %" for k in ks if k != 1]
    header += ["strict %", "flexible %", "mean tokens", "truncated %", "outcomes"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        row = [r.label, str(r.num_prompts), str(r.n), _pct(r.accuracy)]
        row += [_pct(r.pass_at_k.get(k)) for k in ks if k != 1]
        row += [
            _pct(r.strict_accuracy),
            _pct(r.flexible_accuracy),
            f"{r.mean_completion_tokens:.1f}",
            _pct(r.truncation_rate),
            ", ".join(f"{o}={c}" for o, c in r.outcome_counts.items()),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
