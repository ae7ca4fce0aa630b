"""A tiny learnable environment for trainer tests: reward 1 when the answer starts with a digit."""

from __future__ import annotations

import datasets

from grpo_envs.base import Environment
from grpo_envs.types import Component, Outcome, Sample, Score


class DigitEnv(Environment):
    """'Answer with a digit': reward 1 if the completion's first non-space character is a digit.

    About 5% of the tiny test tokenizer's tokens start with a digit, so a random policy finds the
    reward now and then and GRPO can raise it within a few steps.
    """

    env_id = "test/digit-v0"
    score_workers = 0  # score in-process: the toy scorer cannot hang

    def __init__(self, size: int = 64, fail_on: str | None = None) -> None:
        self.size = size
        self.fail_on = fail_on

    def dataset(self, split: str = "train") -> datasets.Dataset:
        offset = 0 if split == "train" else 10_000
        n = self.size if split == "train" else 16
        rows = [
            Sample(
                id=f"{split}-{i}",
                prompt=(),
                answer="7",
                env_id=self.env_id,
            ).to_row()
            | {"prompt": [{"role": "user", "content": f"Question {offset + i}: say a digit."}]}
            for i in range(n)
        ]
        return datasets.Dataset.from_list(rows)

    def score(self, completion: str, sample) -> Score:
        if self.fail_on is not None and completion.startswith(self.fail_on):
            raise RuntimeError("scorer bug")
        text = completion.lstrip()
        ok = bool(text) and text[0].isdigit()
        return Score(
            reward=1.0 if ok else 0.0,
            outcome=Outcome.CORRECT if ok else Outcome.WRONG,
            components=(Component("digit", 1.0 if ok else 0.0),),
        )
