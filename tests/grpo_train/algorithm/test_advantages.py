import math
import warnings

import pytest
import torch

from grpo_train.algorithm.advantages import (
    compute_advantages,
    group_stats,
    informative_groups,
    scale_centred,
)

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


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_groups_with_fewer_than_two_scored_get_zero_and_two_are_enough(estimator, scale):
    rewards = torch.tensor([[1.0, 0.0, 7.0], [1.0, 0.0, 1.0], [0.5, 0.2, 0.9]])
    valid = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    adv = compute_advantages(rewards, estimator, scale, eps=1e-4, valid=valid)
    # Row 0 has exactly MIN_SCORED (2) scored rewards, [1, 0]: mean 0.5, centred [0.5, -0.5];
    # rloo: r_i - the other one = [1, -1]. Unbiased std of [1, 0]: sqrt(0.5), also the batch std
    # (row 0 holds the only trainable rewards). Rows 1 (one scored) and 2 (none): dropped, 0.
    c = 0.5 if estimator == "grpo" else 1.0
    if scale != "none":
        c /= math.sqrt(0.5) + 1e-4
    assert adv[0].tolist() == pytest.approx([c, -c, 0.0], rel=1e-6)
    assert adv[1:].tolist() == [[0.0] * 3, [0.0] * 3]


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_scale_centred_divides_a_group_of_one_or_none_by_eps_not_nan(scale):
    # Row 0: one masked reward (3.0), centred on itself: 0; row 1: nothing masked. The std of
    # one reward, or of none, is 0 (n - 1 and n clamp at 1), so each entry is 0 / (0 + eps) = 0;
    # "batch": the one kept reward has std 0 too, never torch.std's NaN.
    rewards = torch.tensor([[3.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False], [False, False]])
    centred = torch.zeros(2, 2, dtype=torch.float64)
    assert scale_centred(centred, rewards, mask, scale, eps=1e-4).tolist() == [[0.0] * 2] * 2
    # A nonzero centred value shows the divisor: 1 / (0 + eps).
    centred[0, 0] = 1.0
    out = scale_centred(centred, rewards, mask, scale, eps=0.5)
    assert out.tolist() == [[2.0, 0.0], [0.0, 0.0]]


def test_a_spread_equal_to_the_tolerance_agrees():
    rewards = torch.tensor([[0.0, 0.5]])  # spread exactly 0.5 (representable)
    assert informative_groups(rewards, tol=0.5).tolist() == [False]
    assert informative_groups(rewards, tol=0.25).tolist() == [True]


def test_group_stats_of_a_single_group_and_of_a_lone_reward():
    # One group [1, 0, 0, 1]: the batch std is the group std, sqrt(4 * 0.25 / 3).
    stats = group_stats(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert stats.reward_mean == pytest.approx(0.5)
    assert stats.reward_std == pytest.approx(math.sqrt(1 / 3))
    assert stats.group_std_mean == pytest.approx(math.sqrt(1 / 3))
    assert stats.frac_zero_std == 0.0
    # One reward: its std is 0, not torch.std's NaN (the in-group std of one reward is
    # undefined and warns; it is not checked here).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        lone = group_stats(torch.tensor([[0.7]]))
    assert lone.reward_std == 0.0
    assert lone.reward_mean == pytest.approx(0.7)
