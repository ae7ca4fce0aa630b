"""benchmarks/languages_bench.py: its measurements run and report in the table's format."""

from __future__ import annotations

import re

from bench_scripts import load

from sandbox import Sandbox

bench = load("languages_bench")


def test_sandboxed_and_native_measurements() -> None:
    with Sandbox(workers=1) as sb:
        compile_s, run_s, per_test = bench.sandboxed(sb, "cpp", 2)
    for value in (compile_s, run_s, per_test):
        assert re.fullmatch(r"\d+\.\d ms", value), value
    native_compile, native_run = bench.native("bash", 2)
    assert native_compile == "-"  # bash has no compile step
    assert re.fullmatch(r"\d+\.\d ms", native_run), native_run
