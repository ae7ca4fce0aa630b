"""GRPO-vs-PPO benchmark: its summary arithmetic, table and options (nothing is trained here)."""

from __future__ import annotations

import doctest

import pytest
from bench_scripts import load

pb = load("ppo_bench")


def measure(config, steps, cpu, rss, tokens=None, error=""):
    return pb.Measure(
        config,
        step_s=steps,
        cpu_s=cpu,
        tokens=tokens or [100] * len(steps),
        peak_rss_mb=rss,
        trainable_m=1.0,
        models="m",
        error=error,
    )


def test_docstring_examples():
    assert doctest.testmod(pb).failed == 0


def test_summary_drops_the_warm_up_step_and_takes_medians_over_rounds():
    runs = [
        measure("ours-full", [100.0, 4.0, 6.0, 8.0], [50.0, 3.0, 3.0, 3.0], 1000.0),
        measure("ours-full", [100.0, 10.0, 12.0], [50.0, 5.0, 7.0], 1200.0),
        measure("ours-full", [100.0, 2.0, 2.0], [50.0, 1.0, 1.0], 1100.0),
    ]
    row = pb.summarize("ours-full", runs)
    # per round: 6.0, 11.0, 2.0 -> 6.0; CPU 3.0, 6.0, 1.0 -> 3.0
    assert (row.step_s, row.cpu_s, row.peak_rss_mb, row.rounds) == (6.0, 3.0, 1100.0, 3)


def test_failed_rounds_are_left_out_and_all_failed_is_an_error_row():
    ok = measure("trl-ppo-full", [9.0, 3.0], [9.0, 2.0], 500.0)
    bad = measure("trl-ppo-full", [], [], 0.0, error="RuntimeError: x")
    assert pb.summarize("trl-ppo-full", [bad, ok]).rounds == 1
    assert pb.summarize("trl-ppo-full", [bad]).error == "RuntimeError: x"


def test_ratios_compare_each_row_with_ppo_of_the_same_mode():
    rows = [
        pb.summarize("ours-lora", [measure("ours-lora", [9.0, 2.0], [9.0, 1.0], 1000.0)]),
        pb.summarize("trl-ppo-full", [measure("trl-ppo-full", [9.0, 8.0], [9.0, 8.0], 9000.0)]),
        pb.summarize("trl-ppo-lora", [measure("trl-ppo-lora", [9.0, 6.0], [9.0, 3.0], 4000.0)]),
    ]
    cells = [c.strip() for c in pb.table(rows).splitlines()[2].split("|")]
    assert cells[-4:-1] == ["3.0x", "3.0x", "4.0x"]  # against trl-ppo-lora, not -full
    assert pb.table(rows).splitlines()[3].endswith("| - | - | - |")  # PPO itself: no ratio


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "1"], "--steps"),
        (["--beta", "0"], "--beta"),
        (["--group", "0"], "--group"),
        (["--configs", "nope"], "--configs"),
    ],
)
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        pb.parse_args(argv)
    assert message in capsys.readouterr().err


def test_quick_is_a_small_smoke():
    args = pb.parse_args(["--quick"])
    assert (args.steps, args.prompts * args.group, args.rounds) == (2, 4, 1)
