r"""``math/countdown-v0``: reach a target with given numbers (the TinyZero / "aha moment" task).

The model writes an expression; it is parsed with ``ast`` and evaluated exactly (see ``_expr``):
only ``+ - * /`` and parentheses, each given number used at most once, and the value must equal the
target. Many expressions are right, so there is no string match against a reference.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from fractions import Fraction

from grpo_envs.base import SingleTurnEnv
from grpo_envs.envs._common import (
    Problem,
    extra_components,
    final_answer,
    instruction,
    problem_sample,
    procedural_split,
    reference_answer,
)
from grpo_envs.envs._expr import ExpressionError, safe_eval
from grpo_envs.rubric import Judgement, RewardComponent, Rubric, ScoringContext
from grpo_envs.types import JSONValue, Outcome, Sample

#: difficulty -> (how many numbers are given, largest number)
LEVELS: dict[int, tuple[int, int]] = {1: (3, 10), 2: (4, 25), 3: (4, 100), 4: (5, 100), 5: (6, 100)}
MAX_TARGET = 1000
BOXED_EXPRESSION = "Give the expression as \\boxed{EXPRESSION}, e.g. \\boxed{(3 + 5) * 2}."


def countdown_problem(rng: random.Random, difficulty: int) -> Problem:
    """Numbers and a target reachable by a random expression over some of them."""
    count, largest = LEVELS[difficulty]
    while True:
        numbers = [rng.randint(1, largest) for _ in range(count)]
        used = rng.sample(numbers, rng.randint(2, count))
        expr = str(used[0])
        for n in used[1:]:
            op = rng.choice("+-*/")
            expr = f"({expr} {op} {n})" if rng.random() < 0.5 else f"({n} {op} {expr})"
        try:
            value = safe_eval(expr).value
        except ExpressionError:  # division by zero
            continue
        if value.denominator == 1 and 0 < value <= MAX_TARGET and int(value) not in numbers:
            break
    target = int(value)
    witness = expr[1:-1] if expr.startswith("(") else expr
    question = (
        f"Using the numbers {numbers}, write an arithmetic expression that equals {target}. "
        "You may use + - * / and parentheses, and each number at most once."
    )
    meta: dict[str, JSONValue] = {
        "numbers": list[JSONValue](numbers),
        "target": target,
        "solution": witness,
        "difficulty": difficulty,
    }
    return Problem(question, str(target), meta)


def check_expression(text: str, numbers: list[int], target: int) -> Judgement:
    """Judge ``text`` as a Countdown answer for ``numbers`` and ``target``."""
    try:
        evaluated = safe_eval(text)
    except ExpressionError as exc:
        return Judgement(0.0, Outcome.WRONG, {"reason": str(exc)})
    details = {"value": str(evaluated.value)}
    extra = Counter(evaluated.numbers) - Counter(numbers)
    if extra:
        return Judgement(
            0.0,
            Outcome.WRONG,
            {**details, "reason": f"uses numbers not given (or twice): {sorted(extra.elements())}"},
        )
    if evaluated.value != Fraction(target):
        return Judgement(0.0, Outcome.WRONG, {**details, "reason": "value differs from target"})
    return Judgement(1.0, Outcome.CORRECT, details)


def countdown_correctness(ctx: ScoringContext) -> Judgement:
    """Return the ``correct`` component: the final answer checked by ``check_expression``."""
    extracted = final_answer(ctx.completion)
    if extracted is None:
        return Judgement(0.0, Outcome.UNPARSABLE, {"reason": "no \\boxed{} or <answer> found"})
    meta = ctx.sample.metadata
    numbers, target = meta.get("numbers"), meta.get("target")
    if not isinstance(numbers, list) or not isinstance(target, int):
        raise ValueError("countdown sample metadata lacks 'numbers' and 'target'")
    judged = check_expression(extracted, [int(n) for n in numbers], target)  # type: ignore[arg-type]
    return Judgement(judged.value, judged.outcome, {"extracted": extracted[:200], **judged.details})


class CountdownEnv(SingleTurnEnv):
    """Procedural Countdown; train and test questions are disjoint (see ``is_held_out``)."""

    def __init__(
        self,
        difficulty: int = 2,
        seed: int = 0,
        train_size: int = 5000,
        test_size: int = 500,
        format: str = "none",
        format_weight: float = 0.0,
    ) -> None:
        """Configure the generator (arguments as for ``ArithmeticEnv``; difficulty 1-5)."""
        super().__init__()
        if difficulty not in LEVELS:
            raise ValueError(f"difficulty must be one of {sorted(LEVELS)}, got {difficulty}")
        self.difficulty, self.seed, self.format = difficulty, seed, format
        self.sizes = {"train": train_size, "test": test_size}
        self.rubric = Rubric(
            [
                RewardComponent("correct", 1.0, countdown_correctness, bounded=True),
                *extra_components(format, format_weight),
            ]
        )

    def load_split(self, split: str) -> Iterator[Sample]:
        """Return generated problems for ``split``."""
        suffix = instruction(self.format, BOXED_EXPRESSION)
        for index, problem in procedural_split(
            lambda rng: countdown_problem(rng, self.difficulty),
            seed=self.seed,
            split=split,
            size=self.sizes[split],
        ):
            yield problem_sample(split, index, problem, suffix)

    def reference_completion(self, sample: Sample) -> str:
        """Return the witness expression in the requested format."""
        return reference_answer(self.format, str(sample.metadata["solution"]))
