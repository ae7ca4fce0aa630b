"""The README's code must keep working: newcomers copy it."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_custom_environment_example_runs_and_scores():
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None, "the README lost its environment example"
    from grpo_envs import check_env, make, registration
    from grpo_envs.types import Outcome

    try:
        exec(compile(code.group(1), "README.md", "exec"), {})  # registers demo/double-v0
        env = make("demo/double-v0")
        check_env(env)
        held_out = env.dataset("test")[0]
        gold = int(held_out["answer"])
        assert env.score(f"So \\boxed{{{gold}}}", held_out).outcome is Outcome.CORRECT
        assert env.score(f"So \\boxed{{{gold + 1}}}", held_out).reward == 0.0
    finally:
        registration.registry.pop("demo/double-v0", None)


def test_readme_quick_start_has_exactly_two_commands():
    text = README.read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", quick, re.S)
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert commands == [
        "bash scripts/setup.sh && .venv/bin/grpo train",
        "bash scripts/setup.sh --dev && .venv/bin/python -m pytest -n 2 --dist worksteal",
    ]


FIXTURES = Path(__file__).resolve().parent / "grpo_envs" / "fixtures" / "dataset"


def _python_block(containing: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    found = [b for b in blocks if containing in b]
    assert found, f"the README lost its example with {containing!r}"
    return found[0]


@pytest.mark.slow
def test_readme_trl_example_builds_the_trainer_and_scores_through_trl(
    tiny_model_path, tmp_path, monkeypatch
):
    """The README's TRL snippet, run as written (minus train()), then TRL's own reward path."""
    pytest.importorskip("trl")
    import shutil

    code = _python_block("GRPOTrainer")
    assert "trainer.train()" in code
    (tmp_path / "data").mkdir()
    shutil.copy(FIXTURES / "questions.jsonl", tmp_path / "data" / "questions.jsonl")
    monkeypatch.chdir(tmp_path)
    # On a CPU the trainer must not ask for bf16; everything else is the README's code.
    code = code.replace("trainer.train()", "").replace(
        "per_device_train_batch_size=4)", "per_device_train_batch_size=4, bf16=False)"
    )
    namespace: dict[str, object] = {"MODEL": str(tiny_model_path)}
    exec(compile(code, "README.md", "exec"), namespace)
    trainer, env = namespace["trainer"], namespace["env"]
    rows = [env.dataset("train")[i] for i in range(2)]  # type: ignore[attr-defined]
    completions = [
        [{"role": "assistant", "content": f"So \\boxed{{{rows[0]['answer']}}}."}],
        [{"role": "assistant", "content": "I do not know."}],
    ]
    # GRPOTrainer._calculate_rewards is the call TRL makes on every step.
    rewards = trainer._calculate_rewards(  # type: ignore[attr-defined]
        rows, [r["prompt"] for r in rows], completions, [[1], [2]]
    )
    assert rewards.tolist() == [[1.0], [0.0]]
