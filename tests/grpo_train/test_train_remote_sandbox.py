"""``grpo train --sandbox_backend remote``: code rewards from services, and a service that dies.

The services are fakes on loopback (tests/remote_fakes.py); the working one runs the jobs in a
local ``Sandbox`` behind ``sandbox.wire``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import remote_code_env  # noqa: F401 - registers faults/remote-code-v0
from remote_fakes import FakeService, dead_url, grpo_handler

from grpo_envs.code import close_shared_sandboxes
from grpo_envs.code.backend import use_remote_sandbox
from grpo_train import train_cli
from grpo_train.run.run_log import read_metrics
from sandbox import Sandbox


def args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(model), "--env", "faults/remote-code-v0", "--engine", "hf",
        "--max_steps", "1", "--num_generations", "4", "--prompts_per_step", "2",
        "--max_prompt_length", "64", "--max_completion_length", "4", "--eval_size", "0",
        "--save_every", "0", "--progress", "false", "--log_every_samples", "0",
        "--output_dir", str(out), *extra,
    ]  # fmt: skip


def train(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = train_cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.fixture(autouse=True)
def local_afterwards() -> Iterator[None]:
    yield
    use_remote_sandbox(None)
    close_shared_sandboxes()


def test_a_step_scores_its_code_on_the_remote_service(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Sandbox(workers=2) as box, FakeService(grpo_handler(box)) as service:
        argv = args(tiny_model_path, tmp_path, "--sandbox_backend", "remote")
        code, err = train([*argv, "--sandbox_urls", service.url], capsys)
    assert code == 0, err[-2000:]
    (row,) = [r for r in read_metrics(tmp_path) if r["step"] == 1]
    assert row["reward/mean"] == 1.0 and row["score/sandbox_error_share"] == 0.0
    assert row["sandbox/requests"] == len(service.requests) > 0
    assert row["sandbox/failed_jobs"] == 0
    assert {path for path, _ in service.requests} == {"/v1/run_tests"}


def test_a_dead_service_stops_the_run_at_its_first_step_with_the_reason(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = dead_url()
    argv = args(tiny_model_path, tmp_path, "--sandbox_backend", "remote", "--sandbox_urls", url)
    start = time.monotonic()
    code, err = train(argv, capsys)
    elapsed = time.monotonic() - start
    assert code == 1
    (line,) = [x for x in err.splitlines() if x.startswith("grpo train: aborted")]
    assert "8 of 8 completions failed to score" in line and "max_reward_errors=0.5" in line
    assert url in line and "connection failed" in line
    assert elapsed < 120, elapsed


def test_function_tests_on_a_plain_sandbox_fusion_are_refused_at_start(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = args(tiny_model_path, tmp_path / "run", "--sandbox_backend", "remote")
    argv[argv.index("faults/remote-code-v0")] = "{id: faults/remote-code-v0, kwargs: {style: call}}"
    argv += ["--sandbox_urls", dead_url(), "--sandbox_protocol", "sandbox_fusion"]
    code, err = train(argv, capsys)
    assert code == 2
    (line,) = [x for x in err.splitlines() if x.startswith("grpo train:") and "CallTest" in x]
    assert "grpo sandbox serve" in line and "sandbox_protocol grpo" in line
