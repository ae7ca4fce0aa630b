r"""Built-in multi-turn environments over the existing ones.

- ``code/feedback-v0``: code with execution feedback over any code environment (HumanEval, MBPP,
  stdio, ``code/dataset-v0``...). Each attempt runs on the task's VISIBLE tests; their failures
  come back as the next observation, up to ``max_turns`` attempts; the reward comes from the
  HIDDEN tests only (so that passing what was shown is not enough).
- ``math/python-tool-v0``: math with a Python tool over any math environment (tool-integrated
  reasoning, ToRA: arXiv:2309.17452): the model calls ``python`` (Hermes ``<tool_call>`` JSON or
  fenced blocks); the first turn without a call is the final answer, verified by the base
  environment exactly as its single-turn form is.
- ``math/feedback-v0``: answer, be told what was wrong, try again (``math/add2-feedback-v0`` is
  its two-digit-addition form, the multi-turn task the embedded default model learns on a CPU).
  A wrong final answer gets feedback that never contains the answer: no answer found, the same
  answer again, or (``hint="direction"``, for numeric answers) too high / too low. Success is the
  right answer within ``max_turns`` turns; the reward is the base environment's score of the
  final turn only (so a right answer on turn 3 scores as on turn 1, unless ``turn_cost`` > 0).
  With ``max_turns=1`` it is the base task itself, which is what makes the single-turn
  comparison the same task.

The test split (``split_tests``): the first ``visible_tests`` tests (default 1) are visible and the
rest hidden, keeping at least one hidden; a task with a single test has no visible test (its
episodes end after the first attempt: there is nothing to show without giving the hidden test
away). HumanEval's ``check`` is split per assert by the base environment, MBPP's are its
``test_list`` (+ challenge tests), stdio's its input/output pairs, so the split is by test, in
dataset order, which is deterministic.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from grpo_envs.base import Environment, SplitSource
from grpo_envs.episode import (
    EpisodeBudget,
    EpisodeState,
    MultiTurnEnv,
    Step,
    ToolRecord,
    ToolStatus,
    turn_penalty,
)
from grpo_envs.rubric import Judgement, RewardComponent, Rubric, ScoringContext
from grpo_envs.tools import PythonTool, ToolFormat, python_tool_step, truncate_output
from grpo_envs.types import Message, Outcome, Sample, Score

if TYPE_CHECKING:
    from grpo_envs.code.scoring import CodeEnvironment, CodeTask
    from sandbox import TestJob, TestReport

#: Characters of test feedback the model sees per attempt.
FEEDBACK_CHARS = 2000


def _base(env_id: str, kwargs: Mapping[str, object]) -> Environment:
    from grpo_envs.registration import make

    return make(env_id, **kwargs)


def _rows(base: Environment, system: str = "") -> dict[str, SplitSource]:
    # Loaded on first use (building the environment loads no data), as the base env does.
    return {split: functools.partial(_split_rows, base, split, system) for split in base.splits}


def _split_rows(base: Environment, split: str, system: str) -> list[Sample]:
    """Return the base env's rows, with ``system`` added to (or as) their system message."""
    samples = [Sample.from_row(row) for row in base.dataset(split)]
    if not system:
        return samples
    out = []
    for sample in samples:
        prompt = list(sample.prompt)
        if prompt and prompt[0].role == "system":
            prompt[0] = Message("system", f"{system}\n\n{prompt[0].content}")
        else:
            prompt.insert(0, Message("system", system))
        out.append(dataclasses.replace(sample, prompt=tuple(prompt)))
    return out


def split_tests(task: CodeTask, visible: int) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """Return (visible tests, hidden tests) of ``task`` (see the module docstring)."""
    tests = tuple(task.tests)
    if len(tests) < 2:
        return (), tests
    shown = min(max(visible, 0), len(tests) - 1)
    return tests[:shown], tests[shown:]


class CodeFeedbackEnv(MultiTurnEnv):
    """Attempts judged on visible tests with their failures fed back; hidden tests give reward."""

    def __init__(self, base: Environment, *, max_turns: int = 3, visible_tests: int = 1) -> None:
        """Build over ``base`` (a made code environment)."""
        from grpo_envs.code.scoring import CodeEnvironment

        code = base.unwrapped
        if not isinstance(code, CodeEnvironment):
            raise TypeError(f"code/feedback-v0 needs a code environment, got {type(code).__name__}")
        self.code: CodeEnvironment = code
        self.visible_tests = visible_tests
        rubric = Rubric([RewardComponent("hidden_tests", 1.0, self._judge_hidden, bounded=True)])
        super().__init__(
            _rows(base),
            rubric,
            self._step,
            budget=EpisodeBudget(max_turns=max_turns),
            reference=base.reference_completion,
            splits=base.splits,
        )

    def _task(self, sample: Sample, hidden: bool) -> CodeTask:
        task = self.code.task(sample)
        visible, rest = split_tests(task, self.visible_tests)
        return dataclasses.replace(task, tests=rest if hidden else visible)  # type: ignore[arg-type]

    def _run(self, task: CodeTask, program: str) -> TestReport:
        return self.code.sandbox.run_tests_many([self._job(task, program)])[0]

    def _job(self, task: CodeTask, program: str) -> TestJob:
        from sandbox import Limits, TestJob

        per_test = self.code.test_timeout(task)
        total = min(self.code.config.max_job_s, per_test * max(1, len(task.tests)) + 2.0)
        return TestJob(
            program=program,
            tests=task.tests,
            entry_point=task.entry_point,
            setup=task.setup,
            limits=Limits(timeout_s=total, memory_mb=self.code.config.memory_mb),
            per_test_timeout_s=per_test,
        )

    def _step(self, state: EpisodeState, turn: str) -> Step:
        task = self._task(state.sample, hidden=False)
        if not task.tests:
            return Step.end()
        program = self.code.extract(turn, task, state.sample)
        if program is None:
            return Step.reply(
                "No Python code found. Answer with the complete program in a ```python block."
            )
        report = self._run(task, program.code)
        if report.all_passed:
            return Step.end()
        failures = [
            f"- {_describe(test)} -> {result.status}{': ' + result.detail if result.detail else ''}"
            for test, result in zip(task.tests, report.results)
            if not result.passed
        ]
        if not failures:
            failures = [f"- the program ended with {report.status}: {report.stderr[-500:]}"]
        feedback = truncate_output("\n".join(failures), FEEDBACK_CHARS)
        status = ToolStatus.TIMEOUT if str(report.status) == "timeout" else ToolStatus.ERROR
        record = ToolRecord("visible_tests", program.code, status, report.wall_s, feedback)
        return Step.reply(
            f"Your program failed {len(failures)} of {len(task.tests)} visible tests:\n"
            f"{feedback}\nFix it and answer with the complete program again.",
            tools=[record],
        )

    def _judge_hidden(self, ctx: ScoringContext) -> Judgement:
        from grpo_envs.code.scoring import score_report

        task = self._task(ctx.sample, hidden=True)
        program = self.code.extract(ctx.completion, task, ctx.sample)
        if program is None:
            return Judgement(0.0, Outcome.UNPARSABLE, {"reason": "no parsable Python code found"})
        report = self._run(task, program.code)
        score = score_report(
            report,
            len(task.tests),
            self.code.config.reward,
            str(program.method),
            self.code.test_timeout(task),
        )
        fraction = score.component("pass_fraction").value
        return Judgement(score.reward, score.outcome, score.details, {"pass_fraction": fraction})


def _describe(test: object) -> str:
    """Show a visible test to the model: its assert, or its stdin and expected stdout."""
    from sandbox import CallTest

    if isinstance(test, CallTest):
        return test.source.strip()
    stdin, expected = getattr(test, "stdin", ""), getattr(test, "expected_stdout", "")
    return f"input {stdin[:300]!r}, expected output {expected[:300]!r}"


def code_feedback_env(
    base: str = "code/humaneval-v0",
    max_turns: int = 3,
    visible_tests: int = 1,
    **base_kwargs: object,
) -> CodeFeedbackEnv:
    """Code with execution feedback over the code environment ``base`` (built with its kwargs)."""
    return CodeFeedbackEnv(
        _base(base, base_kwargs), max_turns=max_turns, visible_tests=visible_tests
    )


TOOL_SYSTEM_PROMPT = (
    "You can run Python to help you: {how}. Variables persist between your calls. "
    "When you are done, answer without calling the tool."
)
_HOW = {
    ToolFormat.HERMES: 'write <tool_call>{"name": "python", "arguments": {"code": "..."}}'
    "</tool_call>",
    ToolFormat.CODE_BLOCK: "write a ```python code block and its output comes back",
}


def math_python_env(
    base: str = "math/arithmetic-v0",
    max_turns: int = 4,
    tool_format: str = "hermes",
    tool_timeout_s: float = 5.0,
    max_tool_s: float = 30.0,
    **base_kwargs: object,
) -> MultiTurnEnv:
    """Math with a Python tool over the math environment ``base`` (built with its kwargs)."""
    fmt = ToolFormat(tool_format)
    made = _base(base, base_kwargs)
    # One budget for the episode and its step: a reply's calls stop where the tool time does.
    budget = EpisodeBudget(max_turns=max_turns, max_tool_s=max_tool_s)
    return MultiTurnEnv(
        _rows(made, system=TOOL_SYSTEM_PROMPT.format(how=_HOW[fmt])),
        _verified_rubric(made),
        python_tool_step(PythonTool(timeout_s=tool_timeout_s), fmt, budget=budget),
        budget=budget,
        reference=made.reference_completion,
        splits=made.splits,
    )


def _verified_rubric(made: Environment) -> Rubric:
    """Return the base environment's own score of the final turn as the one reward component."""

    def verified(ctx: ScoringContext) -> Judgement:
        score = made.score(ctx.completion, ctx.sample)
        return Judgement(score.reward, score.outcome, dict(score.details))

    # Bounded: ``made`` is wrapped by ``make``, which bounds its scoring time itself.
    return Rubric([RewardComponent("verified", 1.0, verified, bounded=True)])


#: ``math/feedback-v0``'s hints: ``direction`` adds too high / too low for numeric answers.
HINTS = ("direction", "none")
_RETRY = "Try again, with the final answer in \\boxed{}."
#: Answers longer than this are not compared as numbers (bounded work on junk).
_MAX_NUMBER_CHARS = 40
# What ``as_number`` reads: no exponent, since ``Fraction("1e999999999")`` builds a billion-digit
# integer (hours of work in the step function, which no time limit covers).
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/[+-]?\d+)?")


def as_number(text: str) -> Fraction | None:
    """``text`` as an exact number (integer, decimal or ``a/b``; ``$``, commas tolerated), or None.

    >>> as_number("1,024"), as_number("-0.5"), as_number("3/4"), as_number("x + 1")
    (Fraction(1024, 1), Fraction(-1, 2), Fraction(3, 4), None)
    >>> as_number("1e999999999") is None  # an exponent is not read (unbounded work)
    True
    """
    cleaned = text.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")
    if not cleaned or len(cleaned) > _MAX_NUMBER_CHARS or not _PLAIN_NUMBER.fullmatch(cleaned):
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def answer_feedback(
    extracted: str | None, gold: str, earlier: Sequence[str], hint: str = "direction"
) -> str:
    r"""Return what the model is told after a wrong final answer; never the answer itself.

    ``extracted`` is the final answer the verifier read (None: none found), ``earlier`` the answers
    of the episode's earlier turns.

    >>> answer_feedback("85", "95", [])
    '85 is not right: it is too low. Try again, with the final answer in \\boxed{}.'
    >>> answer_feedback("85", "95", ["85"], hint="none")[:47]
    '85 is still not right (you answered 85 before).'
    >>> answer_feedback(None, "95", [])
    'I found no final answer. Try again, with the final answer in \\boxed{}.'
    """
    if hint not in HINTS:
        raise ValueError(f"hint must be one of {HINTS}, got {hint!r}")
    if extracted is None:
        return f"I found no final answer. {_RETRY}"
    shown = extracted.strip()[:_MAX_NUMBER_CHARS]
    if any(shown == e.strip()[:_MAX_NUMBER_CHARS] for e in earlier):
        return f"{shown} is still not right (you answered {shown} before). {_RETRY}"
    value, target = as_number(extracted), as_number(gold)
    if hint == "direction" and value is not None and target is not None and value != target:
        side = "too high" if value > target else "too low"
        return f"{shown} is not right: it is {side}. {_RETRY}"
    return f"{shown} is not right. {_RETRY}"


def _extracted(score: Score) -> str | None:
    """Return the final answer the base environment's verifier read, if it read one."""
    if score.outcome is Outcome.UNPARSABLE:
        return None
    value = score.details.get("extracted")
    return value if isinstance(value, str) and value.strip() else None


def math_feedback_env(
    base: str = "math/arithmetic-v0",
    max_turns: int = 3,
    hint: str = "direction",
    turn_cost: float = 0.0,
    max_tokens: int | None = None,
    **base_kwargs: object,
) -> MultiTurnEnv:
    """Answer, get feedback on a wrong answer, try again, over the math environment ``base``.

    Args:
        base: any math environment id (its kwargs pass through, e.g. ``task="add2"``).
        max_turns: attempts per episode (1 = the base task, single-turn).
        hint: ``direction`` (too high / too low for numeric answers) or ``none``.
        turn_cost: reward subtracted per turn after the first (0: success is success).
        max_tokens: the episode's budget of sampled tokens over all turns (None: no cap).
        **base_kwargs: the base environment's own arguments.
    """
    if hint not in HINTS:
        raise ValueError(f"hint must be one of {HINTS}, got {hint!r}")
    if turn_cost < 0:
        raise ValueError(f"turn_cost must be >= 0, got {turn_cost}")
    made = _base(base, base_kwargs)

    def step(state: EpisodeState, turn: str) -> Step:
        score = made.score(turn, state.sample)
        if score.outcome.is_success:
            return Step.end()
        # The earlier answers are re-read rather than kept: the state stays the transcript only.
        earlier = [_extracted(made.score(t, state.sample)) for t in state.turns[:-1]]
        answers = [e for e in earlier if e is not None]
        return Step.reply(answer_feedback(_extracted(score), state.sample.answer, answers, hint))

    return MultiTurnEnv(
        _rows(made),
        _verified_rubric(made),
        step,
        budget=EpisodeBudget(max_turns=max_turns, max_tokens=max_tokens),
        episode_components=[turn_penalty(-turn_cost)] if turn_cost else (),
        reference=made.reference_completion,
        splits=made.splits,
    )


__all__ = [
    "HINTS",
    "CodeFeedbackEnv",
    "answer_feedback",
    "as_number",
    "code_feedback_env",
    "math_feedback_env",
    "math_python_env",
    "split_tests",
]
