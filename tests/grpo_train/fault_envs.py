"""Environments with broken scorers, registered on import (``--env fault_envs:faults/...``).

As a user meets them: a custom env module passed on the command line whose reward function
raises now and then, always, or returns a ``Score`` with reward None / NaN.
"""

from __future__ import annotations

from toy_env import DigitEnv

import grpo_envs
from grpo_envs.types import Outcome, Score


class FlakyEnv(DigitEnv):
    """Every ``every``-th scored completion raises (deterministic: scored in-process, in order)."""

    env_id = "faults/flaky-v0"

    def __init__(self, every: int = 4, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.every = every
        self.calls = 0

    def score(self, completion: str, sample) -> Score:
        self.calls += 1
        if self.calls % self.every == 0:
            raise ConnectionError(f"reward server timed out (call {self.calls})")
        return super().score(completion, sample)


class BrokenEnv(DigitEnv):
    """The reward function always raises."""

    env_id = "faults/broken-v0"

    def score(self, completion: str, sample) -> Score:
        raise KeyError("answer_key")


class BadRewardEnv(DigitEnv):
    """Returns a Score whose reward is None (odd calls) or NaN (even calls)."""

    env_id = "faults/bad-reward-v0"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.calls = 0

    def score(self, completion: str, sample) -> Score:
        self.calls += 1
        reward = None if self.calls % 2 else float("nan")
        return Score(reward=reward, outcome=Outcome.CORRECT)  # type: ignore[arg-type]


for _cls in (FlakyEnv, BrokenEnv, BadRewardEnv):
    if _cls.env_id not in grpo_envs.registration.registry:
        grpo_envs.register(_cls.env_id, f"fault_envs:{_cls.__name__}")
if "faults/digit-v0" not in grpo_envs.registration.registry:
    grpo_envs.register("faults/digit-v0", "toy_env:DigitEnv")
