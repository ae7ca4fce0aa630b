"""``benchmarks/remote_sandbox_bench.py``: every mode scores, checks its verdicts, and reports."""

from __future__ import annotations

import dataclasses
import json
import re

from bench_scripts import load

bench = load("remote_sandbox_bench")

MODES = {"humaneval": ["local", "grpo"], "cpp": ["local", "grpo", "sandbox_fusion"]}


def test_a_tiny_run_passes_every_reference_in_every_mode_and_prints_the_tables(
    tmp_path, capsys
) -> None:
    out_json = tmp_path / "run.json"
    args = ["--humaneval", "3", "--cpp", "2", "--rounds", "1", "--json", str(out_json)]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    rows = [line for line in out.splitlines() if re.match(r"\| (humaneval|cpp) \|", line)]
    assert [line.split(" | ")[:3] for line in rows] == [
        ["| humaneval", "local", "3"],
        ["| humaneval", "grpo", "3"],
        ["| cpp", "local", "2"],
        ["| cpp", "grpo", "2"],
        ["| cpp", "sandbox_fusion", "2"],
    ]
    assert all(line.count("|") == 10 and line.endswith("| 0 |") for line in rows)
    for published in bench.SANDBOX_FUSION_PUBLISHED:
        assert f"| {published.what} |" in out
    assert "NOT a like-for-like comparison" in out
    record = json.loads(out_json.read_text())
    assert record["failures"] == []
    summaries = {(s["workload"], s["mode"]): s for s in record["summaries"]}
    assert sorted(summaries) == sorted((w, m) for w, modes in MODES.items() for m in modes)
    for (workload, mode), summary in summaries.items():
        assert summary["problems"] == (3 if workload == "humaneval" else 2)
        assert summary["problems_per_s"] > 0 and summary["failures"] == 0
        assert (summary["ratio_to_local"] is None) == (mode == "local")
        if workload == "cpp":  # compiles: CPU over the clock tick, in the sandbox's processes
            assert (
                summary["cpu_ms_per_problem"]["sandbox"]
                > 10 * summary["cpu_ms_per_problem"]["client"]
            )
    # Every (workload, mode) was timed once per round, remote ones against the service.
    assert len(record["measures"]) == len(summaries)


def test_a_wrong_solution_is_a_failure_in_every_mode() -> None:
    workloads = [bench.humaneval_workload(1), bench.cpp_workload(1)]
    broken = {
        "humaneval": "```python\ndef has_close_elements(numbers, threshold):\n    return None\n```",
        "cpp": '```cpp\n#include <cstdio>\nint main() { puts("0"); }\n```',
    }
    with bench.serving(1) as service:
        try:
            for workload in workloads:
                wrong = dataclasses.replace(workload, completions=(broken[workload.name],))
                for mode in workload.modes:
                    good = bench.score(workload, mode, service, 1, 1, 0)
                    bad = bench.score(wrong, mode, service, 1, 1, 0)
                    assert good.failures == (), (workload.name, mode, good.failures)
                    assert len(bad.failures) == 1, (workload.name, mode)
                    assert bad.failures[0].startswith(f"{workload.samples[0].id}: failed")
        finally:
            bench.close_shared_sandboxes()
