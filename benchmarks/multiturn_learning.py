"""The multi-turn learning proof: the embedded model learns to use feedback, single-turn beside it.

Trains the embedded SmolLM2-135M-Instruct twice with ``grpo train``, each run in its own process,
one after the other, with the same settings (the quick start's: group 8, 4 prompts per step,
learning rate 2e-5, temperature 1):

- ``benchmarks/configs/add2-feedback.yaml``: ``math/add2-feedback-v0``, episodes of up to 3 turns
  (a wrong answer is told "N is not right: it is too low / too high", never the answer);
- ``benchmarks/configs/add2-feedback-single.yaml``: the same task with one turn (exactly the
  quick start's ``math/arithmetic-v0 task=add2 answer=loose``).

Held-out success is the trainer's own evaluation before the first step, every 4 steps and after
the last (greedy, the first ``eval_size`` test problems; multi-turn: right within 3 turns).
Training time is the sum of the steps' wall time (``time/step``: generation, scoring, update,
weight sync), without the engine's start and the evaluations, which are shown apart; the second
table gives each evaluation with the training seconds spent until then, and marks the last one
within the 15-minute budget::

    python benchmarks/multiturn_learning.py                  # both runs, then the table
    python benchmarks/multiturn_learning.py --parallel       # both at once (half the machine each)
    python benchmarks/multiturn_learning.py --max_steps 2    # smoke
    python benchmarks/multiturn_learning.py --table-only     # the table of runs already made

The budget is 15 minutes of training on 2 CPU cores: say the load (sampled every 30 s and
printed) beside the numbers; on a shared machine the wall time measures the scheduler's share,
and each run's CPU seconds (its whole process tree, engine included) are what the load cannot
stretch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The proof's training budget: 15 minutes on 2 CPU cores.
BUDGET_S = 15 * 60.0
CONFIGS = {
    "3 turns": ROOT / "benchmarks" / "configs" / "add2-feedback.yaml",
    "1 turn": ROOT / "benchmarks" / "configs" / "add2-feedback-single.yaml",
    "3 turns, Qwen3 template": ROOT / "benchmarks" / "configs" / "add2-feedback-qwen3.yaml",
}


@dataclass(frozen=True)
class Outcome:
    """What one run measured."""

    name: str
    before: float | None
    after: float | None
    steps: int
    train_s: float
    wall_s: float
    cpu_s: float
    """CPU seconds of the run's whole process tree (user + system): what the load cannot stretch."""
    turns_mean: float | None
    env_token_share: float | None
    curve: tuple[tuple[int, float, float], ...] = ()
    """Every evaluation as (step, training seconds up to that step, held-out success)."""

    def within(self, budget_s: float) -> tuple[int, float, float] | None:
        """The last evaluation after at most ``budget_s`` seconds of training (None: none was).

        >>> Outcome("x", 0.1, 0.6, 3, 30.0, 40.0, 0.0, None, None,
        ...         ((0, 0.0, 0.1), (2, 18.0, 0.4), (3, 30.0, 0.6))).within(20.0)
        (2, 18.0, 0.4)
        """
        inside = [point for point in self.curve if point[1] <= budget_s]
        return inside[-1] if inside else None


def read_rows(run_dir: Path) -> list[dict[str, float]]:
    """The run's ``metrics.jsonl`` rows (empty when it has none)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def outcome_of(
    name: str, rows: Sequence[dict[str, float]], wall_s: float, cpu_s: float = 0.0
) -> Outcome:
    """Summarise a run from its metric rows.

    >>> rows = [{"step": 0, "eval/accuracy": 0.1}, {"step": 1, "time/step": 5.0},
    ...         {"step": 2, "time/step": 7.0, "eval/accuracy": 0.5, "episodes/turns_mean": 2.0}]
    >>> o = outcome_of("x", rows, 20.0)
    >>> (o.before, o.after, o.steps, o.train_s, o.turns_mean)
    (0.1, 0.5, 2, 12.0, 2.0)
    """
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "time/step" in r]
    turns = [r["episodes/turns_mean"] for r in steps if "episodes/turns_mean" in r]
    share_key = "episodes/environment_token_share"
    share = [r[share_key] for r in steps if share_key in r]
    curve, trained = [], 0.0
    for r in rows:
        trained += r.get("time/step", 0.0)  # an evaluation row follows its step's time
        if "eval/accuracy" in r:
            curve.append((int(r["step"]), trained, r["eval/accuracy"]))
    return Outcome(
        name,
        evals[0] if evals else None,
        evals[-1] if len(evals) > 1 else None,
        len(steps),
        sum(r["time/step"] for r in steps),
        wall_s,
        cpu_s,
        turns[-1] if turns else None,
        share[-1] if share else None,
        tuple(curve),
    )


def start(config: Path, out: Path, extra: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start ``grpo train`` on ``config`` into ``out`` (log in ``out.log``)."""
    cmd = [sys.executable, "-m", "grpo_train.cli", "train", "--config", str(config)]
    cmd += ["--output_dir", str(out), "--overwrite", *extra]
    with open(f"{out}.log", "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def finish(run: subprocess.Popen[bytes], started: float) -> tuple[float, float]:
    """Wait for a run; return its wall and CPU seconds (user + system).

    ``os.wait4`` gives this child's own usage, its waited-for descendants included (vLLM's
    engine core and worker), also while another run goes at the same time.
    """
    _, status, usage = os.wait4(run.pid, 0)
    run.returncode = os.waitstatus_to_exitcode(status)
    if run.returncode != 0:
        print(f"{run.args[4]}: grpo train exited {run.returncode}; see its log", file=sys.stderr)
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def wait_for_engine(run_dir: Path, timeout_s: float = 300.0) -> None:
    """Wait until the run's log says its engine is up (or ``timeout_s``)."""
    log, end = Path(f"{run_dir}.log"), time.monotonic() + timeout_s
    while time.monotonic() < end:
        text = log.read_text(errors="replace") if log.is_file() else ""
        if "engine ready" in text or "Traceback" in text:
            return
        time.sleep(5)


class LoadWatch:
    """The 1-minute load average, read every ``every`` seconds while the runs go."""

    def __init__(self, every: float = 30.0) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(every,), daemon=True)
        self._thread.start()

    def _watch(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> str:
        """Stop watching; return "start S, min A, max B, end E"."""
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        s = self.samples
        return f"start {s[0]:.1f}, min {min(s):.1f}, max {max(s):.1f}, end {s[-1]:.1f}"


def pct(value: float | None) -> str:
    """A share as a percentage, or a dash."""
    return "-" if value is None else f"{100 * value:.1f}%"


def table(outcomes: Sequence[Outcome]) -> str:
    """The side-by-side table of the runs."""
    lines = [
        "| task | held-out success before | after | steps | training s | whole run s "
        "| CPU s | turns / episode (last step) | environment tokens |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for o in outcomes:
        turns = "-" if o.turns_mean is None else f"{o.turns_mean:.2f}"
        lines.append(
            f"| {o.name} | {pct(o.before)} | {pct(o.after)} | {o.steps} | {o.train_s:.0f} "
            f"| {o.wall_s:.0f} | {o.cpu_s:.0f} | {turns} | {pct(o.env_token_share)} |"
        )
    return "\n".join(lines)


def curve_table(outcomes: Sequence[Outcome], budget_s: float = BUDGET_S) -> str:
    """Held-out success at every evaluation, with the training seconds spent until then.

    The last evaluation within ``budget_s`` of training is marked: what the budget bought.
    """
    lines = [
        "| task | step | training s so far | held-out success |",
        "| --- | ---: | ---: | ---: |",
    ]
    for o in outcomes:
        best = o.within(budget_s)
        for point in o.curve:
            mark = f" (last within {budget_s / 60:.0f} min)" if point == best else ""
            lines.append(f"| {o.name} | {point[0]} | {point[1]:.0f} | {pct(point[2])}{mark} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Train both runs (unless ``--table-only``) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "multiturn-learning")
    parser.add_argument("--runs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--max_steps", type=int, default=None)
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="start both runs at once (each then has about half the machine; CPU s stay apart)",
    )
    args = parser.parse_args(argv)
    extra = [] if args.max_steps is None else ["--max_steps", str(args.max_steps)]
    args.out.mkdir(parents=True, exist_ok=True)
    load = LoadWatch()
    dirs = {name: args.out / name.replace(" ", "-") for name in args.runs}
    used = dict.fromkeys(args.runs, (0.0, 0.0))
    if not args.table_only and args.parallel:
        runs: dict[int, tuple[str, float]] = {}
        for name in args.runs:
            if runs:  # two vLLM engines starting at once can pick the same port
                wait_for_engine(dirs[runs[max(runs)][0]])
            runs[start(CONFIGS[name], dirs[name], extra).pid] = (name, time.perf_counter())
        while runs:
            pid, status, usage = os.wait4(-1, 0)
            if pid not in runs:
                continue
            name, t = runs.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                print(f"{name}: grpo train exited {code}; see {dirs[name]}.log", file=sys.stderr)
            used[name] = (time.perf_counter() - t, usage.ru_utime + usage.ru_stime)
    elif not args.table_only:
        for name in args.runs:
            t = time.perf_counter()
            used[name] = finish(start(CONFIGS[name], dirs[name], extra), t)
    outcomes = [outcome_of(n, read_rows(dirs[n]), *used[n]) for n in args.runs]
    print(f"\nload average (1 minute, every 30 s): {load.stop()}\n")
    print(table(outcomes))
    print()
    print(curve_table(outcomes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
