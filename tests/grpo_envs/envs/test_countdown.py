from fractions import Fraction

import pytest

import grpo_envs
from grpo_envs.envs._expr import ExpressionError, safe_eval
from grpo_envs.envs.countdown import check_expression
from grpo_envs.types import Outcome, Sample


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("(3 + 5) * 2", 16),
        ("7 / 2", Fraction(7, 2)),
        ("3 \\times 4 = 12", 12),
        ("6 ÷ 4 × 2", 3),
        ("{(1+2)}*3", 9),
    ],
)
def test_safe_eval(text, value):
    assert safe_eval(text).value == value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "2 ** 100",
        "1.5 + 1",
        "-3 + 5",
        "abs(3)",
        "1 / 0",
        "3 +",
        "",
        "(" * 500,
        "x + 1",
        "[1, 2]",
    ],
)
def test_safe_eval_refuses(text):
    with pytest.raises(ExpressionError):
        safe_eval(text)


def test_check_expression_rules():
    numbers, target = [3, 5, 2, 7], 16
    assert check_expression("(3 + 5) * 2", numbers, target).outcome is Outcome.CORRECT
    assert (
        check_expression("2 * (5 + 3)", numbers, target).value == 1.0
    )  # any order, not a string match
    assert check_expression("(3 + 5) * 2 = 16", numbers, target).outcome is Outcome.CORRECT
    wrong = check_expression("3 + 5 + 2", numbers, target)
    assert wrong.outcome is Outcome.WRONG and "differs" in wrong.details["reason"]
    reuse = check_expression("(5 + 3) * 2 + 3 - 3", numbers, target)
    assert reuse.outcome is Outcome.WRONG and "twice" in reuse.details["reason"]
    assert check_expression("16", numbers, target).outcome is Outcome.WRONG  # 16 is not given
    assert check_expression("2 ** 4", numbers, target).outcome is Outcome.WRONG


def test_env_problems_are_solvable_and_scored_by_evaluation():
    env = grpo_envs.make("math/countdown-v0", difficulty=3, train_size=50, test_size=20)
    for row in env.dataset("train"):
        sample = Sample.from_row(row)
        numbers, target = sample.metadata["numbers"], sample.metadata["target"]
        assert len(numbers) == 4 and 0 < target <= 1000 and target not in numbers
        assert str(target) in row["prompt"][0]["content"]
        assert env.score(env.reference_completion(sample), row).correct
    row = env.dataset("test")[0]
    assert env.score("no idea", row).outcome is Outcome.UNPARSABLE
    assert env.score("\\boxed{1 + 1}", row).outcome is Outcome.WRONG
    train = set(map(str, env.dataset("train")["prompt"]))
    assert not train & set(map(str, env.dataset("test")["prompt"]))
