"""The README's code must keep working: newcomers copy it."""

import re
from pathlib import Path

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
        "bash scripts/setup.sh --dev && .venv/bin/python -m pytest",
    ]
