"""The multi-turn benchmarks' arithmetic: the table's ratio and parts, a run's summary."""

import json

from bench_scripts import load

bench = load("multiturn_bench")
learning = load("multiturn_learning")


def test_the_table_shows_each_step_against_the_single_turn_one_of_its_engine():
    single = bench.Run("1 turn", 10.0, 192, 1, {"generate": 10.0})
    slow = bench.Run("1 turn", 30.0, 192, 1, {"generate": 30.0})
    multi = bench.Run("3 turns", 12.0, 192, 3, {"generate": 9.0, "env": 1.0, "render": 0.5}, 3.0)
    text = bench.table({"hf": [slow, single, multi, single]})
    lines = text.splitlines()
    # The median single-turn run (10 s) is the baseline: 12 / 10; other = 12 - 9 - 1 - 0.5.
    assert lines[2].startswith("| hf | 1 turn | 192 | 1.00 | 1 | 10.00 |")
    assert lines[3].endswith("| 1.500 | 62.50 | 1.20x |")
    assert "| 9.00 | 1.000 | 0.500 |" in lines[3]


def test_a_run_is_read_from_its_metrics(tmp_path):
    rows = [
        {"step": 0, "eval/accuracy": 0.109375},
        {"step": 1, "time/step": 40.0, "episodes/turns_mean": 2.9},
        {"step": 2, "time/step": 50.0, "episodes/turns_mean": 2.1,
         "episodes/environment_token_share": 0.25, "eval/accuracy": 0.5},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    outcome = learning.outcome_of("3 turns", learning.read_rows(tmp_path), 300.0, 120.0)
    assert (outcome.before, outcome.after, outcome.steps, outcome.train_s) == (
        0.109375,
        0.5,
        2,
        90.0,
    )
    row = learning.table([outcome]).splitlines()[2]
    assert row == "| 3 turns | 10.9% | 50.0% | 2 | 90 | 300 | 120 | 2.10 | 25.0% |"
    # Each evaluation with the training seconds before it: 0 at step 0, 40 + 50 at step 2.
    assert outcome.curve == ((0, 0.0, 0.109375), (2, 90.0, 0.5))
    assert outcome.within(60.0) == (0, 0.0, 0.109375)
    curve = learning.curve_table([outcome], budget_s=60.0).splitlines()
    assert curve[2] == "| 3 turns | 0 | 0 | 10.9% (last within 1 min) |"
    assert curve[3] == "| 3 turns | 2 | 90 | 50.0% |"
    unfinished = learning.outcome_of("x", rows[:2], 0.0)
    assert unfinished.after is None and "| - |" in learning.table([unfinished])
