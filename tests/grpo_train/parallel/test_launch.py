"""`grpo launch`'s pieces (the signalled two-rank runs are in test_stop_signals.py)."""

from pathlib import Path
from types import SimpleNamespace

from grpo_train.parallel.launch import _failure_code, accelerate_argv, main
from grpo_train.train_cli import resume_command


def _failed(**codes: int) -> SimpleNamespace:
    """A ``ChildFailedError`` stand-in: rank -> exit code (negative: killed by that signal)."""
    return SimpleNamespace(
        failures={int(r.removeprefix("r")): SimpleNamespace(exitcode=c) for r, c in codes.items()}
    )


def test_a_rank_that_failed_on_its_own_gives_the_code_not_the_agents_sigterm(capsys):
    # Rank 1 refused its input (exit 2, its own message); the agent then SIGTERMed rank 0.
    assert _failure_code(_failed(r0=-15, r1=2)) == 2
    assert _failure_code(_failed(r0=1, r1=-15)) == 1
    assert capsys.readouterr().err == ""  # the rank said why; nothing more here


def test_a_rank_killed_from_outside_is_named(capsys):
    assert _failure_code(_failed(r0=-9, r1=-15)) == 1
    assert capsys.readouterr().err.splitlines() == [
        "grpo launch: rank 0 was killed by SIGKILL",
        "grpo launch: rank 1 was killed by SIGTERM",
    ]


def test_the_resume_command_is_the_launch_command_as_typed():
    parent = [
        "/v/bin/python", "/v/bin/grpo", "launch", "--num_processes", "2", "train",
        "--model", "m", "--data_split", "train",
    ]  # fmt: skip
    assert resume_command(Path("r/config.yaml"), launcher=parent) == (
        "grpo launch --num_processes 2 train --config r/config.yaml --resume"
    )


def test_options_the_user_gave_are_kept_and_cpu_ranks_get_gloo():
    argv, env = accelerate_argv(["--num_processes", "4", "--mixed_precision=bf16"], [], gpu=True)
    assert argv == [
        "--num_processes", "4", "--mixed_precision=bf16", "--num_machines", "1",
        "--dynamo_backend", "no", "-m", "grpo_train.cli", "train",
    ]  # fmt: skip
    assert env == {}
    _, env = accelerate_argv(["--num_processes", "2"], [], gpu=False)
    assert env == {"ACCELERATE_USE_CPU": "true"}


def test_without_the_train_subcommand_it_shows_how(capsys):
    assert main(["--num_processes", "2"]) == 2
    assert "usage: grpo launch" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "grpo launch --num_processes 2 train" in capsys.readouterr().out
