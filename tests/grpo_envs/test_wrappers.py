"""The wrappers make() adds: the one guard (ScoreGuard / guarded_scores) and TimeLimit."""

from __future__ import annotations

import math

import pytest

import grpo_envs
from grpo_envs.base import Environment
from grpo_envs.types import Outcome, Sample, Score
from grpo_envs.wrappers import ScoreGuard, TimeLimit, guarded_score, guarded_scores

ROW = Sample("0", (), "1")


class Misbehaving(Environment):
    """Returns whatever ``completion`` names; its batch form can raise or drop items."""

    splits = ("train",)

    def __init__(self, batch: str = "ok") -> None:
        self.batch = batch

    def dataset(self, split="train"):
        raise NotImplementedError

    def score(self, completion, sample):
        return {
            "nan": Score(math.nan, Outcome.CORRECT),
            "inf": Score(math.inf, Outcome.CORRECT),
            "none": None,
            "float": 1.0,
            "bool": Score(True, Outcome.CORRECT),  # type: ignore[arg-type]
            "good": Score(1.0, Outcome.CORRECT),
        }.get(completion) or (_ for _ in ()).throw(RuntimeError("scorer bug"))

    def score_batch(self, completions, samples, **kwargs):
        if self.batch == "raise":
            raise RuntimeError("batch bug")
        if self.batch == "short":
            return [self.score(c, s) for c, s in zip(completions, samples)][:-1]
        return super().score_batch(completions, samples)


@pytest.mark.parametrize("batch", ["ok", "raise", "short"])
def test_guard_gives_one_finite_typed_score_per_completion(batch):
    env = Misbehaving(batch)
    texts = ["good", "nan", "inf", "none", "float", "bool", "raise"]
    scores = guarded_scores(env, texts, [ROW] * len(texts))
    assert [s.outcome for s in scores] == [Outcome.CORRECT] + [Outcome.ERROR] * 6
    assert all(isinstance(s, Score) and math.isfinite(s.reward) for s in scores)
    assert "scorer bug" in scores[-1].details["reason"]
    assert "malformed score" in scores[1].details["reason"]
    assert guarded_score(env, "raise", ROW).outcome is Outcome.ERROR


def test_guard_keeps_the_caller_bug_of_misaligned_lists():
    with pytest.raises(ValueError, match="2 completions for 1 samples"):
        guarded_scores(Misbehaving(), ["a", "b"], [ROW])


def test_wrappers_forward_attributes_both_ways():
    env = grpo_envs.make("rg/leg_counting-v0", train_size=4, test_size=2)
    assert isinstance(env, ScoreGuard) and isinstance(env.env, TimeLimit)  # rg judges: unbounded
    assert env.env_id == "rg/leg_counting-v0" and env.spec is env.unwrapped.spec
    env.score_timeout_s = 3.0  # reaches the environment the wrapper reads it from
    assert env.unwrapped.score_timeout_s == 3.0
    bounded = grpo_envs.make("math/add2-v0", train_size=4, test_size=2)
    assert not isinstance(bounded.env, TimeLimit)  # regex judges: scored in-process
    assert bounded.rubric is bounded.unwrapped.rubric


def test_time_limit_scores_family_envs_in_workers_like_in_process():
    env = grpo_envs.make("rg/leg_counting-v0", train_size=4, test_size=2)
    rows = list(env.dataset("train"))
    completions = [f"<answer>{r['answer']}</answer>" for r in rows] + ["<answer>-1</answer>"]
    samples = [*rows, rows[0]]
    in_workers = env.score_batch(completions, samples)
    in_process = env.score_batch(completions, samples, workers=0)
    assert [s.reward for s in in_workers] == [s.reward for s in in_process] == [1.0] * 4 + [0.0]


def test_an_environment_make_built_is_guarded_once(monkeypatch):
    import grpo_envs.wrappers as wrappers

    checked = []
    real = wrappers._valid
    monkeypatch.setattr(wrappers, "_valid", lambda score: checked.append(score) or real(score))
    guarded = ScoreGuard(Misbehaving())
    scores = guarded_scores(guarded, ["good", "nan", "float"], [ROW] * 3)
    assert [s.outcome for s in scores] == [Outcome.CORRECT, Outcome.ERROR, Outcome.ERROR]
    assert len(checked) == 3  # one check per completion, not one per guard layer
    checked.clear()
    assert guarded_score(guarded, "inf", ROW).outcome is Outcome.ERROR and len(checked) == 1
