import pytest

import grpo_envs
from grpo_envs.types import Outcome, Sample

pytest.importorskip("reasoning_gym")


def test_family_id_wraps_generator_and_scorer():
    env = grpo_envs.make("rg/leg_counting-v0", train_size=40, test_size=20)
    row = env.dataset("train")[0]
    assert "legs" in row["prompt"][0]["content"]
    assert env.score(f"<answer>{row['answer']}</answer>", row).outcome is Outcome.CORRECT
    assert env.score(f"<answer>{int(row['answer']) + 1}</answer>", row).outcome is Outcome.WRONG
    assert env.score(row["answer"], row).outcome is Outcome.UNPARSABLE  # no tags: no guessing
    train = set(env.dataset("train")["prompt"][i][0]["content"] for i in range(40))
    assert not train & {p[0]["content"] for p in env.dataset("test")["prompt"]}


def test_generic_id_with_task_and_config():
    env = grpo_envs.make(
        "rg/reasoning-gym-v0",
        task="basic_arithmetic",
        train_size=5,
        test_size=5,
        min_terms=2,
        max_terms=2,
    )
    sample = Sample.from_row(env.dataset("test")[0])
    assert env.score(env.reference_completion(sample), sample).correct


def test_partial_credit_is_off_by_default():
    env = grpo_envs.make("rg/reasoning-gym-v0", task="leg_counting", train_size=5, test_size=5)
    assert env.partial_credit is False
    with pytest.raises(ValueError, match="close matches"):
        grpo_envs.make("rg/reasoning-gym-v0", task="leg_countin")
