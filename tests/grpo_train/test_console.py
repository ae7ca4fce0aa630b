"""Quiet by default: the expected chatter is dropped by exact message, nothing else is."""

import logging
import os

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

    Called on ``test_stop_signals``' vLLM runs (the default level; their uninterrupted run, at
    debug, must show the reload warnings again): no engine start of its own here.
    """
    for text in QUIET_VLLM_ABSENT:
        assert text not in out, f"{text!r} in the run's output:\n{out[-3000:]}"
    assert "held-out accuracy" in out
