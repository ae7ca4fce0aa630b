"""Per-language overhead of the sandbox, next to the same commands run natively.

Run: ``.venv/bin/python benchmarks/languages_bench.py [--runs N] [--workers N]``

For each language (``sandbox.Language``) it prints, for a hello-world program: the compile time
(compiled languages) and the run time in the sandbox (``ExecResult``: median of ``--runs``
runs, one worker; C++ also with ``<bits/stdc++.h>``, compiled against the sandbox's precompiled
header), the time per ``IOTest`` of a compiled job (its compile excluded), and the same
compile and run commands as plain subprocesses on this machine (``native``: the toolchain's own
argument lists, in a temporary folder; Python as ``python3 -I -S``). Then the throughput of
judging the reference solutions of ``grpo_envs/data/cpp_stdio.jsonl`` (and the Java/Rust ones
it carries) with ``run_tests_many`` on ``--workers`` workers. The numbers in
``sandbox/README.md`` ("Other languages") come from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

from grpo_envs.data import CPP_STDIO
from sandbox import IOTest, Limits, Sandbox, TestJob, require_language

HELLO = {
    "python": 'print("hello")\n',
    "cpp": '#include <cstdio>\nint main() { puts("hello"); }\n',
    "java": "public class Main {\n"
    '  public static void main(String[] a) { System.out.println("hello"); } }\n',
    "nodejs": 'console.log("hello");\n',
    "rust": 'fn main() { println!("hello"); }\n',
    "bash": "echo hello\n",
}
#: Most competitive-programming C++ includes everything: the precompiled header's case.
STDCXX = '#include <bits/stdc++.h>\nint main() { std::cout << "hello" << std::endl; }\n'
ROWS = [(language, language, code) for language, code in HELLO.items()]
ROWS.insert(2, ("cpp, <bits/stdc++.h>", "cpp", STDCXX))


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms" if values else "-"


def sandboxed(
    sb: Sandbox, language: str, runs: int, code: str | None = None
) -> tuple[str, str, str]:
    """Return the compile time, run time and time per IOTest of hello world in the sandbox."""
    code = HELLO[language] if code is None else code
    sb.run(code, language=language)  # warm: the first run of a slot pays for its start
    compiles, walls = [], []
    for _ in range(runs):
        res = sb.run(code, language=language)
        if res.stdout != "hello\n":
            raise SystemExit(f"{language}: {res}")
        walls.append(res.wall_s)
        if res.compile is not None:
            compiles.append(res.compile.wall_s)
    start = time.monotonic()
    report = sb.run_tests(code, [IOTest("", "hello\n")] * runs, language=language)
    spent = time.monotonic() - start - (report.compile.wall_s if report.compile else 0.0)
    if not report.all_passed:
        raise SystemExit(f"{language}: {report}")
    return _ms(compiles), _ms(walls), f"{spent / runs * 1000:.1f} ms"


def native(language: str, runs: int, code: str | None = None) -> tuple[str, str]:
    """Return the compile and run time of the same commands as plain subprocesses."""
    toolchain = require_language(language)
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, toolchain.source_name), "w") as handle:
            handle.write(HELLO[language] if code is None else code)
        os.mkdir(os.path.join(folder, "out"))
        compiles = []
        for _ in range(min(runs, 5) if toolchain.compiled else 0):
            start = time.monotonic()
            subprocess.run(list(toolchain.compile_argv), cwd=folder, check=True)
            compiles.append(time.monotonic() - start)
        argv = toolchain.run_command(1024)
        if language == "python":
            argv = ["/usr/bin/python3", "-I", "-S", "main.py"]
        walls = []
        for _ in range(runs):
            start = time.monotonic()
            out = subprocess.run(argv, cwd=folder, capture_output=True, text=True, check=True)
            walls.append(time.monotonic() - start)
            if out.stdout != "hello\n":
                raise SystemExit(f"{language} (native): {out}")
    return _ms(compiles), _ms(walls)


def problem_set(workers: int) -> str:
    """Judge every reference of the shipped C++ set (and its Java/Rust ones); throughput."""
    rows = [json.loads(line) for line in CPP_STDIO.read_text().splitlines()]
    jobs = []
    for row in rows:
        tests = tuple(IOTest(t["input"], t["output"]) for t in row["tests"])
        sources = {"cpp": row["solution"], **row.get("other_solutions", {})}
        for language, code in sources.items():
            jobs.append(TestJob(code, tests, language=language, limits=Limits(timeout_s=10)))
    with Sandbox(workers=workers) as sb:
        start = time.monotonic()
        reports = sb.run_tests_many(jobs)
        spent = time.monotonic() - start
    passed = sum(r.all_passed for r in reports)
    tests = sum(r.total for r in reports)
    return (
        f"{len(jobs)} jobs ({tests} tests, {passed} jobs passed) in {spent:.1f} s on {workers} "
        f"workers: {len(jobs) / spent:.2f} jobs/s, compile included"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    print("| language | compile: sandbox / native | run: sandbox / native | per test |")
    print("|---|---|---|---|")
    with Sandbox(workers=1) as sb:
        for label, language, code in ROWS:
            compile_s, run_s, per_test = sandboxed(sb, language, args.runs, code)
            native_compile, native_run = native(language, args.runs, code)
            print(
                f"| {label} | {compile_s} / {native_compile} | {run_s} / {native_run} "
                f"| {per_test} |"
            )
    print(problem_set(args.workers))


if __name__ == "__main__":
    main()
