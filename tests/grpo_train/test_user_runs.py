"""A user's second hour, on the real CLI with a tiny model: the points where it used to surprise.

A base model (no chat template) trained with LoRA and W&B, interrupted and resumed; its
checkpoints evaluated one after the other; a run with no learning signal told so.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_prompts import base_model_copy

GRPO = str(Path(sys.executable).with_name("grpo"))

FAKE_WANDB = """
import json, os
class _Run:
    def log(self, metrics, step=None):
        with open(os.environ["FAKE_WANDB_LOG"], "a") as f:
            f.write(json.dumps({"log_step": step}) + "\\n")
    def finish(self):
        pass
def init(**kwargs):
    with open(os.environ["FAKE_WANDB_LOG"], "a") as f:
        f.write(json.dumps({"init": {k: v for k, v in kwargs.items() if k != "config"}}) + "\\n")
    return _Run()
"""


def _env(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "fake_site"
    (fake / "wandb").mkdir(parents=True, exist_ok=True)
    (fake / "wandb" / "__init__.py").write_text(FAKE_WANDB)
    path = os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "FAKE_WANDB_LOG": str(tmp_path / "wandb.jsonl"),
        "TOKENIZERS_PARALLELISM": "false",
    }


def _run(argv, env, cwd, timeout=900):
    return subprocess.run(
        [GRPO, *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_base_model_lora_wandb_resume_then_eval_two_checkpoints(tiny_model_path, tmp_path):
    base = base_model_copy(tiny_model_path, tmp_path / "base-model")
    env, run = _env(tmp_path), tmp_path / "run"
    train = [
        "train", "--model", str(base), "--env", "math/add2-v0", "--engine", "hf",
        "--num_generations", "2", "--prompts_per_step", "2", "--max_completion_length", "8",
        "--eval_size", "2", "--progress", "false", "--output_dir", str(run),
        "--lora_r", "4", "--lora_alpha", "8", "--save_steps", "1", "--save_total_limit", "5",
        "--log_every_samples", "1", "--report_to", "wandb", "--wandb_run_name", "mine",
        "--wandb_tags", "a,b", "--prompt_template", "Q: {prompt}\nA:",
    ]  # fmt: skip
    # 1. Three steps of a base model (training used to crash in the chat template); the random
    #    model never answers right, so every group has equal rewards: the guard says so, once.
    proc = _run([*train, "--max_steps", "3"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert out.count("learning signal:") == 1
    assert "dynamic_sampling" in out and "temperature" in out and "num_generations" in out
    # 2. Pretend the run was interrupted after step 2: resume redoes step 3 (and goes on to 4).
    proc = _run([*train, "--max_steps", "4", "--resume", str(run / "checkpoints/step-000002")],
                env, tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r["step"] for r in _rows(run / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4]
    sample_steps = sorted({r["step"] for r in _rows(run / "samples.jsonl")})
    assert sample_steps == [1, 2, 3, 4]
    assert len(_rows(run / "samples.jsonl")) == 4 * 2  # no duplicated rows for step 3
    inits = [r["init"] for r in _rows(tmp_path / "wandb.jsonl") if "init" in r]
    assert len(inits) == 2 and inits[0]["id"] == inits[1]["id"]  # one W&B run, resumed
    assert inits[1]["resume"] == "allow" and inits[0]["name"] == "mine"
    assert inits[0]["tags"] == ["a", "b"]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["run"]["save_every"] == 1 and saved["run"]["wandb"] is True
    # 3. Evaluate two LoRA checkpoints in a row with the default output folders; the run's
    #    plain-text format is used for the base model, as in training.
    for step in ("step-000003", "step-000004"):
        ckpt = run / "checkpoints" / step / "model"
        assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "config.json").exists()
        proc = _run(
            ["eval", "--model", str(ckpt), "--suite", "math/add2-v0", "--limit", "2",
             "--engine", "hf", "--max_tokens", "8", "--no_progress"],
            {**env, "GRPO_KIT_CACHE": str(tmp_path / "cache")}, tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
    folders = sorted(p.name for p in (tmp_path / "eval_runs").iterdir())
    assert len(folders) == 2 and "000003" in folders[0] and "000004" in folders[1]
    summary = json.loads((tmp_path / "eval_runs" / folders[0] / "summary.json").read_text())
    assert summary["prompt_template"]["prompt_template"] == "Q: {prompt}\nA:"
    first = _rows(tmp_path / "eval_runs" / folders[0] / "samples.jsonl")[0]
    assert first["prompt"].startswith("Q: ")
