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


@pytest.mark.slow
@pytest.mark.vllm
def test_a_vllm_run_prints_no_reload_warnings_and_no_triton_chatter(tiny_model_path, tmp_path):
    grpo = str(Path(sys.executable).with_name("grpo"))
    argv = [
        grpo, "train", "--model", str(tiny_model_path), "--env", "math/add2-v0",
        "--engine", "vllm", "--max_steps", "2", "--num_generations", "2",
        "--prompts_per_step", "2", "--max_completion_length", "8", "--eval_size", "2",
        "--max_prompt_length", "128", "--progress", "false", "--output_dir", str(tmp_path / "r"),
    ]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    for name in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_LEVEL", "PYTHONWARNINGS"):
        env.pop(name, None)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Failed to load weights" not in out
    assert "Triton is not installed" not in out and "LD_PRELOAD" not in out
    assert "FutureWarning" not in out and "NUMA" not in out
    assert "Triton is installed, but" not in out  # logged by vLLM's engine processes too
    assert "Loading safetensors checkpoint shards" not in out  # one bar per weight sync
    assert "held-out accuracy" in out
    # --log_level debug shows everything again.
    proc = subprocess.run(
        [*argv, "--log_level", "debug", "--max_steps", "1", "--output_dir", str(tmp_path / "d")],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0
    assert "Failed to load weights" in proc.stdout + proc.stderr
