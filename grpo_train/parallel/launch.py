"""``grpo launch``: several ranks of ``grpo train``, stopped by Ctrl-C / SIGTERM without noise.

``grpo launch [accelerate launch options] train [grpo train options]`` is ``accelerate launch
[options] -m grpo_train.cli train [options]``, run in this process with accelerate's own launcher
(torch elastic underneath), so every ``accelerate launch`` option and config file works. What
differs is the ending after a signal. torch elastic's agent answers a SIGINT / SIGTERM by passing
it to its ranks, waiting for them, and re-raising it as ``SignalException``: under ``accelerate
launch`` that is a traceback and exit status 1 after the ranks saved and reported. Here the
exception is the expected end of a stop: the command waits until every rank has exited and exits
128 + the signal's number (130, 143), like ``grpo train`` on one process; the agent's
"death signal" / "closing signal" log lines are not shown (``--log_level debug`` on the train
side does not change that; ``LOGLEVEL=INFO`` shows them).

Defaults added where the command line leaves them open:

- ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (how long the agent waits for its ranks after a signal
  before it kills them) is ``SHUTDOWN_TIMEOUT_S`` instead of torch's 30 s: a rank saving a
  larger model needs more. A rank killed that way is named in one line.
- Without a GPU and without a distribution option (``--multi_gpu``, ``--use_fsdp``,
  ``--config_file``, ...), the ranks run on CPU over gloo (``--multi_gpu`` with
  ``ACCELERATE_USE_CPU=true``: accelerate's own ``--cpu`` starts several processes only through
  MPI), and ``--num_machines 1 --mixed_precision no --dynamo_backend no`` unless given (so that
  accelerate does not print its "values were not passed" notice).

A rank that fails on its own (exit 1: it printed why; killed by a signal: named here) makes the
command exit 1, or the rank's own code for grpo-kit's codes (2 bad input, 130 / 143).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from types import FrameType

#: Seconds torch elastic waits for its ranks after a signal before SIGKILL (torch's default: 30).
SHUTDOWN_TIMEOUT_S = 600

#: ``accelerate launch`` options that choose how the ranks are distributed.
_LAYOUT_OPTIONS = (
    "--config_file",
    "--config-file",
    "--multi_gpu",
    "--multi-gpu",
    "--cpu",
    "--use_fsdp",
    "--use-fsdp",
    "--use_deepspeed",
    "--use-deepspeed",
    "--use_megatron_lm",
    "--tpu",
)
_DEFAULTS = {"--num_machines": "1", "--mixed_precision": "no", "--dynamo_backend": "no"}

USAGE = """\
usage: grpo launch [accelerate launch options] train [grpo train options]

Runs `grpo train` on several processes (one per GPU; gloo ranks on a CPU-only machine), as
`accelerate launch [options] -m grpo_train.cli train [options]` does, and ends a Ctrl-C /
SIGTERM like `grpo train`: every rank saves, one line says how to resume, exit 130 / 143.

examples:
  grpo launch --num_processes 2 train --config run.yaml
  grpo launch --config_file examples/accelerate/fsdp.yaml train --config run.yaml

`accelerate launch --help` lists the launch options."""


def accelerate_argv(
    launch_options: list[str], train_args: list[str], gpu: bool
) -> tuple[list[str], dict[str, str]]:
    """Return ``accelerate launch``'s arguments and the environment variables to add.

    >>> accelerate_argv(["--num_processes", "2"], ["--seed", "1"], gpu=False)[0]
    ... # doctest: +NORMALIZE_WHITESPACE
    ['--num_processes', '2', '--multi_gpu', '--num_machines', '1', '--mixed_precision', 'no',
     '--dynamo_backend', 'no', '-m', 'grpo_train.cli', 'train', '--seed', '1']
    >>> accelerate_argv(["--config_file", "ddp.yaml"], [], gpu=True)
    (['--config_file', 'ddp.yaml', '-m', 'grpo_train.cli', 'train'], {})
    """
    names = {option.partition("=")[0] for option in launch_options}
    options, env = list(launch_options), {}
    if not names & set(_LAYOUT_OPTIONS):
        if not gpu:
            options.append("--multi_gpu")
            env["ACCELERATE_USE_CPU"] = "true"
        for name, value in _DEFAULTS.items():
            if name not in names and name.replace("_", "-") not in names:
                options += [name, value]
    return [*options, "-m", "grpo_train.cli", "train", *train_args], env


class _LauncherLog(logging.Handler):
    """Takes torch elastic's log records: hidden, but a rank it had to kill is remembered."""

    def __init__(self) -> None:
        super().__init__()
        self.killed: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Unable to shutdown process"):
            self.killed.append(message.split()[3])  # the pid


@contextlib.contextmanager
def _quiet_launcher() -> Iterator[_LauncherLog]:
    """Route the ``torch.distributed`` loggers' records (the agent's) away from the terminal."""
    handler = _LauncherLog()
    if os.environ.get("LOGLEVEL", "").upper() in ("DEBUG", "INFO"):
        yield handler  # asked for: the agent's own lines, as torch prints them
        return
    logger = logging.getLogger("torch.distributed")  # torch gives it its own stderr handler
    handlers, propagate = list(logger.handlers), logger.propagate
    logger.handlers, logger.propagate = [handler], False
    try:
        yield handler
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def _wait_for_ranks(grace_s: float) -> None:
    """Wait until this process's children (the ranks) have exited; pass a later signal on.

    torch elastic has waited for them already, unless a second signal cut its wait short.
    """
    import psutil

    children = psutil.Process().children()

    def forward(signum: int, frame: FrameType | None) -> None:
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _, alive = psutil.wait_procs(children, timeout=grace_s)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(alive, timeout=10)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _failure_code(err: BaseException) -> int:
    """Return the exit code for ranks that failed on their own (``ChildFailedError``)."""
    failures = getattr(err, "failures", {}) or {}
    codes = {rank: failure.exitcode for rank, failure in sorted(failures.items())}
    # A rank that exited on its own said why; the agent then stopped the others with SIGTERM.
    own = [code for code in codes.values() if code in (2, 130, 143)]
    if any(code > 0 for code in codes.values()):
        return own[0] if own else 1
    for rank, code in codes.items():
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
            print(f"grpo launch: rank {rank} was killed by {name}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Run ``grpo launch``; its exit code is the run's (0, 1, 2, 130, 143)."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # Ctrl-C while starting, before torch elastic's handlers
        print("grpo launch: interrupted while starting the ranks", file=sys.stderr)
        _wait_for_ranks(grace_s=30)
        return 128 + signal.SIGINT


def _main(args: list[str]) -> int:
    if "train" not in args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if args[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    cut = args.index("train")
    import torch
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    gpu = torch.cuda.is_available()
    names = {option.partition("=")[0].replace("-", "_") for option in args[:cut]}
    if not gpu and not names & {"__num_processes", "__config_file"}:
        print("grpo launch: no GPU here: give --num_processes N (CPU ranks)", file=sys.stderr)
        return 2
    argv_, env = accelerate_argv(args[:cut], args[cut + 1 :], gpu=gpu)
    os.environ.update(env)
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))
    parsed = launch_command_parser().parse_args(argv_)
    started = time.monotonic()
    with _quiet_launcher() as log:
        try:
            launch_command(parsed)
            code = 0
        except SignalException as err:  # the agent passed it to the ranks and waited for them
            code = 128 + int(err.sigval)
        except ChildFailedError as err:
            code = _failure_code(err)
    _wait_for_ranks(grace_s=float(os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]))
    if log.killed:
        print(
            f"grpo launch: rank process(es) {', '.join(log.killed)} did not end within "
            f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={os.environ['TORCH_ELASTIC_SHUTDOWN_TIMEOUT']} s "
            f"of the signal and were killed ({time.monotonic() - started:.0f} s after the "
            "start); the checkpoint being written then is dropped whole, earlier ones are valid",
            file=sys.stderr,
        )
    return code
