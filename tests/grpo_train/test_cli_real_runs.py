"""What a user gets once they leave the default run: presets, run folders, TRL names, `grpo`."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_train.cli import main as grpo_main
from grpo_train.config import DEFAULT_PRESET, TrainConfig
from grpo_train.train_cli import build_parser, main, resolve_config

GRPO = str(Path(sys.executable).with_name("grpo"))


def _resolve(argv):
    return resolve_config(build_parser().parse_args(argv))


def test_a_real_model_does_not_inherit_the_toy_preset():
    # The README's own example: before, it kept 64 completion tokens, float32 and the quick
    # start's folder.
    model = ["--model", "Qwen/Qwen2.5-0.5B-Instruct"]
    cfg = _resolve([*model, "--env", "math/gsm8k-v0", "--max_steps", "200", "--lr", "1e-6"])
    assert cfg.rollout.max_completion_length >= 1024
    assert cfg.data.max_prompt_length == TrainConfig().data.max_prompt_length
    assert cfg.policy.dtype == "auto"  # bf16 where supported, resolved by the trainer
    assert cfg.run.output_dir != DEFAULT_PRESET["output_dir"]
    assert "Qwen2.5-0.5B-Instruct" in cfg.run.output_dir and "gsm8k-v0" in cfg.run.output_dir
    assert cfg.optim.learning_rate == 1e-6 and cfg.run.max_steps == 200


def test_a_config_file_is_not_layered_over_the_preset(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: some/model\nlearning_rate: 3.0e-6\n")
    cfg = _resolve(["--config", str(path)])
    assert cfg.rollout.max_completion_length == TrainConfig().rollout.max_completion_length
    assert cfg.optim.learning_rate == 3e-6
    # ...unless asked for.
    cfg = _resolve(["--preset", "default", "--config", str(path)])
    assert cfg.rollout.max_completion_length == DEFAULT_PRESET["max_completion_length"]


def test_the_quick_start_still_runs_the_embedded_default():
    for argv in ([], ["--max_steps", "3"], ["--preset", "default", "--model", "default"]):
        cfg = _resolve(argv)
        assert cfg.run.output_dir == DEFAULT_PRESET["output_dir"]
        assert cfg.rollout.max_completion_length == DEFAULT_PRESET["max_completion_length"]
        assert cfg.policy.dtype == "float32"


def test_help_shows_the_real_defaults(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    entry = text.split("--max-completion-length VALUE")[-1].split(" --")[0]
    assert f"(default: {TrainConfig().rollout.max_completion_length!r})" in entry
    assert "(default: 64)" not in entry  # the preset's value is not presented as a default
    assert "--epsilon" in text and "--num_iterations" in text


def test_two_runs_get_two_folders():
    from datetime import datetime

    from grpo_train.config import with_output_dir

    base = TrainConfig.from_flat({"model": "a/b", "env": "math/gsm8k-v0"})
    first = with_output_dir(base, datetime(2026, 1, 1, 0, 0, 0)).run.output_dir
    second = with_output_dir(base, datetime(2026, 1, 1, 0, 0, 1)).run.output_dir
    assert first != second


def _other_run(folder: Path) -> None:
    folder.mkdir(parents=True)
    TrainConfig.from_flat({"model": "other/model", "output_dir": str(folder)}).save(
        folder / "config.yaml"
    )
    (folder / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')


def test_a_folder_holding_another_run_is_refused_with_the_fixes(tmp_path, capsys):
    folder = tmp_path / "run"
    _other_run(folder)
    argv = ["--model", "my/model", "--output_dir", str(folder), "--engine", "hf"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(folder) in err and "--resume" in err and "--overwrite" in err
    assert "model" in err
    assert (folder / "metrics.jsonl").read_text().startswith('{"step": 0')  # untouched


def test_the_same_settings_again_in_their_folder_are_not_another_run(tmp_path, capsys):
    # The saved config.yaml holds the resolved dtype; the command line still says auto.
    folder = tmp_path / "run"
    argv = ["--model", str(tmp_path / "no-model"), "--output_dir", str(folder), "--engine", "hf"]
    folder.mkdir()
    resolved = dataclasses.replace(_resolve(argv).policy, dtype="float32")
    dataclasses.replace(_resolve(argv), policy=resolved).save(folder / "config.yaml")
    assert main(argv) == 2  # the model folder does not exist...
    err = capsys.readouterr().err
    assert "does not exist" in err and "holds another run" not in err  # ...the folder is fine


def test_resume_without_a_folder_asks_which_run(capsys):
    assert main(["--model", "my/model", "--resume"]) == 2
    assert "which run" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--epsilon", "0.1"], "epsilon_low", 0.1),
        (["--epsilon", "0.1"], "epsilon_high", 0.1),  # TRL: epsilon_high defaults to epsilon
        (["--epsilon", "0.1", "--epsilon_high", "0.3"], "epsilon_high", 0.3),
        (["--lr", "1e-6"], "learning_rate", 1e-6),
        (["--scale_rewards", "false"], "scale_rewards", "none"),
        (["--scale_rewards", "true"], "scale_rewards", "group"),
        (["--num_iterations", "2"], "mu", 2),
        (["--mask_truncated_completions", "yes"], "mask_truncated", True),
        (["--vllm_importance_sampling_correction", "0"], "is_correction", False),
        (["--vllm_importance_sampling_cap", "2"], "is_cap", 2.0),
        (["--lr_scheduler_type", "cosine"], "lr_scheduler", "cosine"),
        (["--save_steps", "5"], "save_every", 5),
        (["--save_total_limit", "4"], "keep_last", 4),
        (["--eval_steps", "7"], "eval_every", 7),
        (["--report_to", "wandb"], "wandb", True),
        (["--report_to", "none"], "wandb", False),
        (["--vllm_gpu_memory_utilization", "0.5"], "vllm_memory_fraction", 0.5),
        (["--lora_target_modules", "q_proj,v_proj"], "target_modules", "q_proj,v_proj"),
        (["--lora_r", "8", "--load_in_4bit"], "use_qlora", True),
        (["--use_vllm", "false"], "engine", "hf"),
        (["--bf16", "true"], "dtype", "bfloat16"),
        (["--gradient_checkpointing", "no"], "gradient_checkpointing", False),
        (["--dynamic_sampling", "1"], "dynamic_sampling", "on"),
    ],
)
def test_trl_names_and_boolean_spellings_on_the_command_line(argv, field, value):
    cfg = _resolve(["--model", "m", *argv])
    flat = {k: v for section in cfg.to_dict().values() for k, v in section.items()}
    assert flat[field] == value


def test_trl_names_in_a_config_file_are_saved_under_ours(tmp_path):
    path = tmp_path / "trl.yaml"
    path.write_text(
        "model_name_or_path: m\nnum_iterations: 2\nepsilon: 0.15\nlr_scheduler_type: linear\n"
        "mask_truncated_completions: true\nsave_total_limit: 3\nreport_to: [tensorboard]\n"
        "lora_target_modules: [q_proj, v_proj]\nlora_r: 4\n"
    )
    cfg = _resolve(["--config", str(path)])
    saved = yaml.safe_load(cfg.to_yaml())
    flat = {k: v for section in saved.values() for k, v in section.items()}
    assert flat["mu"] == 2 and flat["epsilon_low"] == 0.15 and flat["lr_scheduler"] == "linear"
    assert flat["mask_truncated"] is True and flat["keep_last"] == 3 and flat["wandb"] is False
    assert flat["target_modules"] == "q_proj,v_proj" and flat["model"] == "m"
    assert not {"num_iterations", "epsilon", "lr_scheduler_type", "report_to"} & set(flat)


def test_abbreviations_are_not_guessed(capsys):
    # `--lr` is TRL's learning rate, never a prefix of --lr_scheduler; a prefix is an error.
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--learning_r", "1e-6"])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_giving_a_field_twice_under_two_names_is_an_error(capsys):
    assert main(["--model", "m", "--mu", "2", "--num_iterations", "3"]) == 2
    assert "num_iterations" in capsys.readouterr().err


def test_bare_grpo_prints_help_and_version(capsys):
    assert grpo_main([]) == 0
    out = capsys.readouterr().out
    assert "usage: grpo COMMAND" in out and "train" in out and "eval" in out
    assert grpo_main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("grpo-kit ")


def test_bare_grpo_command_line_starts_nothing():
    proc = subprocess.run([GRPO], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert "usage: grpo COMMAND" in proc.stdout
    assert "held-out" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_trl_named_run_in_a_fresh_folder_then_refused_then_overwritten(tiny_model_path, tmp_path):
    """A user's second hour, on the real CLI: TRL names, a folder per run, no silent mixing."""
    run = tmp_path / "run"
    common = [
        "train", "--model", str(tiny_model_path), "--env", "math/add2-v0", "--engine", "hf",
        "--max_steps", "1", "--num_generations", "2", "--prompts_per_step", "2",
        "--max_completion_length", "8", "--eval_size", "2", "--progress", "false",
        "--output_dir", str(run),
    ]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}

    def grpo(*extra):
        return subprocess.run(
            [GRPO, *common, *extra], capture_output=True, text=True, timeout=600, env=env
        )

    proc = grpo("--epsilon", "0.1", "--lr", "1e-5", "--scale_rewards", "false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["algorithm"]["epsilon_low"] == 0.1 and saved["algorithm"]["epsilon_high"] == 0.1
    assert saved["algorithm"]["scale_rewards"] == "none"
    assert saved["optim"]["learning_rate"] == 1e-5
    assert saved["policy"]["dtype"] == "float32"  # auto, resolved on a CPU

    proc = grpo("--learning_rate", "2e-5")  # another run, same folder
    assert proc.returncode == 2
    assert "--overwrite" in proc.stderr and "learning_rate" in proc.stderr

    proc = grpo("--learning_rate", "2e-5", "--overwrite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [yaml.safe_load(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]  # the first run's rows are gone
