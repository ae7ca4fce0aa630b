"""``benchmarks/overlap_scoring.py``: its step scores real programs, alike both ways."""

from __future__ import annotations

import argparse

from bench_scripts import load

bench = load("overlap_scoring")


def test_the_benchmark_step_runs_its_tests_and_scores_alike_with_and_without_overlap(
    tiny_model_path, tmp_path, capsys
) -> None:
    from transformers import AutoTokenizer

    args = argparse.Namespace(
        prompts=2, generations=3, test_seconds=0.2, group_seconds=0.3, workers=2
    )
    tasks = tmp_path / "tasks.jsonl"
    bench.write_tasks(tasks, 8)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    steps = {
        overlap: bench.run_step(bench.make_collector(args, tasks, tokenizer, overlap), 1)
        for overlap in (False, True)
    }
    # Sample 0 of each group returns x + 1 (fails its test), the others pass: the programs ran.
    assert steps[False].rewards == steps[True].rewards == (0.0, 1.0, 1.0) * 2
    assert steps[False].hidden == 0 and steps[True].hidden > 0
    assert steps[False].score > 0.15  # at least one round of 0.2 s tests after generation
    assert bench.main(["--prompts", "1", "--generations", "2", "--test_seconds", "0.1",
                       "--group_seconds", "0.1", "--rounds", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "rewards equal with and without overlap: True" in out and "| on |" in out
