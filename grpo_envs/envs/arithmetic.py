r"""``math/arithmetic-v0``: procedural multi-step integer arithmetic, offline and deterministic.

Tasks:
- ``chain`` (default): ``difficulty`` 1-5 sets the number of operands and their digits (see
  ``LEVELS``); operators ``+ - *`` with the usual precedence. ``operands``, ``digits`` and
  ``operators`` override the level for a custom curriculum (e.g. ``operands=3, digits=2,
  operators="+-"``: "What is 45 + 23 - 17?").
- ``add2``: two two-digit numbers, "What is 37 + 58? Give the final answer as \boxed{N}."
  (also registered as ``math/add2-v0``).

Scored by exact integer comparison of the final ``\boxed{}`` / ``<answer>`` content.
``step_credit`` > 0 adds a ``steps`` component for ``chain``: the share of the expression's
operations that the completion writes out as correct equations ("7 - 2 = 5"), a verifiable
process reward for models that cannot yet do a whole chain in one line.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from grpo_envs.base import SingleTurnEnv
from grpo_envs.envs._common import (
    Problem,
    extra_components,
    instruction,
    integer_correctness,
    loose_integer_correctness,
    problem_sample,
    procedural_split,
    reference_answer,
)
from grpo_envs.envs._expr import ExpressionError, safe_eval
from grpo_envs.rubric import Judgement, RewardComponent, Rubric, ScoringContext
from grpo_envs.types import Sample, Scalar

#: difficulty -> (number of operands, max digits per operand)
LEVELS: dict[int, tuple[int, int]] = {1: (2, 1), 2: (3, 2), 3: (4, 2), 4: (5, 3), 5: (6, 3)}
TASKS = ("chain", "add2")
ANSWER_MODES = ("strict", "loose")


def add2_problem(rng: random.Random) -> Problem:
    """Two two-digit numbers to add."""
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return Problem(f"What is {a} + {b}?", str(a + b), {"task": "add2", "operands": [a, b]})


#: the default operator mix: addition twice as likely as ``-`` or ``*``
DEFAULT_OPERATORS = "++-*"


def chain_problem(
    rng: random.Random,
    operands: int,
    digits: int,
    operators: str = DEFAULT_OPERATORS,
    first_digits: int | None = None,
) -> Problem:
    """Return a chain of ``operands`` numbers of up to ``digits`` digits joined by ``operators``.

    ``first_digits`` (default ``digits``) is the first operand's max digits: "47 - 8" is the
    step between "4 - 8" and "47 - 38" in a curriculum.
    """
    parts = [str(rng.randint(1, 10 ** (first_digits or digits) - 1))]
    for _ in range(operands - 1):
        op = rng.choice(operators)
        # A single-digit multiplier keeps products in a range a small model can check by hand.
        operand = rng.randint(2, 9) if op == "*" else rng.randint(1, 10**digits - 1)
        parts += [op, str(operand)]
    expr = " ".join(parts)
    value = safe_eval(expr).value
    return Problem(
        f"What is {expr}?",
        str(int(value)),
        {"task": "chain", "operands": operands, "digits": digits, "expression": expr},
    )


@dataclass(frozen=True)
class Step:
    """One binary operation of an expression: ``left op right = result``."""

    left: int
    op: str
    right: int
    result: int


def expression_steps(expr: str) -> tuple[Step, ...]:
    """Return the operations of an integer ``+ - *`` expression in evaluation order.

    ``"8 - 2 * 3"`` -> ``2 * 3 = 6``, ``8 - 6 = 2`` (precedence first, then left to right).
    ValueError (``ExpressionError``) for anything else, division included.
    """
    operations = safe_eval(expr).operations
    if any(o.op == "/" for o in operations):
        raise ExpressionError(f"not an integer + - * expression: {expr!r}")
    return tuple(Step(int(o.left), o.op, int(o.right), int(o.result)) for o in operations)


# How models spell the operators ("−" is U+2212, "×" U+00D7).
_OP_SPELLINGS = {"+": r"\+", "-": r"[-−]", "*": r"(?:\*|×|x|\\times|\\cdot|·)"}


def _number(value: int) -> str:
    # Not inside a longer number: "17 - 7 = 10" must not count as "7 - 7 = 0".
    sign = "[-−]" if value < 0 else ""
    # A sentence's full stop may follow ("= 5."), a decimal point may not ("= 5.5").
    return rf"(?<!\d)(?<!\d\.){sign}{abs(value)}(?!\d|\.\d)"


def step_pattern(step: Step) -> re.Pattern[str]:
    """Regex for ``step`` written as an equation, e.g. ``7 - 2 = 5``; either order for + and *."""
    op = _OP_SPELLINGS[step.op]
    result = rf"\s*=\s*{_number(step.result)}"
    forms = [rf"{_number(step.left)}\s*{op}\s*{_number(step.right)}{result}"]
    if step.op in "+*" and step.left != step.right:
        forms.append(rf"{_number(step.right)}\s*{op}\s*{_number(step.left)}{result}")
    return re.compile("|".join(f"(?:{form})" for form in forms))


#: Only the head of a completion is searched (bounded work on megabyte-long junk).
_STEP_SEARCH_CHARS = 4000


def step_correctness(ctx: ScoringContext) -> Judgement:
    """Share of the expression's operations written out correctly somewhere in the completion."""
    expr = ctx.sample.metadata.get("expression")
    if not isinstance(expr, str):
        return Judgement(0.0, None, {"reason": "sample has no expression metadata"})
    steps = expression_steps(expr)
    text = ctx.completion[:_STEP_SEARCH_CHARS]
    done = sum(1 for step in steps if step_pattern(step).search(text))
    return Judgement(done / len(steps), None, {"steps_correct": done, "steps": len(steps)})


class ArithmeticEnv(SingleTurnEnv):
    """Procedural arithmetic; train and test questions are disjoint (see ``is_held_out``)."""

    def __init__(
        self,
        task: str = "chain",
        difficulty: int = 2,
        seed: int = 0,
        train_size: int = 5000,
        test_size: int = 500,
        format: str = "none",
        format_weight: float = 0.0,
        answer: str = "strict",
        operands: int | None = None,
        digits: int | None = None,
        operators: str = DEFAULT_OPERATORS,
        step_credit: float = 0.0,
        first_digits: int | None = None,
    ) -> None:
        """Configure the generator.

        Args:
            task: ``chain`` or ``add2``.
            difficulty: 1-5 for ``chain`` (ignored by ``add2``).
            seed: the data seed; problem i of a split is a function of (seed, split, i).
            train_size: number of rows of the train split.
            test_size: number of rows of the test split.
            format: ``none``, ``boxed`` or ``think_answer``: the answer format the prompt asks for
                and the format component added to the rubric.
            format_weight: that component's weight (0: logged only).
            answer: ``strict`` counts only a committed answer (boxed / ``<answer>``);
                ``loose`` also takes the final stated number of the text (loose mode's
                precedence of statements: ``grpo_envs.math.extract``), for models that answer
                in prose (the embedded default model rarely boxes anything).
            operands: ``chain`` only: number of operands (2-8), overriding ``difficulty``'s.
            digits: ``chain`` only: max digits per operand (1-6), overriding ``difficulty``'s.
            operators: ``chain`` only: the operators to draw from, uniformly per position
                (repeat one to weight it); any of ``+``, ``-``, ``*``.
            step_credit: ``chain`` only: weight of the ``steps`` component (the share of the
                operations written out as correct equations; see ``step_correctness``). 0 (the
                default) leaves it out. Accuracy counts only the final answer either way.
            first_digits: ``chain`` only: max digits of the first operand (default: ``digits``);
                the curriculum's step between widths (``easier_stages``).
        """
        super().__init__()
        # What an easier version of this environment is built from (``easier_versions``).
        self._settings: dict[str, Scalar] = {
            "task": task, "seed": seed, "train_size": train_size, "test_size": test_size,
            "format": format, "format_weight": format_weight, "answer": answer,
            "operators": operators, "step_credit": step_credit,
        }  # fmt: skip
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
        if difficulty not in LEVELS:
            raise ValueError(f"difficulty must be one of {sorted(LEVELS)}, got {difficulty}")
        self.task, self.difficulty, self.seed, self.format = task, difficulty, seed, format
        level_operands, level_digits = LEVELS[difficulty]
        self.operands = level_operands if operands is None else operands
        self.digits = level_digits if digits is None else digits
        if not 2 <= self.operands <= 8:
            raise ValueError(f"operands must be between 2 and 8, got {self.operands}")
        if not 1 <= self.digits <= 6:
            raise ValueError(f"digits must be between 1 and 6, got {self.digits}")
        if first_digits is not None and not self.digits <= first_digits <= 6:
            raise ValueError(
                f"first_digits must be between digits ({self.digits}) and 6, got {first_digits}"
            )
        self.first_digits = first_digits
        if not operators or set(operators) - set("+-*"):
            raise ValueError(f"operators must be a non-empty string of + - *, got {operators!r}")
        self.operators = operators
        if answer not in ANSWER_MODES:
            raise ValueError(f"answer must be one of {ANSWER_MODES}, got {answer!r}")
        if not 0.0 <= step_credit <= 1.0:
            raise ValueError(f"step_credit must be between 0 and 1, got {step_credit}")
        if step_credit and task != "chain":
            raise ValueError("step_credit applies to task='chain' only (add2 has one step)")
        self.sizes = {"train": train_size, "test": test_size}
        self.step_credit = step_credit
        judge = integer_correctness if answer == "strict" else loose_integer_correctness
        steps = (
            [RewardComponent("steps", step_credit, step_correctness, bounded=True)]
            if step_credit
            else []
        )
        self.rubric = Rubric(
            [
                RewardComponent("correct", 1.0, judge, bounded=True),  # regex over a capped tail
                *steps,
                *extra_components(format, format_weight),
            ]
        )

    def easier_stages(self) -> list[dict[str, Scalar]]:
        """Keyword overrides for easier versions of this task, easiest first (a curriculum).

        ``chain`` only: first two operands with one digit, then one more digit at a time up to
        this task's (the first operand widens one stage before the others: "47 - 8" between
        "4 - 8" and "47 - 38", so that no step asks for a new answer width and new carries at
        once), then more operands up to this task's; the operators stay this task's. The
        configured task itself is not in the list. ``add2`` and tasks already at the bottom
        have none.

        >>> ArithmeticEnv(operands=3, digits=2, operators="-").easier_stages()
        [{'operands': 2, 'digits': 1}, {'operands': 2, 'digits': 1, 'first_digits': 2}, \
{'operands': 2, 'digits': 2}]
        >>> ArithmeticEnv(operands=2, digits=1).easier_stages()
        []
        """
        if self.task != "chain":
            return []
        ladder: list[dict[str, Scalar]] = [{"operands": 2, "digits": 1}]
        for d in range(2, self.digits + 1):
            ladder += [
                {"operands": 2, "digits": d - 1, "first_digits": d},
                {"operands": 2, "digits": d},
            ]
        ladder += [{"operands": n, "digits": self.digits} for n in range(3, self.operands + 1)]
        return ladder[:-1]

    def easier_versions(self) -> list[ArithmeticEnv]:
        """Return the environment at each of ``easier_stages``, easiest first (same seed, sizes)."""
        versions = []
        for stage in self.easier_stages():
            version = ArithmeticEnv(**{**self._settings, **stage})  # type: ignore[arg-type]
            version.env_id = self.env_id
            versions.append(version)
        return versions

    def _generate(self, rng: random.Random) -> Problem:
        if self.task == "add2":
            return add2_problem(rng)
        return chain_problem(rng, self.operands, self.digits, self.operators, self.first_digits)

    def load_split(self, split: str) -> Iterator[Sample]:
        """Return generated problems for ``split``."""
        suffix = instruction(self.format)
        for index, problem in procedural_split(
            self._generate, seed=self.seed, split=split, size=self.sizes[split]
        ):
            yield problem_sample(split, index, problem, suffix)

    def reference_completion(self, sample: Sample) -> str:
        """Return the gold answer in the requested format.

        With ``step_credit`` the worked steps come first, so that the reference earns the full
        reward.
        """
        answer = reference_answer(self.format, sample.answer)
        expr = sample.metadata.get("expression")
        if not self.step_credit or not isinstance(expr, str) or self.format == "think_answer":
            return answer
        work = "\n".join(f"{s.left} {s.op} {s.right} = {s.result}" for s in expression_steps(expr))
        return f"{work}\n{answer}"
