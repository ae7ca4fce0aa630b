"""``grpo plot``: which charts a run gets and what each draws (the figure objects, not pixels)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from grpo_train.run.plot import RunFacts, build_figures, main, plot_run

pytest.importorskip("matplotlib")


def _train_row(step: int, **extra: float) -> dict[str, float]:
    """A single-turn training step's row as the trainer logs it (values vary with the step)."""
    return {
        "step": step,
        "reward/mean": 0.1 * step,
        "group/reward_std": 0.3,
        "reward/component/correct": 0.1 * step,
        "accuracy": 0.05 * step,
        "length/mean": 20.0 + step,
        "length/max": 64.0,
        "length/clipped_frac": 0.5 / step,
        "entropy": 1.0 - 0.01 * step,
        "kl": 0.0,
        "grad_norm": 2.0 / step,
        "clip_frac": 0.01 * step,
        "clip_frac_low": 0.004 * step,
        "clip_frac_high": 0.006 * step,
        "lr": 1e-6 * step,
        "throughput/completion_tokens_per_s": 100.0 * step,
        "time/generate": 2.0,
        "time/train": 1.0,
        "time/step": 3.0,
        "time/elapsed": 3.0 * step,
        "memory/peak_mb": 1000.0 + step,
        **extra,
    }


def _episode_metrics(step: int) -> dict[str, float]:
    return {
        "episodes/turns_mean": 1.0 + 0.1 * step,
        "episodes/tool_calls_mean": float(2 * step),
        "episodes/tool_error_share": 0.25 * (step % 2),
        "episodes/environment_token_share": 0.4,
        "episodes/template_breaks": float(step == 3),
        "episodes/broken_share": 0.5 * (step == 3),
        "episodes/truncated_share": 1.0,
    }


def _axes(figures) -> dict[str, object]:
    return {ax.get_title(): ax for fig in figures.values() for ax in fig.axes}


def _line(ax, label_start: str):
    found = [line for line in ax.get_lines() if line.get_label().startswith(label_start)]
    assert len(found) == 1, [line.get_label() for line in ax.get_lines()]
    return found[0]


def _points(line) -> list[tuple[float, float]]:
    """The drawn (x, y) points of a line, NaN breaks left out."""
    xs, ys = line.get_xdata(), line.get_ydata()
    return [(float(x), float(y)) for x, y in zip(xs, ys) if not math.isnan(y)]


def _assert_points(line, expected: list[tuple[float, float]]) -> None:
    np.testing.assert_allclose(np.array(_points(line)), np.array(expected, dtype=float))


# Held-out accuracy is measured every eval_every steps (0 and the end, or a few in between).
@pytest.mark.parametrize("eval_steps", [(0, 8), (0,), (8,), (0, 3, 6, 8), (2, 3, 7)])
def test_held_out_accuracy_is_drawn_at_its_measured_steps_only(eval_steps):
    rows = [
        {"step": 0, "eval/accuracy": 0.1} if 0 in eval_steps else {"step": 0},
        *(
            _train_row(s, **({"eval/accuracy": 0.1 * s} if s in eval_steps else {}))
            for s in range(1, 9)
        ),
    ]
    rows = [r for r in rows if len(r) > 1]
    ax = _axes(build_figures(rows))["Accuracy"]
    held_out = _line(ax, "held-out")
    assert held_out.get_linestyle() == "None" and held_out.get_marker() == "o"
    assert [x for x, _ in _points(held_out)] == list(eval_steps)
    assert [y for _, y in _points(held_out)] == pytest.approx(
        [0.1 if s == 0 else 0.1 * s for s in eval_steps]
    )
    # No other line carries the held-out values between its measured steps either.
    for line in ax.get_lines():
        if line is not held_out:
            assert line.get_label().startswith("train")
    assert ", ".join(map(str, eval_steps)) in held_out.get_label()


def test_a_per_step_line_is_broken_where_steps_are_missing():
    rows = [_train_row(s) for s in (1, 2, 3, 7, 8)]  # 4..6 not logged (a resumed run, say)
    ax = _axes(build_figures(rows))["Reward"]
    line = _line(ax, "mean")
    ys = np.asarray(line.get_ydata(), dtype=float)
    xs = np.asarray(line.get_xdata(), dtype=float)
    gap = np.isnan(ys)
    assert gap.sum() == 1 and 3 < xs[gap][0] < 7  # one break, between the two runs of steps
    assert [x for x, _ in _points(line)] == [1, 2, 3, 7, 8]


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_kl_is_drawn_only_where_it_is_computed(beta):
    rows = [_train_row(s, kl=0.0 if beta == 0 else 0.01 * s) for s in range(1, 5)]
    figures = build_figures(rows, RunFacts(beta=beta))
    axes = _axes(figures)
    assert "Entropy of the sampled tokens" in axes
    suptitle = figures["policy"].get_suptitle()
    if beta == 0:
        assert "KL to the reference" not in axes
        assert suptitle == "KL not computed (beta = 0)"
    else:
        assert [y for _, y in _points(_line(axes["KL to the reference"], "KL"))] == pytest.approx(
            [0.01, 0.02, 0.03, 0.04]
        )
        assert suptitle == ""


def test_length_chart_draws_the_cap_as_the_cap_and_the_truncated_share():
    rows = [_train_row(s) for s in range(1, 5)]
    axes = _axes(build_figures(rows, RunFacts(max_completion_length=64)))
    length = axes["Completion length"]
    cap = _line(length, "cap")
    assert set(cap.get_ydata()) == {64} and cap.get_linestyle() == "--"
    truncated = axes["Truncated at the cap"]
    _assert_points(_line(truncated, "share"), [(s, 0.5 / s) for s in range(1, 5)])
    assert truncated.get_ylim()[0] < 0 < 1 <= truncated.get_ylim()[1]


def test_optimisation_and_speed_charts_hold_the_recorded_metrics():
    rows = [_train_row(s) for s in range(1, 5)]
    axes = _axes(build_figures(rows, RunFacts(max_grad_norm=1.0)))
    grad = axes["Gradient norm (before clipping)"]
    _assert_points(_line(grad, "grad norm"), [(s, 2.0 / s) for s in range(1, 5)])
    assert set(_line(grad, "clip").get_ydata()) == {1.0}
    clipped = axes["Clipped ratio (share of tokens)"]
    assert {line.get_label() for line in clipped.get_lines()} == {
        "total",
        "low (A < 0)",
        "high (A > 0)",
    }
    _assert_points(_line(axes["Learning rate"], "lr"), [(s, 1e-6 * s) for s in range(1, 5)])
    assert _points(_line(axes["Throughput (all ranks)"], "completion"))[0] == (1, 100.0)
    phases = {line.get_label() for line in axes["Time per step, by phase"].get_lines()}
    assert phases == {"generate", "train"}  # time/step is their sum, time/elapsed a clock
    assert "Peak memory" in axes


def test_a_multi_turn_run_gets_its_episode_charts():
    rows = [_train_row(s, **_episode_metrics(s)) for s in range(1, 5)]
    figures = build_figures(rows, RunFacts(max_completion_length=40))
    axes = _axes(figures)
    turns = _line(axes["Turns per episode (mean)"], "turns")
    _assert_points(turns, [(s, 1.0 + 0.1 * s) for s in range(1, 5)])
    calls = axes["Tool calls per episode (mean)"]
    assert [y for _, y in _points(_line(calls, "calls"))] == [2, 4, 6, 8]
    failed = axes["Tool calls that failed (share)"]
    assert [y for _, y in _points(_line(failed, "share"))] == [0.25, 0, 0.25, 0]
    assert failed.get_ylim()[1] <= 1.05  # shares are drawn on a share's axis
    share = axes["Environment tokens / all tokens"]
    assert {y for _, y in _points(_line(share, "share"))} == {0.4}
    early = axes["Episodes ended early (share)"]
    assert [y for _, y in _points(_line(early, "template break"))] == [0, 0, 0.5, 0]
    assert {y for _, y in _points(_line(early, "cut at the length cap"))} == {1.0}
    breaks = axes["Template breaks (per step)"]
    assert [y for _, y in _points(_line(breaks, "breaks"))] == [0, 0, 1, 0]
    assert "environment tokens included" in _line(axes["Completion length"], "episode").get_label()


def test_a_single_turn_run_gets_no_episode_chart():
    figures = build_figures([_train_row(s) for s in range(1, 4)])
    assert "episodes" not in figures
    assert not any(t.startswith(("Turns", "Tool")) for t in _axes(figures))


@pytest.mark.parametrize(
    "dropped, gone",
    [
        (("grad_norm",), {"Gradient norm (before clipping)"}),
        (("lr",), {"Learning rate"}),
        (("clip_frac", "clip_frac_low", "clip_frac_high"), {"Clipped ratio (share of tokens)"}),
        (("length/clipped_frac",), {"Truncated at the cap"}),
        (("throughput/completion_tokens_per_s",), {"Throughput (all ranks)"}),
        (("reward/component/correct",), {"Reward components (mean)"}),
        (("time/generate", "time/train"), {"Time per step, by phase"}),
    ],
)
def test_a_chart_the_run_did_not_record_is_left_out_not_drawn_empty(dropped, gone):
    rows = [{k: v for k, v in _train_row(s).items() if k not in dropped} for s in range(1, 4)]
    titles = set(_axes(build_figures(rows)))
    assert not gone & titles
    assert {"Reward", "Accuracy", "Completion length"} <= titles
    for fig in build_figures(rows).values():
        for ax in fig.axes:
            assert ax.get_lines(), ax.get_title()  # every chart drawn holds data


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), "n/a"])
def test_values_that_are_not_finite_numbers_are_not_points(bad):
    rows = [_train_row(1), _train_row(2, grad_norm=bad), _train_row(3)]
    grad = _axes(build_figures(rows))["Gradient norm (before clipping)"]
    assert [x for x, _ in _points(_line(grad, "grad norm"))] == [1, 3]


def test_only_evaluation_rows_give_only_the_accuracy_chart():
    figures = build_figures([{"step": 0, "eval/accuracy": 0.2}])
    assert list(figures) == ["accuracy"]


def test_plot_run_writes_a_png_per_figure_and_reads_beta_from_the_config(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "eval/accuracy": 0.1}, *(_train_row(s) for s in range(1, 4))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"algorithm": {"beta": 0.0}, "rollout": {"max_completion_length": 64}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert RunFacts.read(run) == RunFacts(beta=0.0, max_completion_length=64)
    written = plot_run(run)
    assert {p.name for p in written} == {
        "reward.png",
        "accuracy.png",
        "length.png",
        "policy.png",
        "optimization.png",
        "speed.png",
    }
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
    assert main([str(run), "--out", str(tmp_path / "again")]) == 0
    assert len(list((tmp_path / "again").glob("*.png"))) == len(written)


@pytest.mark.parametrize("text", ["", "- a list\n", "algorithm: [1, 2\n", "beta: yes\n"])
def test_a_config_that_says_nothing_usable_gives_no_facts(tmp_path: Path, text: str):
    (tmp_path / "config.yaml").write_text(text)
    assert RunFacts.read(tmp_path) == RunFacts()
