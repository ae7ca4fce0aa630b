import json
import re

import pytest

import grpo_envs
from grpo_envs import check_env
from grpo_envs.base import SingleTurnEnv
from grpo_envs.envs._common import integer_correctness, is_held_out, parse_integer
from grpo_envs.envs.arithmetic import LEVELS, Step, expression_steps, step_pattern
from grpo_envs.rubric import RewardComponent, Rubric
from grpo_envs.types import Outcome, Sample


def test_add2_prompt_answer_and_scoring():
    env = grpo_envs.make("math/add2-v0", train_size=20, test_size=10)
    row = env.dataset("train")[0]
    text = row["prompt"][0]["content"]
    match = re.fullmatch(
        r"What is (\d\d) \+ (\d\d)\? Give the final answer as \\boxed\{N\}\.", text
    )
    assert match, text
    a, b = int(match[1]), int(match[2])
    assert row["answer"] == str(a + b)  # hand-checkable: the gold is the sum
    assert env.score(f"{a} + {b} = \\boxed{{{a + b}}}", row).outcome is Outcome.CORRECT
    assert env.score(f"\\boxed{{{a + b + 1}}}", row).outcome is Outcome.WRONG
    assert env.score(f"<answer>{a + b}</answer>", row).correct
    assert env.score(f"The answer is {a + b}", row).outcome is Outcome.UNPARSABLE  # no box, no tag
    assert env.score("\\boxed{ninety}", row).outcome is Outcome.WRONG


def test_same_seed_same_data_other_seed_other_data():
    a = grpo_envs.make("math/arithmetic-v0", seed=1, train_size=30, test_size=5)
    b = grpo_envs.make("math/arithmetic-v0", seed=1, train_size=30, test_size=5)
    c = grpo_envs.make("math/arithmetic-v0", seed=2, train_size=30, test_size=5)
    assert a.dataset("train")["prompt"] == b.dataset("train")["prompt"]
    assert a.dataset("train")["prompt"] != c.dataset("train")["prompt"]
    # per (seed, index): a bigger split starts with the same problems
    d = grpo_envs.make("math/arithmetic-v0", seed=1, train_size=40, test_size=5)
    assert d.dataset("train")["prompt"][:30] == a.dataset("train")["prompt"]


@pytest.mark.parametrize("task", ["add2", "chain"])
def test_train_and_test_questions_are_disjoint(task):
    env = grpo_envs.make("math/arithmetic-v0", task=task, train_size=3000, test_size=300)
    train = {r[0]["content"] for r in env.dataset("train")["prompt"]}
    test = {r[0]["content"] for r in env.dataset("test")["prompt"]}
    assert not train & test
    assert all(is_held_out(q.split("?")[0] + "?") for q in list(test)[:50])


@pytest.mark.parametrize("difficulty", sorted(LEVELS))
def test_difficulty_sets_operand_count_and_answers_are_right(difficulty):
    env = grpo_envs.make("math/arithmetic-v0", difficulty=difficulty, train_size=20, test_size=2)
    operands, digits = LEVELS[difficulty]
    for row in env.dataset("train"):
        expr = row["prompt"][0]["content"].removeprefix("What is ").split("?")[0]
        numbers = re.findall(r"\d+", expr)
        assert len(numbers) == operands
        assert max(len(n) for n in numbers) <= digits
        assert int(row["answer"]) == eval(expr)  # our own generated text: trusted here


def test_parse_integer():
    assert parse_integer(" 1,234 ") == 1234
    assert parse_integer("$-5") == -5
    assert parse_integer("12.0") == 12
    assert parse_integer("12.5") is None
    assert parse_integer("1e3") is None
    assert parse_integer("9" * 200) is None


def test_bad_options():
    with pytest.raises(ValueError, match="difficulty"):
        grpo_envs.make("math/arithmetic-v0", difficulty=9)
    with pytest.raises(ValueError, match="task"):
        grpo_envs.make("math/arithmetic-v0", task="mul")


def test_think_answer_format_env_rewards_format_and_answer():
    env = grpo_envs.make("format/think-answer-v0", train_size=5, test_size=2)
    row = env.dataset("train")[0]
    assert "<think>" in row["prompt"][0]["content"]
    gold = row["answer"]
    full = env.score(f"<think>adding</think>\n<answer>{gold}</answer>", row)
    assert full.reward == 2.0 and full.correct
    assert full.component("format_soft").weight == 0.0  # logged metric
    sloppy = env.score(f"ok <think>a</think><answer>{gold}</answer>", row)
    assert sloppy.reward == 1.0 and sloppy.component("format_soft").value == 1.0
    wrong = env.score("<think>a</think><answer>-1</answer>", row)
    assert wrong.reward == 1.0 and wrong.outcome is Outcome.WRONG


def test_loose_answers_count_the_last_integer_stated_in_prose():
    env = grpo_envs.make("math/add2-v0", train_size=5, test_size=5, answer="loose")
    row = env.dataset("test")[0]
    gold = int(row["answer"])

    def outcome(text: str) -> Outcome:
        return env.score(text, row).outcome

    assert outcome(f"So the sum is {gold}.") is Outcome.CORRECT
    assert outcome(f"{gold - 10} + 10 = {gold:,}") is Outcome.CORRECT  # thousands commas allowed
    assert outcome(f"\\boxed{{{gold}}}. It is {gold}.") is Outcome.CORRECT  # a box commits
    # ... unless a hedge or a correction follows it
    assert outcome(f"\\boxed{{{gold}}} or maybe {gold + 1}") is Outcome.UNPARSABLE
    assert outcome(f"\\boxed{{{gold}}}. Oops, I made an error: {gold + 1}.") is Outcome.WRONG
    assert outcome(f"{gold} ... no wait, {gold + 1}") is Outcome.WRONG  # only the last one counts
    assert outcome(f"{gold}7") is Outcome.WRONG  # no partial digit match
    assert outcome("I don't know") is Outcome.UNPARSABLE
    # The tail bound keeps extraction linear on junk; the answer must be near the end anyway.
    assert outcome(f"{gold} " + "x" * 1_000_000) is Outcome.UNPARSABLE
    with pytest.raises(ValueError, match="answer"):
        grpo_envs.make("math/add2-v0", answer="fuzzy")


def test_operands_digits_and_operators_override_the_level():
    env = grpo_envs.make(
        "math/arithmetic-v0", operands=4, digits=1, operators="+-", train_size=40, test_size=2
    )
    seen_ops: set[str] = set()
    for row in env.dataset("train"):
        expr = row["prompt"][0]["content"].removeprefix("What is ").split("?")[0]
        tokens = expr.split()
        numbers, ops = tokens[0::2], tokens[1::2]
        assert len(numbers) == 4 and all(len(n) == 1 for n in numbers)
        seen_ops |= set(ops)
        assert int(row["answer"]) == eval(expr)  # our own generated text: trusted here
    assert seen_ops == {"+", "-"}  # never "*" when not asked for; both drawn over 40 rows


def test_default_operators_keep_the_level_problems_unchanged():
    # Explicit level values give exactly the problems of the level (same rng draws).
    level = grpo_envs.make("math/arithmetic-v0", difficulty=3, train_size=20, test_size=2)
    operands, digits = LEVELS[3]
    explicit = grpo_envs.make(
        "math/arithmetic-v0", operands=operands, digits=digits, train_size=20, test_size=2
    )
    assert level.dataset("train")["prompt"] == explicit.dataset("train")["prompt"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"operands": 1}, "operands"), ({"digits": 7}, "digits"), ({"operators": "/"}, "operators")],
)
def test_bad_chain_options_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        grpo_envs.make("math/arithmetic-v0", **kwargs)


def test_expression_steps_follow_precedence_then_left_to_right():
    assert expression_steps("8 - 2 * 3") == (Step(2, "*", 3, 6), Step(8, "-", 6, 2))
    assert expression_steps("7 - 7 - 1") == (Step(7, "-", 7, 0), Step(0, "-", 1, -1))
    assert expression_steps("4 + 5") == (Step(4, "+", 5, 9),)
    with pytest.raises(ValueError, match="not allowed"):
        expression_steps("2 ** 3")
    with pytest.raises(ValueError, match="expression"):
        expression_steps("8 / 2 + 1")


def test_step_credit_rewards_each_operation_written_out_correctly():
    env = grpo_envs.make(
        "math/arithmetic-v0",
        operands=3,
        digits=1,
        operators="+-",
        answer="loose",
        step_credit=0.5,
        train_size=30,
        test_size=5,
    )
    for row in env.dataset("train"):
        first, second = expression_steps(json.loads(row["metadata"])["expression"])
        gold = int(row["answer"])
        both = f"{first.left} {first.op} {first.right} = {first.result}\n"
        both += f"{second.left} {second.op} {second.right} = {second.result}"
        full = env.score(both, row)
        assert full.outcome is Outcome.CORRECT
        assert full.component("steps").value == 1.0 and full.reward == 1.5
        # Only the first step right: half the credit, and the final answer decides correctness.
        half = env.score(f"{first.left} {first.op} {first.right} = {first.result}. So 99.", row)
        assert half.component("steps").value == 0.5 and half.outcome is Outcome.WRONG
        assert half.reward == 0.25
        # A wrong intermediate result earns nothing for that step.
        wrong = f"{first.left} {first.op} {first.right} = {first.result + 1}"
        assert env.score(wrong, row).component("steps").value == 0.0
        # The right answer in one line still counts as correct, without step credit.
        one_line = env.score(f"The answer is {gold}", row)
        assert one_line.outcome is Outcome.CORRECT and one_line.reward == 1.0


def test_step_credit_env_passes_the_contract_and_its_reference_earns_full_reward():
    env = grpo_envs.make(
        "math/arithmetic-v0", operands=4, digits=2, step_credit=0.5, train_size=20, test_size=5
    )
    check_env(env)
    for row in env.dataset("test"):
        score = env.score(env.reference_completion(Sample.from_row(row)), row)
        assert score.outcome is Outcome.CORRECT and score.reward == 1.5


def test_step_pattern_does_not_match_inside_longer_numbers_and_accepts_spellings():
    minus, plus, times = Step(7, "-", 7, 0), Step(3, "+", 9, 12), Step(2, "*", 3, 6)
    assert step_pattern(minus).search("7-7=0")
    assert not step_pattern(minus).search("17 - 7 = 0") and not step_pattern(minus).search(
        "7 - 7 = 01"
    )
    assert step_pattern(Step(0, "-", 1, -1)).search("0 − 1 = −1")  # unicode minus
    assert step_pattern(plus).search("9 + 3 = 12")  # commutative: either order
    assert not step_pattern(minus).search("7 + 7 = 0")
    assert step_pattern(times).search("3 × 2 = 6") and step_pattern(times).search("2 \\times 3 = 6")
    assert step_pattern(minus).search("so 7 - 7 = 0.")  # a full stop may follow
    assert not step_pattern(minus).search("7 - 7 = 0.5")


def test_step_credit_is_validated():
    with pytest.raises(ValueError, match="step_credit"):
        grpo_envs.make("math/arithmetic-v0", step_credit=2.0)
    with pytest.raises(ValueError, match="step_credit"):
        grpo_envs.make("math/arithmetic-v0", task="add2", step_credit=0.5)


def test_easier_versions_climb_digits_then_operands_and_keep_the_rest():
    env = grpo_envs.make(
        "math/arithmetic-v0", task="chain", operands=4, digits=3, operators="-",
        answer="loose", step_credit=0.5, seed=7,
    )  # fmt: skip
    versions = grpo_envs.easier_versions(env)
    shapes = [(v.operands, v.first_digits or v.digits, v.digits) for v in versions]
    # The first operand widens a stage before the others: "47 - 8" between "4 - 8" and "47 - 38".
    assert shapes == [(2, 1, 1), (2, 2, 1), (2, 2, 2), (2, 3, 2), (2, 3, 3), (3, 3, 3)]
    for version, (_, first_digits, digits) in zip(versions, shapes):
        numbers = [
            [int(x) for x in re.findall(r"\d+", r["prompt"][-1]["content"].split(" Give")[0])]
            for r in version.dataset("train")
        ]
        assert max(n[0] for n in numbers) >= 10 ** (first_digits - 1)
        assert max(n[0] for n in numbers) < 10**first_digits
        assert max(x for n in numbers for x in n[1:]) < 10**digits
    for version in versions:
        assert version.operators == "-" and version.step_credit == 0.5 and version.seed == 7
        assert version.env_id == "math/arithmetic-v0"
        row = version.dataset("train")[0]
        assert row["prompt"][-1]["content"].count("-") == version.operands - 1
        # The held-out side of the question space is the configured env's: never trained on.
        questions = [r["prompt"][-1]["content"].split(" Give")[0] for r in version.dataset("train")]
        assert questions[0].startswith("What is ") and not any(map(is_held_out, questions))


def test_easiest_and_add2_tasks_have_no_easier_versions():
    assert grpo_envs.easier_versions(grpo_envs.make("math/arithmetic-v0", difficulty=1)) == []
    assert grpo_envs.easier_versions(grpo_envs.make("math/arithmetic-v0", task="add2")) == []
    correct = RewardComponent("correct", 1.0, integer_correctness)
    plain = SingleTurnEnv({"train": [{"question": "1+1?", "answer": "2"}]}, Rubric([correct]))
    assert grpo_envs.easier_versions(plain) == []


def test_first_digits_widens_the_first_operand_only_and_is_checked():
    env = grpo_envs.make("math/arithmetic-v0", operands=2, digits=1, first_digits=2, operators="-")
    firsts = [int(r["prompt"][-1]["content"].split()[2]) for r in env.dataset("train")]
    assert max(firsts) >= 10
    # Without first_digits the task draws the same problems as before it existed.
    plain = grpo_envs.make("math/arithmetic-v0", operands=2, digits=2, operators="-")
    same = grpo_envs.make("math/arithmetic-v0", operands=2, digits=2, operators="-", first_digits=2)
    assert plain.dataset("test")[:20] == same.dataset("test")[:20]
    with pytest.raises(ValueError, match="first_digits"):
        grpo_envs.make("math/arithmetic-v0", digits=2, first_digits=1)
