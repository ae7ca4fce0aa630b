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
    paid = grpo_envs.make(
        "rg/reasoning-gym-v0", task="leg_counting", train_size=5, test_size=5, partial_credit=True
    )
    row = env.dataset("test")[0]
    # The gold answer inside a longer one: reasoning-gym's substring match gives a fraction.
    padded = f"<answer>{row['answer']} legs</answer>"
    default, partial = env.score(padded, row), paid.score(padded, row)
    raw = default.details["rg_score"]
    assert isinstance(raw, float) and 0.0 < raw < 1.0
    assert default.reward == 0.0 and default.outcome is Outcome.WRONG  # no credit by default
    assert partial.reward == pytest.approx(raw) and partial.outcome is Outcome.WRONG
    # A full score is 1 either way.
    gold = f"<answer>{row['answer']}</answer>"
    assert env.score(gold, row).reward == paid.score(gold, row).reward == 1.0
    with pytest.raises(ValueError, match="close matches"):
        grpo_envs.make("rg/reasoning-gym-v0", task="leg_countin")


@pytest.mark.parametrize("task", ["gcd", "letter_counting", "basic_arithmetic"])
def test_loose_answers_read_the_final_stated_answer_as_the_math_envs_do(task):
    from grpo_envs.envs._common import loose_final_answer

    loose = grpo_envs.make(f"rg/{task}-v0", train_size=5, test_size=5, answer="loose")
    strict = grpo_envs.make(f"rg/{task}-v0", train_size=5, test_size=5)
    sample = Sample.from_row(loose.dataset("test")[0])
    gold = sample.answer
    prose = f"Let me work it out step by step. The answer to this question is {gold}."
    assert strict.score(prose, sample).outcome is Outcome.UNPARSABLE
    score = loose.score(prose, sample)
    assert score.outcome is Outcome.CORRECT and score.details["extracted"] == gold
    assert loose_final_answer(prose) == gold  # the same one rule
    wrong = f"The answer is {gold}1."
    assert loose.score(wrong, sample).outcome is Outcome.WRONG
    # what the loose rule refuses: a hedge, a text cut off mid-sentence, no number at all
    for refused in (f"It could be {gold} or 7.", "So the result is equal to", "I do not know."):
        assert loose.score(refused, sample).outcome is Outcome.UNPARSABLE, refused
    # a committed answer still wins over prose
    tagged = f"<answer>{gold}</answer> Though some would say 3."
    assert loose.score(tagged, sample).outcome is Outcome.CORRECT


def test_gcd_prose_of_the_default_model_is_read():
    env = grpo_envs.make("rg/gcd-v0", train_size=5, test_size=5, answer="loose")
    sample = Sample(id="x", prompt="Find the GCD of 435 and 335.", answer="5")
    text = "The Greatest Common Divisor (GCD) of 435 and 335 is 5."
    assert env.score(text, sample).outcome is Outcome.CORRECT
    with pytest.raises(ValueError, match="answer must be one of"):
        grpo_envs.make("rg/gcd-v0", answer="prose")
