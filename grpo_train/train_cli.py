"""``grpo train``: train with GRPO from the command line.

With no model, env or config file it runs the embedded default (``config.DEFAULT_PRESET``):
SmolLM2-135M-Instruct on two-digit addition, on CPU, and prints the held-out accuracy before and
after, the wall time, and where the run folder, metrics, checkpoints and plots are. Otherwise the
plain defaults apply (``grpo train --help``). Every config field is a flag::

    grpo train --config run.yaml --learning_rate 1e-6 --max_steps 50
    grpo train --resume                       # continue the newest checkpoint of output_dir
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_train.config import (
    TRL_ALIASES,
    TRL_TRANSLATED,
    ConfigError,
    DefaultChoice,
    TrainConfig,
    field_docs,
    field_owners,
    field_types,
    preset_config,
    real_model_defaults,
    with_output_dir,
)
from grpo_train.models.loading import model_shape
from grpo_train.run.console import setup_logging

if TYPE_CHECKING:  # the trainer imports torch: only when a run starts
    from grpo_train.run.stop import StopRequest
    from grpo_train.trainer import TrainResult

_EXIT_INTERRUPTED = 130  # the shell convention for "stopped by a signal": 128 + SIGINT


def build_parser() -> argparse.ArgumentParser:
    """Build the parser: ``--config``, ``--preset``, a flag per config field, TRL's names."""
    from grpo_envs.cli import ShortErrorParser

    parser = ShortErrorParser(
        prog="grpo train",
        # The generated usage names all of the ~200 flags and TRL aliases: dozens of lines.
        usage="grpo train [--config FILE.yaml] [--preset {auto,default,none}] [--FIELD VALUE ...]",
        description="Train a model with GRPO. With no --model, --env or --config: the embedded "
        "default run (SmolLM2-135M-Instruct on two-digit addition, CPU; `--preset default` "
        "asks for it explicitly). Otherwise the defaults below apply, chosen for a real model.",
        epilog="TRL GRPOConfig names work too: "
        + ", ".join(f"--{k} (= {v})" for k, v in TRL_ALIASES.items() if v)
        + "; "
        + "; ".join(f"--{k} (sets {v})" for k, v in TRL_TRANSLATED.items())
        + ". Booleans take true/false/1/0/yes/no.",
        # `--lr` must not silently mean `--lr_scheduler`, nor `--epsilon` one of the epsilons.
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML file (flat or sectioned) applied over the base")
    parser.add_argument(
        "--preset",
        choices=("auto", "default", "none"),
        default="auto",
        help="base layer: 'default' is the embedded quick-start run, 'none' the defaults listed "
        "here; 'auto' (default): 'default' when no --model, --env or --config is given",
    )
    docs, types = field_docs(), field_types()
    defaults = {k: v for section in TrainConfig().to_dict().values() for k, v in section.items()}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, section in field_owners().items():
        group = groups.setdefault(section, parser.add_argument_group(section))
        shown = defaults[name]
        if name == "output_dir" and not shown:
            shown = "runs/<model>-<env>-<date>-<time>"
        # Field docstrings are reStructuredText (``x``); a terminal shows plain backquotes.
        text = f"{docs[name]} (default: {shown!r})".replace("``", "`").replace("%", "%%")
        flags = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
        if name == "resume":  # `--resume` alone means the newest checkpoint of output_dir
            group.add_argument(
                *flags, dest=name, nargs="?", const="latest", default=None, help=text
            )
        elif types[name] is bool or name == "dynamic_sampling":
            group.add_argument(
                *flags, dest=name, nargs="?", const="true", default=None, metavar="BOOL", help=text
            )
        else:
            group.add_argument(*flags, dest=name, default=None, metavar="VALUE", help=text)
    trl = parser.add_argument_group("TRL names (saved under ours)")
    for name in [*TRL_ALIASES, *TRL_TRANSLATED]:
        if name in field_owners():
            continue
        ours = TRL_ALIASES[name] if name in TRL_ALIASES else TRL_TRANSLATED[name]
        takes_bool = name in _TRL_BOOLS or (name in TRL_ALIASES and types.get(ours) is bool)
        trl.add_argument(
            f"--{name}",
            dest=f"trl__{name}",
            default=None,
            nargs="?" if takes_bool else None,
            const="true" if takes_bool else None,
            metavar="BOOL" if takes_bool else "VALUE",
            help=argparse.SUPPRESS if name == "use_peft" else f"= {ours or 'lora_r > 0'}",
        )
    return parser


_TRL_BOOLS = frozenset({"use_vllm", "bf16", "use_peft"})


def _wants_preset(args: argparse.Namespace) -> bool:
    if args.preset != "auto":
        return bool(args.preset == "default")
    given = {name for name in ("model", "env") if getattr(args, name) is not None}
    given |= {n for n in ("model_name_or_path",) if getattr(args, f"trl__{n}", None) is not None}
    return not given and not args.config


_NEGATIVE = re.compile(r"^-(\d|\.\d|inf$|nan$)", re.IGNORECASE)


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """Write ``--flag -1e-5`` as ``--flag=-1e-5``: argparse takes ``-1e-5`` for an option.

    >>> join_negative_values(["--learning_rate", "-1e-5", "--seed", "3"])
    ['--learning_rate=-1e-5', '--seed', '3']
    """
    out: list[str] = []
    for arg in argv:
        prev = out[-1] if out else ""
        if _NEGATIVE.match(arg) and prev.startswith("--") and "=" not in prev:
            out[-1] = f"{prev}={arg}"
        else:
            out.append(arg)
    return out


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """Layer the base (preset or plain defaults) <- YAML file <- command-line flags."""
    return resolve_with_defaults(args)[0]


def resolve_with_defaults(
    args: argparse.Namespace,
) -> tuple[TrainConfig, tuple[DefaultChoice, ...]]:
    """Resolve the configuration and return the real-model defaults it applied.

    A named model (not the embedded quick start) gets ``config.real_model_defaults`` for its
    shape under the YAML file and the flags: a field either of them gives is theirs, and is not
    among the defaults returned.
    """
    if _wants_preset(args):
        return _layered(args, preset_config()), ()
    plain = _layered(args, TrainConfig())
    given = _given_fields(args)
    chosen = tuple(
        c for c in real_model_defaults(model_shape(plain.policy.model)) if c.field not in given
    )
    if not chosen:
        return plain, ()
    base = TrainConfig.from_flat({c.field: c.value for c in chosen})
    return _layered(args, base), chosen


def _given_fields(args: argparse.Namespace) -> set[str]:
    """Return the fields the command line or the YAML file sets (under our names)."""
    given = {name for name in field_owners() if getattr(args, name) is not None}
    given |= {
        TRL_ALIASES.get(key.removeprefix("trl__"), "")
        for key, value in vars(args).items()
        if key.startswith("trl__") and value is not None
    }
    if args.config:
        import yaml

        try:
            raw = yaml.safe_load(Path(args.config).read_text())
        except (OSError, yaml.YAMLError):
            raw = None  # from_yaml has already reported it
        for key, value in (raw or {}).items() if isinstance(raw, dict) else ():
            given |= set(value) if isinstance(value, dict) else {key}
    return {TRL_ALIASES.get(str(name), str(name)) or str(name) for name in given}


def _layered(args: argparse.Namespace, config: TrainConfig) -> TrainConfig:
    """Layer the YAML file and the command-line flags over ``config``."""
    if args.config:
        config = TrainConfig.from_yaml(args.config, base=config)
    overrides: dict[str, object] = {
        name: getattr(args, name) for name in field_owners() if getattr(args, name) is not None
    }
    for key, value in vars(args).items():
        if key.startswith("trl__") and value is not None:
            overrides[key.removeprefix("trl__")] = value
    if overrides:
        config = TrainConfig.from_flat(overrides, base=config)
    return with_output_dir(config)


def main(argv: list[str] | None = None) -> int:
    """Run ``grpo train``; exit code 0 done, 1 aborted, 2 bad input, 130 / 143 interrupted.

    Ctrl-C (SIGINT) or SIGTERM, to this process alone or to its whole process group: the step
    in progress finishes (or, when the rollout engine ended with the signal before that step's
    update, is undone), the last completed step is saved, one line says which and how to resume,
    and the exit code is 128 + the signal's number (130, 143). A second signal more than
    ``stop.REPEAT_WINDOW_S`` later stops at once; the checkpoint being written is then dropped
    whole, the previous ones stay valid.

    Under a multi-process launch the main rank's exit code is the run's: the other ranks exit 0
    after an interruption that they saved.
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (loading, plotting)
        print("grpo train: interrupted", file=sys.stderr)
        return _EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(join_negative_values(raw))
    try:
        config, chosen = resolve_with_defaults(args)
        setup_logging(config.run.log_level, details_to_file=True)
    except ConfigError as err:
        print(f"grpo train: {err}", file=sys.stderr)
        return 2

    from grpo_train.run.stop import StopRequest

    stop = StopRequest()
    with stop.installed():  # from here on a signal is a stop request, loading included
        return _train(config, stop, chosen)


def _train(config: TrainConfig, stop: StopRequest, chosen: Sequence[DefaultChoice] = ()) -> int:
    import torch

    from grpo_envs.types import DataUnavailableError
    from grpo_train.models.loading import ModelNotAvailableError
    from grpo_train.rollout.base import EngineDied
    from grpo_train.run.checkpoint import CheckpointError, latest_checkpoint
    from grpo_train.run.memory_advice import out_of_memory_line
    from grpo_train.run.stop import SecondSignal, TrainingAborted
    from grpo_train.setup.settings import memory_settings
    from grpo_train.trainer import Trainer

    envs = ", ".join(e.id for e in config.data.env)
    print(
        f"grpo train: model={config.policy.model} env={envs} engine={config.rollout.engine} "
        f"steps={config.run.max_steps} -> {config.run.output_dir}",
        flush=True,
    )
    if chosen:
        print(defaults_line(chosen), flush=True)
    resume = f"`{resume_command(Path(config.run.output_dir) / 'config.yaml')}`"
    try:
        # The run folder is checked there, on the resolved config (dtype auto -> what the saved
        # config.yaml of an earlier run of the same settings holds), before anything loads.
        trainer = Trainer(config, stop=stop)
    except (
        ModelNotAvailableError,
        CheckpointError,
        ConfigError,
        DataUnavailableError,
        KeyError,
        ValueError,
    ) as err:
        print(f"grpo train: {_one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # FileNotFoundError, PermissionError on the run folder or a model
        print(f"grpo train: {_io_message(err)}", file=sys.stderr)
        return 2
    except torch.OutOfMemoryError as err:
        print(f"grpo train: {out_of_memory_line(err, memory_settings(config))}", file=sys.stderr)
        return 1
    from grpo_train.episodes.driver import TemplateBreakError

    try:
        result = trainer.train()
    except (TrainingAborted, TemplateBreakError) as err:
        print(f"grpo train: aborted: {err}", file=sys.stderr)
        return 1
    except EngineDied as err:
        last = latest_checkpoint(trainer.setup.run_dir)
        saved = f"last checkpoint {last}; resume with {resume}" if last else "no checkpoint yet"
        print(f"grpo train: aborted: {err}; {saved}", file=sys.stderr)
        return 1
    except SecondSignal:
        last = latest_checkpoint(trainer.setup.run_dir)
        print(
            "grpo train: stopped at once by a second signal, without saving the step in "
            + (f"progress; last checkpoint {last}; resume with {resume}" if last else "progress")
            + ("" if last else "; no checkpoint was written yet"),
            file=sys.stderr,
        )
        return stop.exit_code
    except OSError as err:
        print(f"grpo train: aborted: {_io_message(err)}", file=sys.stderr)
        return 1
    except torch.OutOfMemoryError as err:
        last = latest_checkpoint(trainer.setup.run_dir)
        saved = f"last checkpoint {last}; resume with {resume}" if last else "no checkpoint yet"
        print(
            f"grpo train: aborted: {out_of_memory_line(err, memory_settings(config))}; {saved}",
            file=sys.stderr,
        )
        return 1
    except RuntimeError as err:
        if not (trainer.setup.distributed and _is_timeout(err)):
            raise
        print(
            f"grpo train: rank {trainer.setup.rank.rank}: a collective operation timed out after "
            f"collective_timeout_s={config.run.collective_timeout_s:g} s: another rank stopped "
            "responding (hung, stopped or killed); resume with --resume once all ranks run",
            file=sys.stderr,
        )
        return 1
    finally:
        trainer.close()
    if not trainer.setup.rank.is_main:
        # Under `accelerate launch` only the main rank reports, and its exit status carries an
        # interruption: the launcher stops every rank as soon as one exits non-zero, so a
        # non-main rank exiting 130 first could kill the main rank in the middle of its report.
        return 0

    run_dir = Path(result.run_dir)
    plots = _plot(run_dir)
    fmt = lambda acc: "n/a" if acc is None else f"{acc:.1%}"  # noqa: E731
    print(
        f"\nheld-out accuracy: before {fmt(result.accuracy_before)}"
        f" -> after {fmt(result.accuracy_after)}"
        f"\n{_wall_time_line(result)}"
        f"{_speed_lines(result)}"
        f"\n{_switches_line(result)}"
        f"{_episodes_line(run_dir, trainer.setup.cfg.rollout.history_policy)}"
        f"\nrun folder: {run_dir}"
        f"\nmetrics: {run_dir / 'metrics.jsonl'} (tensorboard --logdir {run_dir / 'tensorboard'})"
        f"\ncheckpoints: {run_dir / 'checkpoints'} (last: {result.last_checkpoint})"
        f"\nplots: {plots or 'none (matplotlib missing, or no metrics rows yet)'}",
        flush=True,
    )
    if result.interrupted:
        print(
            f"interrupted by {stop.name}: saved step {result.steps} in {result.last_checkpoint}; "
            f"resume with {resume}",
            flush=True,
        )
        return stop.exit_code
    return 0


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _wall_time_line(result: TrainResult) -> str:
    """Say how long this launch took for the steps it ran, and the whole run when resumed.

    >>> from pathlib import Path
    >>> from grpo_train.trainer import TrainResult
    >>> r = TrainResult(Path("r"), 6, 0.1, 0.5, 13.2, False, None, start_step=5, earlier_wall_s=70)
    >>> _wall_time_line(r)
    'wall time: 13 s for 1 step (resumed after step 5); the run: 83 s for 6 steps'
    >>> _wall_time_line(TrainResult(Path("r"), 8, 0.1, 0.5, 95.0, False, None))
    'wall time: 95 s for 8 steps'
    """
    ran = result.steps - result.start_step
    line = f"wall time: {result.wall_s:.0f} s for {_plural(ran, 'step')}"
    if result.start_step == 0:
        return line
    return (
        f"{line} (resumed after step {result.start_step}); the run: "
        f"{result.total_wall_s:.0f} s for {_plural(result.steps, 'step')}"
    )


def resume_command(config_path: Path, launcher: Sequence[str] | None = None) -> str:
    """Return the command that resumes this run; inside its launcher's command when launched.

    ``launcher``: the launching command line (default: this rank's parent's, under ``accelerate
    launch`` / ``torchrun``), which ends with this process's own arguments.

    >>> resume_command(Path("runs/x/config.yaml"), launcher=[])
    'grpo train --config runs/x/config.yaml --resume'
    >>> argv = ["/v/bin/python", "/v/bin/accelerate", "launch", "--multi_gpu", "-m",
    ...         "grpo_train.cli", "train", "--seed", "1"]
    >>> resume_command(Path("c.yaml"), launcher=argv)  # run as `... train --seed 1`
    'accelerate launch --multi_gpu -m grpo_train.cli train --config c.yaml --resume'
    """
    own = ["--config", str(config_path), "--resume"]
    parent = list(_launcher_argv() if launcher is None else launcher)
    cut = _train_position(parent)
    if cut is not None:
        prefix = parent[:cut]
        if prefix and Path(prefix[0]).name.startswith("python") and len(prefix) > 1:
            prefix = prefix[1:]  # `python .../accelerate launch` is `accelerate launch`
        if prefix:
            prefix[0] = Path(prefix[0]).name if "/" in prefix[0] else prefix[0]
            return shlex.join([*prefix, "train", *own])
    return shlex.join(["grpo", "train", *own])


def _train_position(argv: Sequence[str]) -> int | None:
    """Where ``train`` (the sub-command) stands in a launcher's command line; None if nowhere.

    The first ``train`` after ``grpo launch`` or after ``-m grpo_train.cli`` (a later one may be
    an option's value). Other launchers (``torchrun ... -m grpo_train.cli train``) have the module.

    >>> _train_position(["grpo", "launch", "--num_processes", "2", "train", "--split", "train"])
    4
    >>> _train_position(["torchrun", "-m", "grpo_train.cli", "train", "--split", "train"])
    3
    """
    for anchor in ("grpo_train.cli", "launch"):
        if anchor in argv:
            start = argv.index(anchor)
            rest = list(argv[start + 1 :])
            if "train" in rest:
                return start + 1 + rest.index("train")
    return None


def _launcher_argv() -> list[str]:
    """Return the parent's command line when this is a rank of a launched job; else []."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or "LOCAL_RANK" not in os.environ:
        return []
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _episodes_line(run_dir: Path, history_policy: str) -> str:
    """Return a multi-turn run's episodes line: turns, template breaks said out loud ('' if none).

    >>> _episodes_line(Path("/nonexistent"), "keep")
    ''
    """
    from grpo_train.run.run_log import read_metrics

    try:
        rows = [r for r in read_metrics(run_dir) if "episodes/turns_mean" in r]
    except OSError:
        return ""
    if not rows:
        return ""
    turns = sum(r["episodes/turns_mean"] for r in rows) / len(rows)
    breaks = int(sum(r.get("episodes/template_breaks", 0.0) for r in rows))
    worst = max(r.get("episodes/broken_share", 0.0) for r in rows)
    line = (
        f"\nmulti-turn: {turns:.2f} turns per episode (mean over {len(rows)} steps), history "
        f"policy {history_policy}, template breaks {breaks}"
    )
    if breaks:
        line += (
            f" (up to {worst:.0%} of a step's episodes ended early by the chat template; "
            "template_breaks: error stops the run instead)"
        )
    return line


def defaults_line(chosen: Sequence[DefaultChoice]) -> str:
    """Return the start-up line naming the real-model defaults a named model got, and why.

    >>> defaults_line([DefaultChoice("gradient_checkpointing", True, "a real model")])
    'real-model defaults: gradient_checkpointing=true (a real model); a flag or --config sets \
them otherwise'
    """
    return (
        "real-model defaults: "
        + "; ".join(c.describe() for c in chosen)
        + "; a flag or --config sets them otherwise"
    )


def _switches_line(result: TrainResult) -> str:
    """Return the summary's line of what the run switched automatically, and after which step."""
    if not result.switches:
        return "automatic switches: none (the configured algorithm ran every step)"
    return "automatic switches: " + "; ".join(s.describe() for s in result.switches)


def _speed_lines(result: TrainResult) -> str:
    """Return the summary's throughput and time-to-target lines (each after a newline)."""
    lines = ""
    rate = result.throughput
    if rate:
        lines += (
            f"\nthroughput: {rate['throughput/samples_per_s']:.2f} samples/s, "
            f"{rate['throughput/completion_tokens_per_s']:.0f} completion tokens/s (over step time)"
        )
    if result.time_to_target is not None:
        lines += f"\n{result.time_to_target.describe()}"
    return lines


def _one_line(err: BaseException) -> str:
    """Return the error's text on one line (a KeyError's without its quotes)."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    return " ".join(text.split())


def _io_message(err: OSError) -> str:
    """Name the path and the problem of a failed write/read, without a traceback."""
    from grpo_train.run.checkpoint import OutputWriteError

    if isinstance(err, OutputWriteError):
        return str(err)
    where = err.filename or "the run folder"
    reason = os.strerror(err.errno) if err.errno else str(err)
    hint = ""
    if err.errno == errno.ENOSPC:
        try:
            free = shutil.disk_usage(Path(str(where)).parent).free >> 20
            hint = f" ({free} MiB free there); free space or set output_dir elsewhere"
        except OSError:
            hint = "; free space or set output_dir elsewhere"
    elif err.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        hint = "; choose a writable output_dir"
    return f"cannot write {where}: {reason}{hint}"


def _is_timeout(err: BaseException) -> bool:
    text = str(err).lower()
    return "timed out" in text or "timeout" in text


def _plot(run_dir: Path) -> Path | None:
    """Draw the run's curves; None when matplotlib is missing."""
    try:
        from grpo_train.run.plot import plot_run
    except ImportError:
        return None
    try:
        plot_run(run_dir)
    except (ImportError, FileNotFoundError):  # no matplotlib, or no rows (0 steps, no eval)
        return None
    return run_dir / "plots"


if __name__ == "__main__":
    raise SystemExit(main())
