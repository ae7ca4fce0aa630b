import math

import pytest
import torch

from grpo_train.algorithm.advantages import compute_advantages, group_stats, informative_groups

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])


def test_grpo_group_scaling_matches_hand_computation():
    adv = compute_advantages(REWARDS, "grpo", "group", eps=1e-4)
    std = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1, 0, 0, 1]
    expected = 0.5 / (std + 1e-4)
    assert adv[0].tolist() == pytest.approx([expected, -expected, -expected, expected], rel=1e-6)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_grpo_batch_scaling_uses_the_std_of_all_rewards():
    adv = compute_advantages(REWARDS, "grpo", "batch", eps=1e-4)
    # mean 0.75; unbiased variance (6 * 0.25**2 + 2 * 0.75**2) / 7 = 1.5 / 7
    std = math.sqrt(1.5 / 7)
    assert adv[0, 0].item() == pytest.approx(0.5 / (std + 1e-4), rel=1e-6)
    assert adv[1, 0].item() == 0.0  # still centred per group


def test_scale_none_is_dr_grpo_plain_centering():
    adv = compute_advantages(torch.tensor([[3.0, 1.0, 2.0]]), "grpo", "none")
    assert adv.tolist() == [[1.0, -1.0, 0.0]]


def test_rloo_leave_one_out_baseline():
    adv = compute_advantages(torch.tensor([[1.0, 0.0, 0.0]]), "rloo", "none")
    # r_i - mean of the others: 1 - 0, 0 - 0.5, 0 - 0.5
    assert adv.tolist() == [[pytest.approx(1.0), pytest.approx(-0.5), pytest.approx(-0.5)]]


@pytest.mark.parametrize("bad", [torch.tensor([1.0, 2.0]), torch.tensor([[1.0], [2.0]])])
def test_bad_shapes_are_rejected(bad):
    with pytest.raises(ValueError, match="group >= 2"):
        compute_advantages(bad)


def test_nan_rewards_are_rejected():
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages(torch.tensor([[1.0, float("nan")]]))


def test_informative_groups_and_stats():
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 0.0]])
    assert informative_groups(rewards).tolist() == [True, False, False]
    stats = group_stats(rewards)
    assert stats.frac_zero_std == pytest.approx(2 / 3)
    assert stats.reward_mean == pytest.approx(2 / 6)
    assert stats.group_std_mean == pytest.approx(math.sqrt(0.5) / 3)


def test_informative_groups_counts_only_the_masked_rewards_within_a_tolerance():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0 + 1e-9, 1.0], [0.3, 0.3, 0.9]])
    mask = torch.tensor([[True, True, False], [True, True, True], [True, True, False]])
    # Row 1 differs by less than the tolerance: zero advantage, not informative.
    assert informative_groups(rewards).tolist() == [True, False, True]
    # Row 2's only different reward is masked out (a failed score): nothing to learn.
    assert informative_groups(rewards, mask).tolist() == [True, False, False]
    one_left = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    assert informative_groups(rewards, one_left).tolist() == [False, False, True]
    assert informative_groups(torch.zeros(2, 0)).tolist() == [False, False]


def test_group_informative_is_the_same_rule_as_the_batch_mask():
    from grpo_envs.types import Message, Outcome, Sample, Score
    from grpo_train.collect.groups import Group

    sample = Sample("s", (Message("user", "q"),), "a")

    def group(*scores: Score) -> Group:
        return Group(sample, 0, [1], scores=list(scores))

    right, wrong = (
        Score(reward=1.0, outcome=Outcome.CORRECT),
        Score(reward=0.0, outcome=Outcome.WRONG),
    )
    nearly = Score(reward=1.0 + 1e-9, outcome=Outcome.CORRECT)
    failed = Score.failure(Outcome.ERROR, "scorer raised")
    cases = [
        group(right, wrong, wrong),  # rewards differ
        group(right, nearly, nearly),  # within the tolerance
        group(right, right, failed),  # the failed score's 0 does not count
        group(right, failed, failed),  # dropped: fewer than two scored
        group(wrong, right, failed),  # differ among the scored ones
    ]
    assert [g.informative for g in cases] == [True, False, False, False, True]
    rows = [[g.rewards, g.trainable] for g in cases]
    mask = informative_groups(
        torch.tensor([r for r, _ in rows], dtype=torch.float64), torch.tensor([t for _, t in rows])
    )
    assert mask.tolist() == [g.informative for g in cases]
