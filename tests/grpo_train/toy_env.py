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


def digit_retry_env(
    size: int = 64, max_turns: int = 3, reply_role: str = "user", reply: str = "Say a digit."
):
    """``DigitEnv`` as episodes: a turn that does not start with a digit is answered ``reply``.

    The rubric scores the last turn as ``DigitEnv`` does; each turn after the first costs 0.1.
    ``reply_role="tool"`` sends the reply as a tool result (a tool environment's messages).
    """
    from grpo_envs.episode import EpisodeBudget, MultiTurnEnv, Step, turn_penalty
    from grpo_envs.rubric import RewardComponent, Rubric

    def digit(ctx) -> float:
        text = ctx.completion.lstrip()
        return 1.0 if text and text[0].isdigit() else 0.0

    def step(state, turn: str) -> Step:
        text = turn.lstrip()
        if text and text[0].isdigit():
            return Step.end()
        return Step.reply(reply, role=reply_role)

    def rows(offset: int, n: int) -> list[dict[str, str]]:
        return [
            {"question": f"Question {offset + i}: say a digit.", "answer": "7"} for i in range(n)
        ]

    env = MultiTurnEnv(
        {"train": rows(0, size), "test": rows(10_000, 16)},
        Rubric([RewardComponent("digit", 1.0, digit)]),
        step,
        budget=EpisodeBudget(max_turns=max_turns),
        episode_components=[turn_penalty(-0.1)],
        prompt_template="{question}",
    )
    env.env_id = "test/digit-retry-v0"
    return env
