"""Quiet by default: the expected chatter is dropped by exact message, nothing else is."""

import logging
import os
import re

import pytest

from grpo_train.run.console import (
    CONSOLE,
    QUIET_ENV,
    RUN_LOG_FILE,
    ExpectedNoise,
    attach_run_log,
    is_expected_noise,
    setup_logging,
)

RELOAD = "vllm.model_executor.model_loader.reload.layerwise"


@pytest.fixture(autouse=True)
def _not_tearing_down(monkeypatch):
    """Each test starts outside vLLM's teardown mode. ``ExpectedNoise.tearing_down`` is
    process-wide by design (once an engine process ended, the run is ending); an earlier test in
    the same pytest worker whose engine lost a process leaves it set."""
    monkeypatch.setattr(ExpectedNoise, "tearing_down", False)


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


# ------------------------------------------------------ grpo train: the console and the run log

_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


@pytest.fixture
def restored_logging(monkeypatch):
    """Undo what setup_logging changes in this process: root handlers, level, environment."""
    for name in (QUIET_ENV, "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "PYTHONWARNINGS",
                 "TORCH_CPP_LOG_LEVEL"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def test_train_console_shows_warnings_and_marked_notes_the_file_everything(
    restored_logging, tmp_path, capsys
):
    setup_logging("info", details_to_file=True)
    ours = logging.getLogger("grpo_train.trainer")
    ours.info("a detail")
    logging.getLogger("matplotlib.font_manager").info("generated new fontManager")
    ours.warning("something to act on")
    ours.info("resuming from %s", "ckpt", extra=CONSOLE)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "WARNING grpo_train.trainer: something to act on",
        "INFO grpo_train.trainer: resuming from ckpt",
    ]
    assert attach_run_log(tmp_path) is not None
    ours.info("after the folder is known")
    assert capsys.readouterr().err == ""
    lines = (tmp_path / RUN_LOG_FILE).read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "a detail",
        "generated new fontManager",
        "something to act on",
        "resuming from ckpt",
        "after the folder is known",
    ]
    assert all(_TIMESTAMP.match(line) for line in lines)
    # debug shows everything on the console; grpo eval (no run log) keeps its info lines
    setup_logging("debug", details_to_file=True)
    ours.info("a detail")
    assert "INFO grpo_train.trainer: a detail" in capsys.readouterr().err
    setup_logging("info")
    ours.info("a detail")
    assert "a detail" in capsys.readouterr().err
    assert attach_run_log(tmp_path / "other") is None


@pytest.mark.slow
def test_a_train_run_prints_the_bar_and_the_summary_and_logs_details_to_its_file(
    tiny_model_path, tmp_path, capsys, restored_logging
):
    from grpo_train import train_cli

    out = tmp_path / "run"
    argv = [
        "--model", str(tiny_model_path), "--env", "math/add2-v0", "--engine", "hf",
        "--max_steps", "2", "--num_generations", "4", "--prompts_per_step", "2",
        "--max_completion_length", "4", "--eval_size", "2", "--save_every", "0",
        "--output_dir", str(out),
    ]  # fmt: skip
    assert train_cli.main(argv) == 0
    captured = capsys.readouterr()
    console = captured.out + captured.err
    lines = [line for line in re.split(r"[\r\n]", console) if line.strip()]
    # The default log level's console: no timestamps, no INFO / DEBUG logger lines.
    assert not [line for line in lines if _TIMESTAMP.search(line)], console
    assert not [line for line in lines if re.match(r"\s*(INFO|DEBUG) ", line)], console
    assert "held-out accuracy: before" in captured.out and "grpo: " in captured.err  # the bar
    assert "Loading weights" not in console  # transformers' bar for each model load
    log = (out / RUN_LOG_FILE).read_text()
    assert "beta=0, mu=1" in log and all(_TIMESTAMP.match(x) for x in log.splitlines())


def test_details_go_to_the_run_log_not_the_console(restored_logging, tmp_path, capsys):
    from grpo_train.run.console import ExpectedNoise

    setup_logging("info", details_to_file=True)
    # vLLM's own console handler, as its logging config builds it (the filter without arguments)
    vllm = logging.getLogger("vllm.model_executor.models.utils")
    handler = logging.StreamHandler()
    handler.addFilter(ExpectedNoise())
    vllm.addHandler(handler)
    vllm.propagate = False
    try:
        weight = (
            "Attempted to load weight norm.weight with dtype torch.float32 into parameter "
            "with dtype torch.bfloat16"
        )
        vllm.warning(weight)  # before the run folder is known: kept for it
        assert attach_run_log(tmp_path) is not None
        vllm.warning("Failed to create oneDNN linear, fallback to torch linear. Exception: x")
        vllm.warning("Qwen2MLP: Failed to load weights")  # a real problem stays on the console
    finally:
        vllm.removeHandler(handler)
        vllm.propagate = True
    err = capsys.readouterr().err
    assert "Attempted to load weight" not in err and "oneDNN" not in err
    assert "Qwen2MLP: Failed to load weights" in err
    logged = (tmp_path / RUN_LOG_FILE).read_text()
    assert logged.count("Attempted to load weight norm.weight") == 1
    assert logged.count("Failed to create oneDNN linear") == 1
