"""``grpo train``: train with GRPO from the command line.

With no arguments it runs the embedded default (``config.DEFAULT_PRESET``): SmolLM2-135M-Instruct
on two-digit addition, on CPU, and prints the held-out accuracy before and after, the wall time,
and where the run folder, metrics, checkpoints and plots are. Every config field is a flag::

    grpo train --config run.yaml --learning_rate 1e-6 --max_steps 50
    grpo train --resume                       # continue the newest checkpoint of output_dir
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from grpo_train.config import (
    ConfigError,
    TrainConfig,
    field_docs,
    field_owners,
    field_types,
    preset_config,
)

_EXIT_INTERRUPTED = 130  # the shell convention for "stopped by a signal"


def build_parser() -> argparse.ArgumentParser:
    """Build the parser: ``--config``, ``--preset``, ``--resume`` and a flag per config field."""
    parser = argparse.ArgumentParser(
        prog="grpo train",
        description="Train a model with GRPO. No arguments: the embedded default run "
        "(SmolLM2-135M-Instruct on two-digit addition, CPU).",
    )
    parser.add_argument("--config", help="YAML file (flat or sectioned) applied over the preset")
    parser.add_argument(
        "--preset",
        choices=("default", "none"),
        default="default",
        help="base layer: 'default' is the embedded run, 'none' the plain dataclass defaults",
    )
    docs, types = field_docs(), field_types()
    preset = {k: v for section in preset_config().to_dict().values() for k, v in section.items()}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, section in field_owners().items():
        group = groups.setdefault(section, parser.add_argument_group(section))
        text = f"{docs[name]} (default: {preset[name]!r})".replace("%", "%%")
        flags = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
        if name == "resume":  # `--resume` alone means the newest checkpoint of output_dir
            group.add_argument(
                *flags, dest=name, nargs="?", const="latest", default=None, help=text
            )
        elif types[name] is bool:
            group.add_argument(
                *flags, dest=name, nargs="?", const="true", default=None, metavar="BOOL", help=text
            )
        else:
            group.add_argument(*flags, dest=name, default=None, metavar="VALUE", help=text)
    return parser


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """Layer preset <- YAML file <- command-line flags into one validated config."""
    config = preset_config() if args.preset == "default" else TrainConfig()
    if args.config:
        config = TrainConfig.from_yaml(args.config, base=config)
    overrides = {
        name: getattr(args, name) for name in field_owners() if getattr(args, name) is not None
    }
    return TrainConfig.from_flat(overrides, base=config) if overrides else config


def main(argv: list[str] | None = None) -> int:
    """Run ``grpo train``; exit code 0 done, 1 aborted, 2 bad input, 130 interrupted."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = resolve_config(args)
    except ConfigError as err:
        print(f"grpo train: {err}", file=sys.stderr)
        return 2

    from grpo_train.models import ModelNotAvailableError
    from grpo_train.trainer import Trainer, TrainingAborted

    envs = ", ".join(e.id for e in config.data.env)
    print(
        f"grpo train: model={config.policy.model} env={envs} engine={config.rollout.engine} "
        f"steps={config.run.max_steps} -> {config.run.output_dir}",
        flush=True,
    )
    try:
        trainer = Trainer(config)
    except (ModelNotAvailableError, KeyError, ValueError, FileNotFoundError) as err:
        print(f"grpo train: {err}", file=sys.stderr)
        return 2
    try:
        result = trainer.train()
    except TrainingAborted as err:
        print(f"grpo train: aborted: {err}", file=sys.stderr)
        return 1
    finally:
        trainer.close()
    if not trainer.rank.is_main:  # under `accelerate launch` only the main rank reports
        return _EXIT_INTERRUPTED if result.interrupted else 0

    run_dir = Path(result.run_dir)
    plots = _plot(run_dir)
    fmt = lambda acc: "n/a" if acc is None else f"{acc:.1%}"  # noqa: E731
    print(
        f"\nheld-out accuracy: before {fmt(result.accuracy_before)}"
        f" -> after {fmt(result.accuracy_after)}"
        f"\nwall time: {result.wall_s:.0f} s for {result.steps} steps"
        f"\nrun folder: {run_dir}"
        f"\nmetrics: {run_dir / 'metrics.jsonl'} (tensorboard --logdir {run_dir / 'tensorboard'})"
        f"\ncheckpoints: {run_dir / 'checkpoints'} (last: {result.last_checkpoint})"
        f"\nplots: {plots or 'not drawn (pip install matplotlib)'}",
        flush=True,
    )
    if result.interrupted:
        print(f"interrupted: resume with `grpo train --config {run_dir / 'config.yaml'} --resume`")
        return _EXIT_INTERRUPTED
    return 0


def _plot(run_dir: Path) -> Path | None:
    """Draw the run's curves; None when matplotlib is missing."""
    try:
        from grpo_train.plot import plot_run
    except ImportError:
        return None
    try:
        plot_run(run_dir)
    except ImportError:
        return None
    return run_dir / "plots"


if __name__ == "__main__":
    raise SystemExit(main())
