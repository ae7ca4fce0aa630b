import pytest

import grpo_envs
from grpo_envs.mixture import MixtureEnv, per_env_metrics
from grpo_envs.types import Outcome

KW = {"train_size": 30, "test_size": 5}


def _mix(seed=0, size=200):
    return MixtureEnv.from_ids(
        {"math/add2-v0": 3.0, "math/countdown-v0": 1.0}, size=size, seed=seed, env_kwargs=KW
    )


def test_weighted_stream_remembers_env_and_is_deterministic():
    mix = _mix()
    train = mix.dataset("train")
    env_ids = train["env_id"]
    share = env_ids.count("math/add2-v0") / len(env_ids)
    assert 0.65 < share < 0.85  # weight 3:1
    assert len(set(train["id"])) == len(train)  # unique even when members cycle
    assert train["id"][0].split(":", 1)[0] == env_ids[0]
    assert _mix().dataset("train")["id"] == train["id"]
    assert _mix(seed=1).dataset("train")["id"] != train["id"]
    assert len(mix.dataset("test")) == 10  # evaluation: every member row once


def test_score_dispatches_to_member_and_per_env_metrics():
    mix = _mix(size=20)
    rows = list(mix.dataset("train"))
    completions = [mix.reference_completion(grpo_envs.Sample.from_row(r)) for r in rows]
    completions[0] = "\\boxed{nonsense}"
    scores = mix.score_batch(completions, rows)
    assert scores[0].outcome is Outcome.WRONG
    assert all(s.correct for s in scores[1:])
    assert [mix.score(c, r) for c, r in zip(completions, rows)] == scores
    metrics = per_env_metrics([r["env_id"] for r in rows], scores)
    assert sum(m.count for m in metrics.values()) == 20
    wrong_env = rows[0]["env_id"]
    assert metrics[wrong_env].accuracy == pytest.approx(1 - 1 / metrics[wrong_env].count)
    assert metrics[wrong_env].outcomes["wrong"] == 1


def test_unknown_env_in_sample_is_a_typed_failure():
    mix = _mix(size=4)
    row = dict(mix.dataset("train")[0], env_id="math/gsm8k-v0")
    assert mix.score("x", row).outcome is Outcome.ERROR


def test_bad_weights():
    envs = {"math/add2-v0": grpo_envs.make("math/add2-v0", **KW)}
    with pytest.raises(ValueError):
        MixtureEnv(envs, {"math/add2-v0": -1.0})
    with pytest.raises(ValueError):
        MixtureEnv(envs, {"other/x-v0": 1.0})


def test_mixture_passes_check_env():
    grpo_envs.check_env(_mix(size=20), n_samples=2)
