"""Quiet by default: the expected chatter is dropped by exact message, nothing else is."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_train.console import ExpectedNoise, is_expected_noise

RELOAD = "vllm.model_executor.model_loader.reload.layerwise"


@pytest.mark.parametrize(
    ("name", "message", "dropped"),
    [
        (RELOAD, "RotaryEmbedding: Failed to load weights", True),
        (RELOAD, "ParallelLMHead: Failed to load weights", True),
        # The same warning for a layer with real weights means something: it stays.
        (RELOAD, "Qwen2MLP: Failed to load weights", False),
        (RELOAD, "RotaryEmbedding: Failed to load weights for layer 3", False),
        ("vllm.triton_utils.importing", "Triton not installed or not compatible; x", True),
        ("grpo_train", "RotaryEmbedding: Failed to load weights", False),  # not vLLM's
        ("vllm.engine", "CPU out of memory", False),
    ],
)
def test_expected_noise_is_matched_exactly(name, message, dropped):
    assert is_expected_noise(name, message) is dropped


def test_the_filter_keeps_other_records():
    noise = ExpectedNoise()
    keep = logging.LogRecord(RELOAD, logging.WARNING, __file__, 1, "%s: Failed", ("X",), None)
    drop = logging.LogRecord(
        RELOAD,
        logging.WARNING,
        __file__,
        1,
        "%s: Failed to load weights",
        ("RotaryEmbedding",),
        None,
    )
    assert noise.filter(keep) and not noise.filter(drop)


#: What must not reach the console of a vLLM run at the default level.
QUIET_VLLM_ABSENT = (
    "Failed to load weights",
    "Triton is not installed",
    "LD_PRELOAD",
    "FutureWarning",
    "NUMA",
    "Triton is installed, but",  # logged by vLLM's engine processes too
    "Loading safetensors checkpoint shards",  # one bar per weight sync
)


def quiet_vllm_env() -> dict[str, str]:
    """The environment of a run whose console is checked: none of the test's own quieting."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    for name in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_LEVEL", "PYTHONWARNINGS"):
        env.pop(name, None)
    return env


def check_quiet_vllm_run(out: str) -> None:
    """A finished vLLM ``grpo train`` printed none of vLLM's expected chatter.

    Called on the uninterrupted vLLM run of ``test_stop_signals`` (one engine start fewer in
    the suite than a run of its own here).
    """
    for text in QUIET_VLLM_ABSENT:
        assert text not in out, f"{text!r} in the run's output:\n{out[-3000:]}"
    assert "held-out accuracy" in out


@pytest.mark.slow
@pytest.mark.vllm
def test_a_vllm_run_at_debug_shows_the_reload_warnings_again(tiny_model_path, tmp_path):
    # The default level's quiet console: check_quiet_vllm_run, on test_stop_signals' vLLM run.
    grpo = str(Path(sys.executable).with_name("grpo"))
    argv = [
        grpo, "train", "--model", str(tiny_model_path), "--env", "math/add2-v0",
        "--engine", "vllm", "--max_steps", "1", "--num_generations", "2",
        "--prompts_per_step", "2", "--max_completion_length", "8", "--eval_size", "2",
        "--max_prompt_length", "128", "--progress", "false", "--output_dir", str(tmp_path / "d"),
        "--log_level", "debug",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, env=quiet_vllm_env(), timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "Failed to load weights" in proc.stdout + proc.stderr
