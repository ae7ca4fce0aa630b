"""The prompt order: deterministic, weighted by environment, a permutation per epoch, resumable."""

import pytest

from grpo_train.prompt_sampler import PromptSampler


def test_prompt_sampler_is_deterministic_weighted_and_resumable():
    a = PromptSampler([5, 3], [3.0, 1.0], seed=1)
    draws = [a.next() for _ in range(40)]
    envs = [e for e, _ in draws]
    assert 20 < envs.count(0) < 40  # weight 3:1
    first_epoch = [r for e, r in draws if e == 1][:3]
    assert sorted(first_epoch) == [0, 1, 2]  # each epoch is a permutation
    b = PromptSampler([5, 3], [3.0, 1.0], seed=1)
    for _ in range(17):
        b.next()
    c = PromptSampler([5, 3], [3.0, 1.0], seed=1, state=b.state())
    assert [c.next() for _ in range(23)] == draws[17:]


def test_an_environment_without_rows_is_refused():
    with pytest.raises(ValueError, match="at least one training row"):
        PromptSampler([5, 0], [1.0, 1.0], seed=0)
