"""The speed numbers people quote: samples and completion tokens per second, time-to-target.

Pure functions of counts and of a run's metric rows (``metrics.jsonl``), so ``grpo train``'s
summary, the benchmarks and a finished run folder all report them the same way.

- Per step (logged with the step's metrics): ``throughput/samples_per_s`` (completions
  generated per second, every rank's, dynamic-sampling refills included) and
  ``throughput/completion_tokens_per_s``
  (their tokens per second), both over ``time/step``: generation, scoring, the update and the
  weight sync; evaluations and checkpoints are not part of a step.
- Per run (the summary): ``time_to_target``, the first step whose held-out accuracy
  (``eval/accuracy``) reached ``target_accuracy``, with the wall time (``time/elapsed``, which
  does include evaluations) at that step; unset, the first step at the best accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def step_throughput(samples: int, completion_tokens: int, seconds: float) -> dict[str, float]:
    """Return one step's ``samples_per_s`` and ``completion_tokens_per_s``.

    >>> step_throughput(32, 1600, 4.0)
    {'throughput/samples_per_s': 8.0, 'throughput/completion_tokens_per_s': 400.0}
    """
    seconds = max(seconds, 1e-9)
    return {
        "throughput/samples_per_s": samples / seconds,
        "throughput/completion_tokens_per_s": completion_tokens / seconds,
    }


def run_throughput(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Return a run's ``samples_per_s`` / ``completion_tokens_per_s``: totals over step time.

    Weighted by each step's ``time/step`` (so a slow step counts for its length, not as one
    rate among others); rows without the rates (the step-0 evaluation) are skipped; {} if none.

    >>> rate = ("throughput/samples_per_s", "throughput/completion_tokens_per_s")
    >>> rows = [{"step": 1, "time/step": 1.0, **dict(zip(rate, (8.0, 80.0)))},
    ...         {"step": 2, "time/step": 3.0, **dict(zip(rate, (4.0, 60.0)))}]
    >>> run_throughput(rows)
    {'throughput/samples_per_s': 5.0, 'throughput/completion_tokens_per_s': 65.0}
    """
    timed = [r for r in rows if "throughput/samples_per_s" in r and r.get("time/step", 0) > 0]
    seconds = sum(r["time/step"] for r in timed)
    if not timed or seconds <= 0:
        return {}
    return {
        name: sum(r[name] * r["time/step"] for r in timed) / seconds
        for name in ("throughput/samples_per_s", "throughput/completion_tokens_per_s")
    }


@dataclass(frozen=True)
class TimeToTarget:
    """When a run's held-out accuracy first reached the target (or its best)."""

    target: float | None
    """``target_accuracy``; None: the best accuracy of the run is the target."""
    step: int | None
    """The first step at or above the target (0: before training); None: never reached."""
    wall_s: float | None
    """Wall seconds of training at that step (0 for step 0); None: never reached."""
    accuracy: float | None
    """The held-out accuracy at that step."""
    best: float | None
    """The best held-out accuracy of the run; None: it never evaluated."""
    best_step: int | None = None
    """The first step at the best accuracy."""

    @property
    def reached(self) -> bool:
        """Return whether the target was reached."""
        return self.step is not None

    def describe(self) -> str:
        """Return the summary line.

        >>> TimeToTarget(0.5, 6, 123.4, 0.53, 0.6, 8).describe()
        'time to held-out accuracy >= 50.0%: step 6, 123 s (53.0% then; best 60.0% at step 8)'
        >>> TimeToTarget(0.5, None, None, None, 0.3, 2).describe()
        'held-out accuracy never reached the target 50.0% (best 30.0% at step 2)'
        """
        if self.best is None:
            return "time to target: no held-out evaluation (eval_size is 0)"
        if self.target is None:
            return (
                f"time to the best held-out accuracy ({self.best:.1%}): step {self.step}, "
                f"{self.wall_s:.0f} s (set target_accuracy to time a given value)"
            )
        if not self.reached:
            return (
                f"held-out accuracy never reached the target {self.target:.1%} "
                f"(best {self.best:.1%} at step {self.best_step})"
            )
        return (
            f"time to held-out accuracy >= {self.target:.1%}: step {self.step}, "
            f"{self.wall_s:.0f} s ({self.accuracy:.1%} then; best {self.best:.1%} at step "
            f"{self.best_step})"
        )


def elapsed_at(rows: Sequence[Mapping[str, float]], step: int) -> float:
    """Return the ``time/elapsed`` of the last row of ``step`` (0.0 when none has one).

    A resumed launch continues the clock of the checkpoint it resumed (its step's row).

    >>> elapsed_at([{"step": 4, "time/elapsed": 9.5}, {"step": 5, "time/elapsed": 12.0}], 4)
    9.5
    >>> elapsed_at([{"step": 0, "eval/accuracy": 0.1}], 0)
    0.0
    """
    found = 0.0
    for row in rows:
        if int(row.get("step", -1)) == step and row.get("time/elapsed") is not None:
            found = float(row["time/elapsed"])
    return found


def time_to_target(
    rows: Sequence[Mapping[str, float]], target: float | None = None
) -> TimeToTarget:
    """Find the first row whose ``eval/accuracy`` is at least ``target`` (None or 0: the best).

    ``rows``: a run's metric rows in file order. The wall time is ``time/elapsed`` (seconds since
    the run began training, evaluations included); a resumed launch continues the clock of its
    checkpoint's step (``elapsed_at``). Runs logged before that restarted the clock at 0: such a
    launch is offset by the last ``time/elapsed`` logged before it (time an interrupted launch
    spent after its last logged step is not counted). The step-0 evaluation
    (before training) is at 0 s.

    >>> rows = [{"step": 0, "eval/accuracy": 0.1}, {"step": 1, "time/elapsed": 5.0},
    ...         {"step": 2, "eval/accuracy": 0.5, "time/elapsed": 9.0},
    ...         {"step": 3, "eval/accuracy": 0.4, "time/elapsed": 2.0}]  # resumed at step 2
    >>> t = time_to_target(rows, 0.45)
    >>> t.step, t.wall_s, t.best
    (2, 9.0, 0.5)
    >>> time_to_target(rows).step, time_to_target(rows, 0.9).reached
    (2, False)
    """
    goal = target if target else None
    evals: list[tuple[int, float, float]] = []  # (step, accuracy, cumulative wall seconds)
    offset, last = 0.0, 0.0
    for row in rows:
        elapsed = row.get("time/elapsed")
        if elapsed is not None:
            if elapsed < last:  # a new launch (resume): its clock started again at 0
                offset += last
            last = elapsed
        accuracy = row.get("eval/accuracy")
        if accuracy is not None:
            wall = 0.0 if elapsed is None and int(row["step"]) == 0 else offset + last
            evals.append((int(row["step"]), float(accuracy), wall))
    if not evals:
        return TimeToTarget(goal, None, None, None, None)
    best = max(acc for _, acc, _ in evals)
    best_step = next(step for step, acc, _ in evals if acc == best)
    threshold = best if goal is None else goal
    hit = next(((s, acc, w) for s, acc, w in evals if acc >= threshold), None)
    if hit is None:
        return TimeToTarget(goal, None, None, None, best, best_step)
    return TimeToTarget(goal, hit[0], hit[2], hit[1], best, best_step)
