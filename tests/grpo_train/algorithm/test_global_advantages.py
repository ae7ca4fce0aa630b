"""Advantages over every rank's groups, on one process (the two-rank runs: ``test_distributed``)."""

import pytest
import torch

from grpo_train.algorithm.advantages import compute_advantages
from grpo_train.algorithm.baselines import EmaBaselines, ema_advantages, group_key
from grpo_train.algorithm.global_advantages import (
    gather_step_rewards,
    global_advantages,
    global_ema_advantages,
)

EMA_START = EmaBaselines({"0/a": 2.0}, {"0": 5.0})


def test_single_process_global_advantages_are_the_local_ones() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 1.0]])
    gathered = gather_step_rewards(rewards)
    assert gathered.rewards is rewards and gathered.valid is None and gathered.offset == 0
    with pytest.raises(ValueError, match="prompts, group"):
        gather_step_rewards(rewards.flatten())
    result = global_advantages(rewards, scale_rewards="batch")
    torch.testing.assert_close(result.local, compute_advantages(rewards, scale_rewards="batch"))
    assert result.offset == 0
    valid = torch.tensor([[True, True, False], [True, True, True]])
    keys = [group_key(0, "a"), group_key(0, "b")]
    ema, ema_state = global_ema_advantages(rewards, keys, EMA_START, 0.9, "batch", valid)
    want, want_state = ema_advantages(rewards, keys, EMA_START, 0.9, "batch", valid=valid)
    assert torch.equal(ema, want) and ema_state == want_state


def test_single_process_keeps_every_row_when_groups_outnumber_their_size() -> None:
    # Three groups of two: this rank's rows are all three (a row count taken from the group
    # size, 2, would cut the last group off).
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    gathered = gather_step_rewards(rewards)
    assert gathered.rows == 3
    assert torch.equal(gathered.local(rewards), rewards)
    result = global_advantages(rewards, scale_rewards="none")
    # grpo, no scaling: r - group mean = [0.5, -0.5], [0, 0], [-0.5, 0.5]
    assert result.local.tolist() == [[0.5, -0.5], [0.0, 0.0], [-0.5, 0.5]]
