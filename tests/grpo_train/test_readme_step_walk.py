"""grpo_train/README.md walks one step naming each function it calls: those names must exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "grpo_train" / "README.md"
#: Where the walk's unqualified class names live.
CLASSES = {
    "Trainer": "grpo_train.trainer",
    "TrainingPrompts": "grpo_train.collect.training_prompts",
    "RunLogger": "grpo_train.run.run_log",
}


def _walk() -> str:
    text = README.read_text()
    start = text.index("## The loop (`trainer.py`)")
    return text[start : text.index("\n## ", start + 1)]


def test_the_step_walk_is_under_a_page_and_every_function_it_names_exists() -> None:
    walk = _walk()
    assert len(walk.splitlines()) <= 60
    names = set(re.findall(r"`([A-Za-z_][\w.]*\.[A-Za-z_]\w*)`", walk))
    names |= set(re.findall(r"`([A-Za-z_][\w.]*\.[A-Za-z_]\w*)\(", walk))
    checked = 0
    for name in sorted(names):
        if name.endswith(".py"):
            continue
        head, *rest = name.split(".")
        if head in CLASSES:
            obj: object = getattr(importlib.import_module(CLASSES[head]), head)
        elif head == "grpo_envs":
            obj = importlib.import_module(".".join([head, rest.pop(0)]))
        else:
            obj = importlib.import_module(f"grpo_train.{head}")
        for part in rest:
            assert hasattr(obj, part), f"the README's step walk names {name}, which does not exist"
            obj = getattr(obj, part)
        checked += 1
    assert checked >= 15  # the walk names the step's calls, not just its modules
