"""``grpo plot RUN_DIR``: PNG curves of a run (reward, accuracy, completion length, KL/entropy).

Reads ``RUN_DIR/metrics.jsonl`` and writes ``RUN_DIR/plots/*.png`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo_train.run_log import read_metrics

#: file name -> (title, [(metric, label)])
PANELS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "reward": (
        "Reward",
        [("reward/mean", "train reward (mean)"), ("group/reward_std", "in-group std")],
    ),
    "accuracy": (
        "Accuracy",
        [("accuracy", "train (sampled)"), ("eval/accuracy", "held-out (greedy)")],
    ),
    "length": ("Completion length (tokens)", [("length/mean", "mean"), ("length/max", "max")]),
    "kl": ("KL to reference / entropy", [("kl", "KL (k3)"), ("entropy", "entropy")]),
}


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw one PNG per panel of ``PANELS``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(
            f"{Path(run_dir) / 'metrics.jsonl'} is missing or empty; is this a run folder?"
        )
    out = Path(out_dir) if out_dir else Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (title, series) in PANELS.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        drawn = 0
        for key, label in series:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if len(points) < 20 else None, label=label)
                drawn += 1
        if not drawn:
            ax.text(
                0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes
            )
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend()
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
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
