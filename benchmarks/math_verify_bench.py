"""Score the labeled math-verification set with grpo_envs.math and with Math-Verify, side by side.

    .venv/bin/python benchmarks/math_verify_bench.py            # both verifiers, full table
    .venv/bin/python benchmarks/math_verify_bench.py --only ours --show-errors

The set (benchmarks/data/math_verify_cases.jsonl) holds (gold, completion, label) triples:
GSM8K-style solutions, MATH-style LaTeX answers, known false-positive traps, answer formats and
hostile inputs. A false positive is a wrong completion judged correct (the costly error for RL);
a false negative a right one judged wrong. Throughput is items/s over the whole set, single
process (one call after another) and batched (2 processes: ``verify_batch(workers=2)`` for ours,
a fork ``multiprocessing.Pool(2)`` for Math-Verify, whose SIGALRM timeouts need a main thread).

Math-Verify is given the final answer of a GSM8K solution (the text after '####') and LaTeX golds
wrapped in ``$...$``, as its documentation shows; our verifier gets the raw gold field.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CASES = Path(__file__).parent / "data" / "math_verify_cases.jsonl"


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    gold: str
    completion: str
    label: bool


@dataclass(frozen=True)
class Run:
    name: str
    verdicts: list[bool]
    single_s: float | None
    batched_s: float | None


def load_cases(path: Path) -> list[Case]:
    cases = []
    with path.open() as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                cases.append(
                    Case(d["id"], d["category"], d["gold"], d["completion"], bool(d["label"]))
                )
    return cases


# --- Math-Verify --------------------------------------------------------------------------


def mv_gold(gold: str) -> str:
    if "####" in gold:
        return gold.split("####")[-1].strip()
    if "$" in gold or "\\boxed" in gold:
        return gold
    return f"${gold}$"


def mv_one(item: tuple[str, str]) -> bool:
    from math_verify import parse, verify

    gold, completion = item
    try:
        return bool(verify(parse(mv_gold(gold)), parse(completion)))
    except Exception:
        return False


def run_math_verify(cases: list[Case], batched: bool, workers: int) -> Run:
    import math_verify  # noqa: F401 - imported before forking, so workers start warm

    items = [(c.gold, c.completion) for c in cases]
    mv_one(("1", "1"))  # warm up its parser
    batched_s = None
    pooled: list[bool] = []
    if batched:
        # Forked before the single-process run, so no cache it fills is inherited.
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers) as pool:
            pool.map(mv_one, [("1", "1")] * workers)  # warm
            t0 = time.perf_counter()
            pooled = pool.map(mv_one, items, chunksize=4)
            batched_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    single = [mv_one(it) for it in items]
    single_s = time.perf_counter() - t0
    if batched and pooled != single:
        diff = sum(a != b for a, b in zip(pooled, single))
        print(f"note: math-verify pooled and single runs disagree on {diff} items (timeouts)")
    return Run("math-verify", single, single_s, batched_s)


# --- ours ---------------------------------------------------------------------------------


def _cold_start(workers: int) -> None:
    """Fresh workers and empty caches, so no run profits from the previous one."""
    from grpo_envs.math.pool import get_pool, shutdown_pool

    # (the submodule, not the function of the same name that grpo_envs.math exports)
    verify_module = importlib.import_module("grpo_envs.math.verify")
    shutdown_pool()
    verify_module._gold_node.cache_clear()
    get_pool(workers).warm_up()


def run_ours(cases: list[Case], batched: bool, workers: int, timeout_s: float) -> Run:
    from grpo_envs.math import verify, verify_batch

    _cold_start(workers)
    t0 = time.perf_counter()
    single = [verify(c.gold, c.completion, timeout_s).correct for c in cases]
    single_s = time.perf_counter() - t0
    batched_s = None
    if batched:
        _cold_start(workers)
        t0 = time.perf_counter()
        results = verify_batch(
            [c.gold for c in cases], [c.completion for c in cases], timeout_s, workers=workers
        )
        batched_s = time.perf_counter() - t0
        pooled = [r.correct for r in results]
        if pooled != single:
            diff = sum(a != b for a, b in zip(pooled, single))
            print(f"note: ours batched and single runs disagree on {diff} items (timeouts)")
    return Run("grpo_envs.math", single, single_s, batched_s)


# --- report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    accuracy: float
    false_pos: int
    false_neg: int
    errors_by_category: dict[str, int]


def score(cases: list[Case], verdicts: list[bool]) -> Metrics:
    fp = sum(1 for c, v in zip(cases, verdicts) if v and not c.label)
    fn = sum(1 for c, v in zip(cases, verdicts) if c.label and not v)
    by_cat = Counter(c.category for c, v in zip(cases, verdicts) if v != c.label)
    acc = 1 - (fp + fn) / len(cases)
    return Metrics(acc, fp, fn, dict(by_cat))


def rate(n: int, seconds: float | None) -> str:
    return f"{n / seconds:,.0f}" if seconds else "-"


def print_table(cases: list[Case], runs: list[Run]) -> None:
    n = len(cases)
    cats = sorted({c.category for c in cases})
    n_right = sum(c.label for c in cases)
    print(
        f"\n{n} cases ({n_right} correct, {n - n_right} wrong); "
        f"categories: {dict(Counter(c.category for c in cases))}\n"
    )
    cols = ["accuracy", "errors", "FP", "FN", "items/s 1p", "items/s 2p"]
    widths = [9, 8, 5, 5, 12, 12]
    header = f"{'verifier':<16}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths))
    print(header)
    print("-" * len(header))
    for run in runs:
        m = score(cases, run.verdicts)
        cells = [
            f"{m.accuracy:.3f}",
            m.false_pos + m.false_neg,
            m.false_pos,
            m.false_neg,
            rate(n, run.single_s),
            rate(n, run.batched_s),
        ]
        print(f"{run.name:<16}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    for run in runs:
        errs = score(cases, run.verdicts).errors_by_category
        print(
            f"errors by category, {run.name}: " + ", ".join(f"{c}={errs.get(c, 0)}" for c in cats)
        )
    if len(runs) == 2 and runs[0].batched_s and runs[1].batched_s:
        print(
            f"batched speed-up of {runs[0].name} over {runs[1].name}: "
            f"{runs[1].batched_s / runs[0].batched_s:.1f}x"
        )


def print_errors(cases: list[Case], run: Run) -> None:
    print(f"\n{run.name} errors:")
    for c, v in zip(cases, run.verdicts):
        if v != c.label:
            kind = "FP" if v else "FN"
            print(f"  {kind} {c.id}: gold={c.gold[-60:]!r} completion={c.completion[-90:]!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    ap.add_argument("--only", choices=["ours", "math-verify"], default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0, help="our per-item timeout (seconds)")
    ap.add_argument("--no-batched", action="store_true")
    ap.add_argument("--show-errors", action="store_true")
    args = ap.parse_args(argv)
    cases = load_cases(args.cases)
    runs = []
    if args.only in (None, "ours"):
        runs.append(run_ours(cases, not args.no_batched, args.workers, args.timeout))
    if args.only in (None, "math-verify"):
        runs.append(run_math_verify(cases, not args.no_batched, args.workers))
    print_table(cases, runs)
    if args.show_errors:
        for run in runs:
            print_errors(cases, run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
