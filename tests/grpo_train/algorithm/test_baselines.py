"""EMA baselines across steps, against a plain-Python reference computation."""

import math
import statistics

import pytest
import torch

from grpo_train.algorithm.advantages import compute_advantages
from grpo_train.algorithm.baselines import (
    EmaBaselines,
    ema_advantages,
    group_key,
)


def reference_run(steps, alpha, scale, eps=1e-4):
    """The EMA rule written out with lists and dicts, one step at a time.

    ``steps``: list of steps, each a list of (env, prompt id, rewards). Returns the advantages of
    each step (lists) and the final tables.
    """
    prompt_b, env_b, out = {}, {}, []
    for groups in steps:
        every = [r for _, _, rs in groups for r in rs]
        std = statistics.stdev(every) if scale == "batch" else None
        step_adv = []
        for env, pid, rs in groups:
            mean = sum(rs) / len(rs)
            key = f"{env}/{pid}"
            b = prompt_b.get(key, env_b.get(str(env), mean))
            adv = [r - b for r in rs]
            if std is not None:
                adv = [a / (std + eps) for a in adv]
            step_adv.append(adv)
        per_env = {}
        for env, pid, rs in groups:
            key, mean = f"{env}/{pid}", sum(rs) / len(rs)
            prompt_b[key] = (
                mean if key not in prompt_b else alpha * prompt_b[key] + (1 - alpha) * mean
            )
            per_env.setdefault(str(env), []).extend(rs)
        for env, rs in per_env.items():
            m = sum(rs) / len(rs)
            env_b[env] = m if env not in env_b else alpha * env_b[env] + (1 - alpha) * m
        out.append(step_adv)
    return out, prompt_b, env_b


STEPS = [
    [(0, "a", [1.0, 0.0, 0.0, 1.0]), (0, "b", [0.0, 0.0, 0.0, 0.0])],
    [(0, "a", [1.0, 1.0, 1.0, 1.0]), (0, "c", [1.0, 0.0, 1.0, 1.0])],  # c: new -> env baseline
    [(0, "b", [1.0, 1.0, 0.0, 1.0]), (1, "a", [0.5, 0.5, 1.0, 0.0])],  # env 1 first: group mean
    [(0, "a", [0.0, 0.0, 0.0, 0.0]), (1, "a", [1.0, 1.0, 1.0, 1.0])],
]


@pytest.mark.parametrize("scale", ["none", "batch"])
@pytest.mark.parametrize("alpha", [0.5, 0.95])
def test_matches_the_reference_over_several_steps(alpha, scale):
    expected, prompts, envs = reference_run(STEPS, alpha, scale)
    state = EmaBaselines()
    for groups, want in zip(STEPS, expected):
        rewards = torch.tensor([rs for _, _, rs in groups])
        keys = [group_key(env, pid) for env, pid, _ in groups]
        adv, state = ema_advantages(rewards, keys, state, alpha=alpha, scale_rewards=scale)
        assert adv.tolist() == [pytest.approx(row, rel=1e-5, abs=1e-6) for row in want]
    assert dict(state.prompts) == pytest.approx(prompts)
    assert dict(state.envs) == pytest.approx(envs)


def test_first_visit_is_the_group_mean_and_equal_groups_then_learn():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    first, state = ema_advantages(
        rewards, [group_key(0, "q")], EmaBaselines(), scale_rewards="none"
    )
    # No baseline yet: the group mean, so the first step is grpo with scale_rewards=none.
    assert first.tolist() == compute_advantages(rewards, "grpo", "none").tolist()
    # An all-correct group on a prompt solved half the time: grpo gives 0, ema +0.5 each.
    solved = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    adv, _ = ema_advantages(solved, [group_key(0, "q")], state, scale_rewards="none")
    assert adv.tolist() == [[0.5] * 4]
    assert compute_advantages(solved, "grpo", "none").abs().sum() == 0


def test_a_new_prompt_uses_its_environment_baseline_not_another_environments():
    state = EmaBaselines({"0/q": 0.9}, {"0": 0.25, "1": 0.75})
    rewards = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    keys = [group_key(0, "q"), group_key(0, "new"), group_key(1, "new")]
    adv, _ = ema_advantages(rewards, keys, state, scale_rewards="none")
    assert adv[:, 0].tolist() == pytest.approx([0.1, 0.75, 0.25])


def test_failed_scores_are_left_out_of_baseline_and_update():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 5.0, 0.0]])
    valid = torch.tensor([[True, True, False], [True, False, False]])  # group 2: too thin
    keys = [group_key(0, "a"), group_key(0, "b")]
    adv, state = ema_advantages(rewards, keys, EmaBaselines(), scale_rewards="none", valid=valid)
    assert adv.tolist() == [[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]
    assert dict(state.prompts) == {"0/a": 0.5}  # the dropped group updates nothing
    assert dict(state.envs) == {"0": 0.5}


def test_batch_scaling_divides_by_the_std_of_valid_rewards():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    adv, _ = ema_advantages(rewards, [group_key(0, "a")], EmaBaselines({"0/a": 0.5}))
    std = statistics.stdev([1.0, 0.0, 1.0, 1.0])
    assert adv[0, 0].item() == pytest.approx(0.5 / (std + 1e-4), rel=1e-6)


def test_state_round_trips_through_plain_dicts_and_torch_save(tmp_path):
    _, state = ema_advantages(
        torch.tensor([[1.0, 0.0]]), [group_key(2, "x")], EmaBaselines({"0/y": 0.3}, {"0": 0.1})
    )
    torch.save({"baselines": state.to_state()}, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)  # as checkpoints are read
    assert EmaBaselines.from_state(loaded["baselines"]) == state
    assert EmaBaselines.from_state(None) == EmaBaselines()


def test_the_prompt_table_forgets_the_least_recently_visited(monkeypatch):
    import grpo_train.algorithm.baselines as baselines

    monkeypatch.setattr(baselines, "MAX_PROMPT_BASELINES", 2)
    state = EmaBaselines()
    for pid in ["a", "b", "a", "c"]:  # a revisited after b: b is the oldest when c arrives
        _, state = ema_advantages(torch.tensor([[1.0, 0.0]]), [group_key(0, pid)], state)
    assert list(state.prompts) == ["0/a", "0/c"]


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.5, 1.5, math.nan])
def test_alpha_outside_the_open_unit_interval_is_refused(alpha):
    with pytest.raises(ValueError, match="ema_alpha"):
        ema_advantages(torch.tensor([[1.0, 0.0]]), [group_key(0, "a")], EmaBaselines(), alpha)


def test_group_std_scaling_and_wrong_key_counts_are_refused():
    with pytest.raises(ValueError, match="'batch' or 'none'"):
        ema_advantages(
            torch.tensor([[1.0, 0.0]]), [group_key(0, "a")], EmaBaselines(), 0.9, "group"
        )
    with pytest.raises(ValueError, match="0 group keys for 1 groups; give one each"):
        ema_advantages(torch.tensor([[1.0, 0.0]]), [], EmaBaselines())
    with pytest.raises(ValueError, match="ema_advantages"):
        compute_advantages(torch.tensor([[1.0, 0.0]]), "ema")


@pytest.mark.parametrize("bad", [torch.tensor([1.0, 0.0]), torch.tensor([[1.0], [0.0]])])
def test_rewards_that_are_not_groups_of_two_or_more_are_refused(bad):
    # A 1-D tensor has no groups; a (2, 1) tensor has groups of one, which nothing compares with.
    keys = [group_key(0, "a"), group_key(0, "b")]
    with pytest.raises(ValueError, match="group >= 2"):
        ema_advantages(bad, keys, EmaBaselines(), scale_rewards="none")
