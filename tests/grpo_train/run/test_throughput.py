"""Throughput and time-to-target from metric rows, against hand-computed answers."""

import pytest

from grpo_train.run.throughput import run_throughput, step_throughput, time_to_target

ROWS = [
    {"step": 0, "eval/accuracy": 0.25},
    {"step": 1, "time/step": 2.0, "time/elapsed": 2.5, "throughput/samples_per_s": 16.0,
     "throughput/completion_tokens_per_s": 320.0},
    {"step": 2, "time/step": 2.0, "time/elapsed": 6.0, "eval/accuracy": 0.5,
     "throughput/samples_per_s": 16.0, "throughput/completion_tokens_per_s": 480.0},
    {"step": 3, "time/step": 4.0, "time/elapsed": 10.0, "eval/accuracy": 0.75,
     "throughput/samples_per_s": 8.0, "throughput/completion_tokens_per_s": 160.0},
    {"step": 4, "time/step": 2.0, "time/elapsed": 13.0, "eval/accuracy": 0.75,
     "throughput/samples_per_s": 16.0, "throughput/completion_tokens_per_s": 320.0},
]  # fmt: skip


def test_step_rates_divide_counts_by_the_step_time():
    assert step_throughput(64, 2048, 8.0) == {
        "throughput/samples_per_s": 8.0,
        "throughput/completion_tokens_per_s": 256.0,
    }
    assert step_throughput(0, 0, 0.0) == {
        "throughput/samples_per_s": 0.0,
        "throughput/completion_tokens_per_s": 0.0,
    }


def test_run_rates_are_totals_over_total_step_time():
    # samples: 32 + 32 + 32 + 32 = 128 in 10 s; tokens 640 + 960 + 640 + 640 = 2880 in 10 s
    assert run_throughput(ROWS) == pytest.approx(
        {"throughput/samples_per_s": 12.8, "throughput/completion_tokens_per_s": 288.0}
    )
    assert run_throughput([{"step": 0, "eval/accuracy": 0.1}]) == {}


@pytest.mark.parametrize(
    ("target", "step", "wall", "accuracy"),
    [
        (0.5, 2, 6.0, 0.5),  # exactly the target counts as reached
        (0.6, 3, 10.0, 0.75),
        (0.2, 0, 0.0, 0.25),  # already there before training
        (None, 3, 10.0, 0.75),  # unset: the first step at the best accuracy (not step 4)
        (0.0, 3, 10.0, 0.75),  # 0 means unset too (the config's default)
    ],
)
def test_first_step_and_wall_time_at_the_target(target, step, wall, accuracy):
    t = time_to_target(ROWS, target)
    assert (t.step, t.wall_s, t.accuracy, t.best, t.best_step) == (step, wall, accuracy, 0.75, 3)
    assert t.reached


def test_never_reached_says_so_with_the_best():
    t = time_to_target(ROWS, 0.9)
    assert not t.reached and t.step is None and t.wall_s is None
    assert t.describe() == "held-out accuracy never reached the target 90.0% (best 75.0% at step 3)"


def test_a_resumed_launch_continues_the_clock():
    rows = [*ROWS[:3], {"step": 3, "time/elapsed": 1.5, "eval/accuracy": 0.9}]  # resumed at 2
    t = time_to_target(rows, 0.8)
    assert (t.step, t.wall_s) == (3, 7.5)


def test_no_evaluation_is_reported_as_such():
    t = time_to_target([{"step": 1, "time/elapsed": 3.0}], 0.5)
    assert t.best is None and not t.reached
    assert "no held-out evaluation" in t.describe()
    assert (
        "time to the best held-out accuracy (75.0%): step 3, 10 s"
        in time_to_target(ROWS).describe()
    )
