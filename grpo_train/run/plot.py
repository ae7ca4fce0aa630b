"""``grpo plot RUN_DIR``: PNG charts of a run from its ``metrics.jsonl``.

Reads ``RUN_DIR/metrics.jsonl`` (and ``config.yaml`` for beta, the length cap and the gradient
clip) and writes ``RUN_DIR/plots/*.png`` (or ``--out``): reward, accuracy, completion length with
the truncated share, entropy (and KL to the reference where beta > 0), optimisation (gradient
norm, clipped ratios, learning rate), speed (throughput, time split, peak memory) and, for a
multi-turn run, its episodes (turns, tool calls and errors, environment token share, template
breaks).

What a chart shows is what was measured: a metric measured at a few steps only (held-out
accuracy, every ``eval_every`` steps) is drawn as markers at those steps, never as a line through
steps where it was not measured; a per-step line is broken where steps are missing. A chart whose
metrics the run did not record is left out, and a file whose charts are all left out is not
written.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml

from grpo_train.run.run_log import read_metrics

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Series:
    """One metric drawn on a chart."""

    metric: str
    label: str
    measured: Literal["every_step", "some_steps"] = "every_step"
    """``some_steps``: markers at the measured steps only (no line across the steps between)."""


@dataclass(frozen=True)
class Chart:
    """One axes: a title, a y label and the series it draws (left out when none was recorded)."""

    title: str
    series: tuple[Series, ...]
    ylabel: str = ""
    prefix: str = ""
    """Also draw every recorded metric named ``prefix...`` (one series each)."""
    ylim: tuple[float | None, float | None] = (None, None)
    """Fixed y limits (None: matplotlib's choice): counts from 0, shares 0..1, so that a flat
    series does not look like a swing."""


@dataclass(frozen=True)
class RunFacts:
    """What the run's ``config.yaml`` says about the charts (None: not found)."""

    beta: float | None = None
    max_completion_length: int | None = None
    max_grad_norm: float | None = None

    @classmethod
    def read(cls, run_dir: Path) -> RunFacts:
        """Read the facts from ``run_dir/config.yaml`` (sectioned or flat); missing: None."""
        path = run_dir / "config.yaml"
        try:
            loaded = yaml.safe_load(path.read_text()) if path.is_file() else None
        except (OSError, yaml.YAMLError):
            loaded = None
        if not isinstance(loaded, dict):
            return cls()
        flat: dict[str, object] = {}
        for key, value in loaded.items():
            flat.update(value if isinstance(value, dict) else {key: value})

        def number(key: str) -> float | None:
            value = flat.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            return float(value)

        length = number("max_completion_length")
        return cls(number("beta"), None if length is None else int(length), number("max_grad_norm"))


#: file name -> the charts of that PNG, top to bottom.
FIGURES: dict[str, tuple[Chart, ...]] = {
    "reward": (
        Chart(
            "Reward",
            (Series("reward/mean", "mean"), Series("group/reward_std", "in-group std")),
        ),
        Chart("Reward components (mean)", (), prefix="reward/component/"),
    ),
    "accuracy": (
        Chart(
            "Accuracy",
            (
                Series("accuracy", "train (sampled)"),
                Series("eval/accuracy", "held-out (greedy), measured steps", "some_steps"),
            ),
            ylim=(-0.02, 1.08),
        ),
    ),
    "length": (
        Chart(
            "Completion length",
            (Series("length/mean", "mean (sampled)"), Series("length/max", "longest (sampled)")),
            ylabel="tokens",
            ylim=(0, None),
        ),
        Chart(
            "Truncated at the cap",
            (Series("length/clipped_frac", "share of completions"),),
            ylabel="share",
            ylim=(0, 1.05),
        ),
    ),
    "policy": (
        Chart("Entropy of the sampled tokens", (Series("entropy", "entropy"),), ylabel="nats"),
        Chart("KL to the reference", (Series("kl", "KL (k3)"),)),
    ),
    "optimization": (
        Chart(
            "Gradient norm (before clipping)", (Series("grad_norm", "grad norm"),), ylim=(0, None)
        ),
        Chart(
            "Clipped ratio (share of tokens)",
            (
                Series("clip_frac", "total"),
                Series("clip_frac_low", "low (A < 0)"),
                Series("clip_frac_high", "high (A > 0)"),
            ),
            ylim=(0, None),
        ),
        Chart("Learning rate", (Series("lr", "lr"),), ylim=(0, None)),
    ),
    "speed": (
        Chart(
            "Throughput (all ranks)",
            (Series("throughput/completion_tokens_per_s", "completion tokens / s"),),
            ylim=(0, None),
        ),
        Chart("Time per step, by phase", (), ylabel="s", prefix="time/", ylim=(0, None)),
        Chart("Peak memory", (Series("memory/peak_mb", "peak"),), ylabel="MiB", ylim=(0, None)),
    ),
    "episodes": (
        Chart(
            "Turns per episode (mean)", (Series("episodes/turns_mean", "turns"),), ylim=(0, None)
        ),
        Chart(
            "Tool calls per episode (mean)",
            (Series("episodes/tool_calls_mean", "calls"),),
            ylim=(0, None),
        ),
        Chart(
            "Tool calls that failed (share)",
            (Series("episodes/tool_error_share", "share"),),
            ylim=(0, 1.05),
        ),
        Chart(
            "Environment tokens / all tokens",
            (Series("episodes/environment_token_share", "share"),),
            ylim=(0, 1.05),
        ),
        Chart(
            "Episodes ended early (share)",
            (
                Series("episodes/broken_share", "template break"),
                Series("episodes/truncated_share", "cut at the length cap"),
            ),
            ylim=(0, 1.05),
        ),
        Chart(
            "Template breaks (per step)",
            (Series("episodes/template_breaks", "breaks"),),
            ylim=(0, None),
        ),
    ),
}

#: ``time/*`` keys that are not a phase of the step (``time/step`` is their sum).
_NOT_A_PHASE = frozenset({"time/step", "time/elapsed"})


def measured_points(
    rows: Sequence[Mapping[str, float]], metric: str
) -> tuple[list[float], list[float]]:
    """Return the steps where ``metric`` was recorded (finite) and its values there.

    >>> measured_points([{"step": 0, "a": 1.0}, {"step": 1}, {"step": 2, "a": None}], "a")
    ([0], [1.0])
    """
    points = [
        (r["step"], float(v))
        for r in rows
        if isinstance(v := r.get(metric), int | float) and math.isfinite(v)
    ]
    return [s for s, _ in points], [v for _, v in points]


def broken_at_gaps(steps: Sequence[float], values: Sequence[float]) -> tuple[list[float], ...]:
    """Insert a NaN (a break in a matplotlib line) between two steps more than one apart.

    >>> broken_at_gaps([1, 2, 5], [0.1, 0.2, 0.5])
    ([1, 2, 3.5, 5], [0.1, 0.2, nan, 0.5])
    """
    xs: list[float] = []
    ys: list[float] = []
    for i, (step, value) in enumerate(zip(steps, values, strict=True)):
        if i and step - steps[i - 1] > 1:
            xs.append((step + steps[i - 1]) / 2)
            ys.append(math.nan)
        xs.append(step)
        ys.append(value)
    return xs, ys


def _chart_series(chart: Chart, rows: Sequence[Mapping[str, float]]) -> list[Series]:
    series = list(chart.series)
    if chart.prefix:
        names = sorted({k for r in rows for k in r if k.startswith(chart.prefix)})
        series += [
            Series(name, name.removeprefix(chart.prefix))
            for name in names
            if name not in _NOT_A_PHASE
        ]
    return series


def _draw(ax: Axes, chart: Chart, rows: Sequence[Mapping[str, float]], facts: RunFacts) -> bool:
    """Draw ``chart`` on ``ax``; False (nothing drawn) when the run recorded none of it."""
    from matplotlib.ticker import MaxNLocator

    drawn = False
    for s in _chart_series(chart, rows):
        steps, values = measured_points(rows, s.metric)
        if not steps:
            continue
        drawn = True
        if s.measured == "some_steps":
            where = ", ".join(f"{x:g}" for x in steps[:8]) + (", ..." if len(steps) > 8 else "")
            ax.plot(steps, values, linestyle="none", marker="o", label=f"{s.label} ({where})")
            if len(steps) <= 12:
                for x, y in zip(steps, values, strict=True):
                    ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 6))
        else:
            xs, ys = broken_at_gaps(steps, values)
            ax.plot(xs, ys, marker="o" if len(steps) < 20 else None, markersize=3, label=s.label)
    if not drawn:
        return False
    if chart.title == "Completion length" and facts.max_completion_length:
        cap = facts.max_completion_length
        # An episode's budget counts the environment's tokens too; the lengths are sampled ids.
        episodes = any("episodes/turns_mean" in r for r in rows)
        what = "episode budget, environment tokens included" if episodes else "cap"
        ax.axhline(
            cap, color="grey", linestyle="--", label=f"{what} ({cap}, max_completion_length)"
        )
    if chart.title.startswith("Gradient norm") and facts.max_grad_norm:
        ax.axhline(facts.max_grad_norm, color="grey", linestyle="--", label="clip (max_grad_norm)")
    low, high = chart.ylim
    ax.set_ylim(low, high)
    if low == 0:  # a margin under 0, so that a series at 0 is not hidden by the frame
        top = ax.get_ylim()[1] * (1.0 if high is not None else 1.08)
        ax.set_ylim(-0.03 * top, top)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(chart.title, fontsize=10)
    ax.set_ylabel(chart.ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return True


def _charts_for(name: str, facts: RunFacts) -> tuple[Chart, ...]:
    """Return the charts of one file for this run: no KL chart where beta = 0 (not computed)."""
    charts = FIGURES[name]
    if name == "policy" and facts.beta == 0:
        charts = tuple(c for c in charts if not c.title.startswith("KL"))
    return charts


def build_figures(
    rows: Sequence[Mapping[str, float]], facts: RunFacts = RunFacts()
) -> dict[str, Figure]:
    """Return one matplotlib figure per file of ``FIGURES`` that has a recorded metric."""
    from matplotlib.figure import Figure

    figures = {}
    for name in FIGURES:
        charts = [c for c in _charts_for(name, facts) if _has_data(c, rows)]
        if not charts:
            continue
        fig = Figure(figsize=(7, 2.6 * len(charts) + 0.4), layout="constrained")
        axes = fig.subplots(len(charts), 1, sharex=True, squeeze=False)[:, 0]
        for ax, chart in zip(axes, charts, strict=True):
            _draw(ax, chart, rows, facts)
        axes[-1].set_xlabel("step")
        if name == "policy" and facts.beta == 0:
            fig.suptitle("KL not computed (beta = 0)", fontsize=9)
        figures[name] = fig
    return figures


def _has_data(chart: Chart, rows: Sequence[Mapping[str, float]]) -> bool:
    return any(measured_points(rows, s.metric)[0] for s in _chart_series(chart, rows))


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write one PNG per figure that has data (``build_figures``); returns the files written."""
    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(
            f"{Path(run_dir) / 'metrics.jsonl'} is missing or empty; is this a run folder?"
        )
    out = Path(out_dir) if out_dir else Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in build_figures(rows, RunFacts.read(Path(run_dir))).items():
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Run ``grpo plot RUN_DIR [--out DIR]``; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="grpo plot", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("run_dir", help="a run folder (holds metrics.jsonl)")
    parser.add_argument(
        "--out", default=None, help="where to write the PNGs (default RUN_DIR/plots)"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        files = plot_run(args.run_dir, args.out)
    except FileNotFoundError as err:
        print(f"grpo plot: {err}", file=sys.stderr)
        return 2
    except ImportError:
        print("grpo plot: needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    for f in files:
        print(f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
