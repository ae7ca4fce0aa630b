"""The ``grpo`` command: one entry point, one sub-command per job.

``grpo train`` (the trainer), ``grpo eval`` (benchmark suites), ``grpo envs`` (the environment
registry), ``grpo plot`` (curves of a run). Each sub-command lives with the code it drives and
exposes ``main(argv) -> int``; this module only dispatches, so that ``grpo envs list`` does not
import torch.
"""

from __future__ import annotations

import importlib
import os
import sys

from grpo_train.run.console import quiet_child_process

quiet_child_process()  # a no-op unless this is a process a quiet `grpo` command spawned

#: sub-command -> (module exposing ``main(argv: list[str]) -> int``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "grpo_train.train_cli",
        "train a model with GRPO (no arguments: the embedded default)",
    ),
    "launch": (
        "grpo_train.parallel.launch",
        "run grpo train on several processes: `grpo launch --num_processes N train ...`",
    ),
    "eval": (
        "grpo_train.eval_cli",
        "evaluate a model on benchmark suites; `grpo eval compare A B`",
    ),
    "envs": ("grpo_envs.cli", "list, show and score registered environments"),
    "plot": ("grpo_train.run.plot", "draw PNG curves of a run folder"),
    "serve": ("grpo_train.rollout.serve", "run vLLM generation servers for `--vllm_mode server`"),
    "sandbox": (
        "sandbox.service_cli",
        "`grpo sandbox serve`: the sandbox as an HTTP service (SandboxFusion's /run_code too)",
    ),
}


def _usage() -> str:
    lines = ["usage: grpo COMMAND [options]   (grpo --version)", "", "commands:"]
    lines += [f"  {name:<7} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += [
        "",
        "`grpo COMMAND --help` shows a command's options; `grpo train` alone runs the embedded "
        "default job.",
    ]
    return "\n".join(lines)


def _version() -> str:
    """Return the installed grpo-kit version (``unknown`` when it was never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grpo-kit")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``grpo COMMAND ...`` to the command's module."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        # `grpo` alone shows what there is; the quick start is `grpo train`.
        print(_usage())
        return 0
    if args[0] in ("-V", "--version", "version"):
        print(f"grpo-kit {_version()}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"grpo: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if command in ("train", "eval") and "debug" not in rest:
        # torch reads its C++ log level once, when it is first imported (importing the command
        # may import it): its warnings (vLLM's CPU worker's NUMA binding) stay out of the console.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
