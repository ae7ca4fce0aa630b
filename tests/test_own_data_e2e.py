"""A new user's data file becomes an environment with no code, and every tool takes it.

For a 20-row JSONL of math questions and a file of coding problems with tests: YAML only ->
``grpo envs score`` -> ``grpo train`` (2 steps, tiny model) -> ``grpo eval --suite`` -> verl's
reward-function calls (per item and batch, with exactly verl's keywords) -> TRL's GRPOTrainer
reward path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

FIXTURES = Path(__file__).resolve().parent / "grpo_envs" / "fixtures" / "dataset"
GRPO = str(Path(sys.executable).with_name("grpo"))

CASES = {
    "math": {
        "file": "questions.jsonl",
        "id": "math/dataset-v0",
        "kwargs": {"question": "problem", "answer": "solution", "id": "qid"},
        "good": lambda row: f"The sum is \\boxed{{{row['answer'].rsplit('#', 1)[-1].strip()}}}.",
    },
    "code": {
        "file": "code_problems.jsonl",
        "id": "code/dataset-v0",
        "kwargs": {
            "question": "task",
            "tests": "tests",
            "solution": "reference",
            "id": "name",
            "test_fraction": 0.34,
        },
        "good": lambda row: f"```python\n{row['answer']}```",
    },
}


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [GRPO, *args], cwd=cwd, capture_output=True, text=True, timeout=900, env=env
    )
    assert proc.returncode == 0, (
        f"grpo {' '.join(args)}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    )
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_data_file_is_an_environment_for_every_tool(kind, tiny_model_path, tmp_path):
    case = CASES[kind]
    (tmp_path / "data").mkdir()
    shutil.copy(FIXTURES / case["file"], tmp_path / "data" / case["file"])
    kwargs = {"path": f"data/{case['file']}", **case["kwargs"]}
    env_entry = {"id": case["id"], "kwargs": kwargs}

    # 1. grpo envs score, from the rows the environment shows.
    import grpo_envs

    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        env = grpo_envs.make(case["id"], **kwargs)
        rows = list(env.dataset("train"))
    finally:
        os.chdir(cwd)
    lines = [{"id": rows[0]["id"], "completion": case["good"](rows[0])}]
    lines.append({"id": rows[1]["id"], "completion": "no answer at all"})
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = _run(
        "envs", "score", case["id"], "--kwargs", json.dumps(kwargs), "--split", "train",
        "--completions", "completions.jsonl", "--out", "scores.jsonl", cwd=tmp_path,
    )  # fmt: skip
    assert "2 completions, accuracy 0.5000" in proc.stdout
    scored = [json.loads(x) for x in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert [s["reward"] for s in scored] == [1.0, 0.0]

    # 2. grpo train, configured by YAML only.
    config = {
        "model": str(tiny_model_path),
        "env": [env_entry],
        "engine": "hf",
        "max_steps": 2,
        "num_generations": 2,
        "prompts_per_step": 2,
        "max_completion_length": 8,
        "eval_size": 2,
        "output_dir": "run",
        "progress": False,
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    proc = _run("train", "--config", "run.yaml", cwd=tmp_path)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "step" in m][-1] == 2

    # 3. grpo eval --suite: the id with --env_kwargs, and a suites file entry with kwargs.
    (tmp_path / "suites.yaml").write_text(yaml.safe_dump({"suites": {"mine": [env_entry]}}))
    for extra in (
        ["--suite", "mine", "--suites_file", "suites.yaml", "--out", "eval_a"],
        [
            "--suite",
            case["id"],
            "--env_kwargs",
            json.dumps({case["id"]: kwargs}),
            "--out",
            "eval_b",
        ],
    ):
        proc = _run(
            "eval", "--model", str(tiny_model_path), "--engine", "hf", "--limit", "2",
            "--max_tokens", "8", "--no_progress", *extra, cwd=tmp_path,
        )  # fmt: skip
        assert case["id"] in proc.stdout or "mine" in proc.stdout
        assert (tmp_path / extra[-1]).is_dir()

    # 4. verl: rows written by to_verl_rows, scored in a fresh process (verl's reward worker,
    # which imported nothing) with exactly the keywords verl passes.
    from grpo_envs.adapters import to_verl_rows

    os.chdir(tmp_path)
    try:
        verl_rows = to_verl_rows(env, "train")[:2]
    finally:
        os.chdir(cwd)
    (tmp_path / "verl_rows.json").write_text(json.dumps(verl_rows))
    solutions = [case["good"](rows[0]), "no answer at all"]
    (tmp_path / "solutions.json").write_text(json.dumps(solutions))
    worker = """
import json
from grpo_envs.adapters import compute_score
rows = json.load(open("verl_rows.json"))
solutions = json.load(open("solutions.json"))
single = []
for row, solution in zip(rows, solutions):
    extra_info = dict(row["extra_info"], num_turns=None, rollout_reward_scores={})
    single.append(compute_score(data_source=row["data_source"], solution_str=solution,
        ground_truth=row["reward_model"]["ground_truth"], extra_info=extra_info))
batch = compute_score(data_sources=[r["data_source"] for r in rows], solution_strs=solutions,
    ground_truths=[r["reward_model"]["ground_truth"] for r in rows],
    extra_infos=[r["extra_info"] for r in rows])
print(json.dumps({"single": single, "batch": batch}))
"""
    out = subprocess.run(
        [sys.executable, "-c", worker],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(cwd)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    expected = [
        {"score": 1.0, "acc": 1.0, "failed": 0.0},
        {"score": 0.0, "acc": 0.0, "failed": 0.0},
    ]
    assert got == {"single": expected, "batch": expected}

    # 5. TRL: GRPOTrainer's own reward step, with conversational completions.
    pytest.importorskip("trl")
    from trl import GRPOConfig, GRPOTrainer

    from grpo_envs.adapters import trl_reward_funcs

    trainer = GRPOTrainer(
        model=str(tiny_model_path),
        reward_funcs=trl_reward_funcs(env),
        train_dataset=env.dataset("train"),
        args=GRPOConfig(
            output_dir=str(tmp_path / "trl"),
            num_generations=2,
            per_device_train_batch_size=2,
            max_completion_length=8,
            report_to="none",
            bf16=False,
        ),
    )
    completions = [[{"role": "assistant", "content": s}] for s in solutions]
    rewards = trainer._calculate_rewards(
        rows[:2], [r["prompt"] for r in rows[:2]], completions, [[1], [2]]
    )
    assert rewards.tolist() == [[1.0], [0.0]]
