import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_train.config import DEFAULT_PRESET, field_owners
from grpo_train.run.run_log import read_metrics
from grpo_train.train_cli import build_parser, main, resolve_config


def test_every_config_field_is_a_flag_with_help(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    missing = [name for name in field_owners() if f"--{name}" not in text]
    assert missing == []
    assert "Peak learning rate" in text


def test_layering_preset_then_yaml_then_flags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 5.0e-6\nmax_steps: 7\n")
    args = build_parser().parse_args(
        [
            "--preset",
            "default",
            "--config",
            str(path),
            "--learning-rate",
            "1e-6",
            "--mask_truncated",
        ]
    )
    cfg = resolve_config(args)
    assert cfg.optim.learning_rate == 1e-6  # flag beats file
    assert cfg.run.max_steps == 7  # file beats preset
    assert cfg.rollout.max_completion_length == DEFAULT_PRESET["max_completion_length"]  # preset
    assert cfg.algorithm.mask_truncated is True
    assert resolve_config(build_parser().parse_args(["--resume"])).run.resume == "latest"


def test_no_arguments_resolve_to_the_embedded_default():
    cfg = resolve_config(build_parser().parse_args([]))
    assert cfg.policy.model == "default"
    assert cfg.data.env[0].id == "math/arithmetic-v0"
    # Two-digit addition whose answer may be stated in prose (see DEFAULT_PRESET's comment).
    assert dict(cfg.data.env[0].kwargs) == {"task": "add2", "answer": "loose"}
    assert cfg.rollout.engine == "auto"


def test_bad_values_exit_2_with_the_field_and_fix(capsys):
    assert main(["--num_generations", "1", "--temperature", "-1"]) == 2
    err = capsys.readouterr().err
    assert "num_generations" in err and "at least 2" in err and "temperature" in err


def test_unknown_environment_exits_2(tiny_model_path, tmp_path, capsys):
    code = main(
        [
            "--model",
            str(tiny_model_path),
            "--env",
            "math/nope-v0",
            "--engine",
            "hf",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert code == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.slow
def test_grpo_train_then_grpo_plot_end_to_end(tiny_model_path, tmp_path):
    run_dir = tmp_path / "run"
    grpo = Path(sys.executable).with_name("grpo")
    cmd = [
        str(grpo),
        "train",
        "--model",
        str(tiny_model_path),
        "--env",
        "math/add2-v0",
        "--engine",
        "hf",
        "--max_steps",
        "2",
        "--num_generations",
        "2",
        "--prompts_per_step",
        "2",
        "--max_completion_length",
        "8",
        "--eval_size",
        "4",
        "--output_dir",
        str(run_dir),
        "--progress",
        "false",
        "--learning_rate",
        "1e-3",
    ]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out accuracy: before" in proc.stdout and "wall time" in proc.stdout
    assert str(run_dir) in proc.stdout
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert (run_dir / "checkpoints" / "step-000002" / "model" / "model.safetensors").is_file()
    assert {p.name for p in (run_dir / "plots").glob("*.png")} == {
        "reward.png",
        "accuracy.png",
        "length.png",
        "policy.png",
        "optimization.png",
        "speed.png",
    }

    out = tmp_path / "again"
    proc = subprocess.run(
        [str(grpo), "plot", str(run_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(list(out.glob("*.png"))) == 6
    assert all(p.stat().st_size > 1000 for p in out.glob("*.png"))


def test_grpo_plot_without_metrics_exits_2(tmp_path, capsys):
    from grpo_train.run.plot import main as plot_main

    assert plot_main([str(tmp_path)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["--learning_rte", "1e-5"], "--learning_rate"),
        (["--max_step", "3"], "--max_steps"),
        (["--lora-rr", "8"], "--lora-r"),
    ],
)
def test_a_mistyped_flag_is_three_lines_not_the_usage(argv, suggestion, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3, err
    assert err[0] == f"grpo train: error: unrecognized arguments: {' '.join(argv)}"
    assert suggestion in err[1] and "did you mean" in err[1] and "--help" in err[2]


def test_help_has_a_short_usage_and_no_rst_backquotes():
    text = build_parser().format_help()
    usage = text.split("\n\n", 1)[0]
    assert len(usage.splitlines()) <= 2 and usage.startswith("usage: grpo train")
    assert "``" not in text
