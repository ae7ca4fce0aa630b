import math

import pytest

from grpo_envs.rubric import Judgement, RewardComponent, Rubric, StripParser
from grpo_envs.types import Outcome, Sample

SAMPLE = Sample("s0", (), "42")


def exact(ctx):
    return Judgement(
        float(ctx.parsed == ctx.sample.answer),
        Outcome.CORRECT if ctx.parsed == ctx.sample.answer else Outcome.WRONG,
        {"extracted": ctx.parsed},
    )


def test_weighted_sum_and_zero_weight_metric():
    rubric = Rubric(
        [
            RewardComponent("correct", 1.0, exact),
            RewardComponent("short", 0.5, lambda ctx: float(len(ctx.completion) < 5)),
            RewardComponent("length", 0.0, lambda ctx: float(len(ctx.completion))),
        ],
        parser=StripParser(),
    )
    score = rubric.score(" 42 ", SAMPLE)
    assert score.reward == pytest.approx(1.0 + 0.5)  # the zero-weight metric adds nothing
    assert score.component("length").value == 4.0
    assert score.outcome is Outcome.CORRECT
    assert score.details["extracted"] == "42"
    assert rubric.weights == {"correct": 1.0, "short": 0.5, "length": 0.0}


def test_outcome_defaults_when_no_component_decides():
    rubric = Rubric(
        [RewardComponent("c", 1.0, lambda ctx: float(ctx.parsed == "42"))], parser=StripParser()
    )
    assert rubric.score("42", SAMPLE).outcome is Outcome.CORRECT
    assert rubric.score("41", SAMPLE).outcome is Outcome.WRONG
    # Parser found nothing: UNPARSABLE, not a silent WRONG / 0.0.
    assert rubric.score("   ", SAMPLE).outcome is Outcome.UNPARSABLE


def test_component_exception_becomes_error_with_reason():
    def boom(ctx):
        raise ZeroDivisionError("bad")

    rubric = Rubric([RewardComponent("c", 1.0, exact), RewardComponent("boom", 1.0, boom)])
    score = rubric.score("42", SAMPLE)
    assert score.outcome is Outcome.ERROR and score.reward == 0.0
    assert "boom" in score.details["reason"] and "ZeroDivisionError" in score.details["reason"]


def test_non_finite_value_refused():
    rubric = Rubric([RewardComponent("nan", 1.0, lambda ctx: math.nan)])
    assert rubric.score("x", SAMPLE).outcome is Outcome.ERROR


def test_score_many_uses_batch_fn_and_matches_score():
    calls = []

    def batch(ctxs):
        calls.append(len(ctxs))
        return [exact(c) for c in ctxs]

    rubric = Rubric(
        [
            RewardComponent("correct", 1.0, exact, batch),
            RewardComponent("f", 0.25, lambda ctx: 1.0),
        ],
        parser=StripParser(),
    )
    completions = ["42", "7", " 42"]
    many = rubric.score_many(completions, [SAMPLE] * 3)
    assert calls == [3]
    assert [s.reward for s in many] == [1.25, 0.25, 1.25]
    assert many == [rubric.score(c, SAMPLE) for c in completions]


def test_batch_fn_failure_marks_each_item_error():
    def bad_batch(ctxs):
        return [1.0]  # wrong length

    rubric = Rubric([RewardComponent("c", 1.0, exact, bad_batch)])
    assert [s.outcome for s in rubric.score_many(["a", "b"], [SAMPLE] * 2)] == [Outcome.ERROR] * 2


def test_rubric_validation():
    with pytest.raises(ValueError, match="duplicate"):
        Rubric([RewardComponent("a", 1, exact), RewardComponent("a", 1, exact)])
    with pytest.raises(ValueError):
        Rubric([])
    with pytest.raises(ValueError):
        RewardComponent("x", math.inf, exact)
