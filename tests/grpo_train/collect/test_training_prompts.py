"""The prompt order: deterministic, weighted by environment, a permutation per epoch, resumable."""

import pytest

import grpo_envs
from grpo_envs.mixture import MixtureEnv
from grpo_train.collect.training_prompts import PromptSampler


def test_prompt_sampler_is_deterministic_weighted_and_resumable():
    a = PromptSampler([5, 3], [3.0, 1.0], seed=1)
    draws = [a.next_row() for _ in range(40)]
    envs = [e for e, _ in draws]
    assert 20 < envs.count(0) < 40  # weight 3:1
    first_epoch = [r for e, r in draws if e == 1][:3]
    assert sorted(first_epoch) == [0, 1, 2]  # each epoch is a permutation
    b = PromptSampler([5, 3], [3.0, 1.0], seed=1)
    for _ in range(17):
        b.next_row()
    c = PromptSampler([5, 3], [3.0, 1.0], seed=1, state=b.state())
    assert [c.next_row() for _ in range(23)] == draws[17:]


def test_an_environment_without_rows_is_refused():
    with pytest.raises(ValueError, match="at least one training row"):
        PromptSampler([5, 0], [1.0, 1.0], seed=0)


def test_a_mixture_envs_rows_are_the_trainers_prompt_order():
    kwargs = {"train_size": 6, "test_size": 2}
    ids = {"math/add2-v0": 3.0, "math/countdown-v0": 1.0}
    mix = MixtureEnv.from_ids(ids, size=20, seed=4, env_kwargs=kwargs)
    members = [grpo_envs.make(env_id, **kwargs).dataset("train") for env_id in ids]
    sampler = PromptSampler([6, 6], list(ids.values()), seed=4)
    expected = []
    for _ in range(20):
        env, row = sampler.next_row()
        expected.append(f"{list(ids)[env]}:{members[env][row]['id']}")
    assert [row_id.split("#")[0] for row_id in mix.dataset("train")["id"]] == expected
