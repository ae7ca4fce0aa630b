"""The real ``grpo train`` CLI on a multi-turn environment: one process, and 2 ranks == 1 process.

Run as ``python this_file grpo ...`` the file is the CLI with the toy ``test/digit-retry-v0``
registered (``toy_env.digit_retry_env``: "say a digit", answered "Say a digit." until it does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _cli_args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "grpo", "train", "--model", str(model), "--env", "test/digit-retry-v0", "--engine", "hf",
        "--max_steps", "2", "--num_generations", "4", "--prompts_per_step", "4",
        "--max_completion_length", "40", "--max_turn_tokens", "6", "--eval_size", "2",
        "--save_every", "0", "--learning_rate", "5e-3", "--seed", "11", "--progress", "false",
        "--log_every_samples", "1", "--output_dir", str(out), *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "ACCELERATE_USE_CPU": "true",
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_grpo_train_cli_trains_a_multi_turn_environment(tmp_path: Path, tiny_model_path: Path):
    from grpo_train.run.run_log import read_metrics

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, __file__, *_cli_args(tiny_model_path, out)],
        env=_env(), capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "held-out accuracy: before" in proc.stdout
    rows = read_metrics(out)
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["episodes/turns_mean"] >= 1.0 and 0 < r["episodes/environment_token_share"] < 1
        assert r["episodes/template_breaks"] >= 0 and r["episodes/tool_calls_mean"] == 0
    assert max(r["episodes/turns_mean"] for r in steps) > 1.0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert any("[user] Say a digit." in s["completion"] for s in samples)
    assert (out / "checkpoints" / "step-000002" / "model").is_dir()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_multi_turn_run_on_two_cpu_ranks_matches_one_process(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    """Groups of episodes split over 2 gloo ranks train what one process trains."""
    from safetensors.torch import load_file
    from two_ranks import accelerate_two_ranks

    from grpo_train.run.run_log import read_metrics

    launch = accelerate_two_ranks(__file__)
    same = ("--seed_per_prompt", "true")
    two = subprocess.Popen(
        launch + _cli_args(tiny_model_path, tmp_path / "two", *same),
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    one = subprocess.Popen(
        [
            sys.executable, __file__, *_cli_args(tiny_model_path, tmp_path / "one", *same),
            "--share_prompt_forward", "false",  # DDP ranks run one forward per row too
        ],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        outs = [p.communicate(timeout=380) for p in (two, one)]
    finally:
        for p in (two, one):
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (stdout, stderr) in zip((two, one), outs):
        assert p.returncode == 0, stdout[-2000:] + stderr[-4000:]
    two_rows, one_rows = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    assert two_rows[-1]["dist/max_rank_diff"] == 0.0
    assert two_rows[-1]["eval/accuracy"] == one_rows[-1]["eval/accuracy"]
    for a, b in zip(two_rows[1:], one_rows[1:], strict=True):
        for key in ("reward/mean", "episodes/turns_mean", "episodes/environment_token_share"):
            assert a[key] == pytest.approx(b[key], abs=1e-9), key
        assert a["episodes/truncated_share"] == b["episodes/truncated_share"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    weights = [
        load_file(tmp_path / run / "checkpoints" / "step-000002" / "model" / "model.safetensors")
        for run in ("two", "one")
    ]
    initial = load_file(tiny_model_path / "model.safetensors")
    assert max(float((weights[1][k] - initial[k]).abs().max()) for k in initial) > 1e-4
    for name, tensor in weights[1].items():
        assert float((weights[0][name] - tensor).abs().max()) <= 2e-5, name


def _grpo_with_digit_retry_env(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    import grpo_envs
    from grpo_train.cli import main

    grpo_envs.register("test/digit-retry-v0", "toy_env:digit_retry_env")
    return main(argv)


if __name__ == "__main__" and sys.argv[1:2] == ["grpo"]:
    raise SystemExit(_grpo_with_digit_retry_env(sys.argv[2:]))
