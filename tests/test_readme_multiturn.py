"""The README's multi-turn environment example runs as written and does what its comment says."""

import contextlib
import io
import re
from pathlib import Path

from grpo_envs import registration

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_multi_turn_example_runs_and_prints_what_it_says():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (code,) = [b for b in blocks if "MultiTurnEnv(" in b]
    assert len(code.strip().splitlines()) < 40
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {})
    finally:
        registration.registry.pop("demo/double-retry-v0", None)
    assert out.getvalue() == "done 0.9\n"
