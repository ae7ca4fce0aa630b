"""Scoring logic of the code environments, against a scripted stand-in for the sandbox.

The stand-in returns chosen ``TestReport``s, so these tests pin down the report -> Score mapping,
time-limit calibration and the batch time bound without running any program. The real sandbox is
exercised in test_code_humaneval.py and test_code_mbpp_stdio.py.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence

import pytest

from grpo_envs.code import CodeConfig, RewardMode
from grpo_envs.code.scoring import outcome_of, score_report
from grpo_envs.envs.humaneval import HumanEvalEnv
from grpo_envs.types import Outcome, Sample
from sandbox import Status, TestJob, TestReport, TestResult, TestStatus

P, F = TestStatus.PASSED, TestStatus.FAILED


def report(*statuses: TestStatus, status: Status = Status.OK, wall_s: float = 0.01) -> TestReport:
    results = tuple(
        TestResult(f"t{i}", s, "why" if s is not P else "") for i, s in enumerate(statuses)
    )
    return TestReport(
        results=results, status=status, wall_s=wall_s, isolation=("pid_ns", "seccomp")
    )


class ScriptedSandbox:
    """Duck-types ``Sandbox.run_tests_many``: answers each job with ``respond(job)``."""

    def __init__(
        self, respond: Callable[[TestJob], TestReport], delay_s: float = 0.0, workers: int = 2
    ) -> None:
        self.respond = respond
        self.delay_s = delay_s  # per call
        self.workers = workers
        self.jobs: list[TestJob] = []  # every job received, in order of arrival

    def run_tests_many(self, jobs: Sequence[TestJob]) -> list[TestReport]:
        self.jobs.extend(jobs)
        time.sleep(self.delay_s)
        return [self.respond(job) for job in jobs]

    def close(self) -> None:
        raise AssertionError("an environment must not close a sandbox it was given")


@pytest.fixture(scope="module")
def rows() -> list[dict[str, object]]:
    return list(HumanEvalEnv().dataset("test").select(range(3)))


def all_pass(job: TestJob) -> TestReport:
    return report(*[P] * len(job.tests))


@pytest.mark.parametrize(
    ("rep", "n", "expected"),
    [
        (report(P, P, P), 3, Outcome.PASSED),
        (report(P, F, P), 3, Outcome.FAILED),
        (report(P, P), 3, Outcome.RUNTIME_ERROR),  # ended before serving every test
        (report(P, TestStatus.TIMEOUT), 2, Outcome.TIMEOUT),
        (report(P, TestStatus.MEMORY), 2, Outcome.MEMORY),
        (report(TestStatus.RUNTIME_ERROR, F), 2, Outcome.RUNTIME_ERROR),
        (report(TestStatus.OUTPUT_LIMIT), 1, Outcome.RUNTIME_ERROR),
        (report(F, TestStatus.SANDBOX_ERROR), 2, Outcome.SANDBOX_ERROR),
        (report(P, status=Status.SANDBOX_ERROR), 1, Outcome.SANDBOX_ERROR),
        (report(P, F, status=Status.TIMEOUT), 2, Outcome.TIMEOUT),  # program-wide kill explains it
        (report(F, status=Status.MEMORY), 1, Outcome.MEMORY),
        (report(), 0, Outcome.RUNTIME_ERROR),  # no tests at all never passes
    ],
)
def test_outcome_of(rep, n, expected):
    assert outcome_of(rep, n) is expected


def test_binary_and_fraction_rewards():
    mixed = report(P, F, P, P)
    binary = score_report(mixed, 4, RewardMode.BINARY, "fenced", 4.0)
    frac = score_report(mixed, 4, RewardMode.FRACTION, "fenced", 4.0)
    assert binary.reward == 0.0 and binary.outcome is Outcome.FAILED
    assert frac.reward == pytest.approx(0.75) and frac.outcome is Outcome.FAILED
    assert frac.component("pass_fraction").value == pytest.approx(0.75)
    assert frac.details["passed"] == 3 and frac.details["total"] == 4
    assert str(frac.details["first_failure"]).startswith("t1: failed")
    assert frac.details["isolation"] == "pid_ns+seccomp"
    # A sandbox failure gives no reward even in partial-credit mode.
    broken = score_report(report(P, TestStatus.SANDBOX_ERROR), 2, RewardMode.FRACTION, "bare", 4.0)
    assert broken.reward == 0.0 and broken.outcome is Outcome.SANDBOX_ERROR


def test_config_validation_says_how_to_fix():
    with pytest.raises(ValueError, match="reward mode"):
        CodeConfig(reward="partial")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reference_time_factor"):
        CodeConfig(reference_time_factor=0.5)
    with pytest.raises(TypeError, match="unknown code-environment option"):
        HumanEvalEnv(time_limit=3)
    assert HumanEvalEnv(reward="fraction").config.reward is RewardMode.FRACTION


def test_unparsable_and_bad_samples_never_reach_the_sandbox(rows):
    fake = ScriptedSandbox(all_pass)
    env = HumanEvalEnv(sandbox=fake)  # type: ignore[arg-type]
    bad_row = {**rows[0], "metadata": "{}"}
    scores = env.score_batch(
        ["I cannot solve this.", "```python\nreturn 1\n```", "x"], [rows[0], rows[1], bad_row]
    )
    assert [s.outcome for s in scores] == [Outcome.UNPARSABLE, Outcome.UNPARSABLE, Outcome.ERROR]
    assert all(s.reward == 0.0 for s in scores)
    assert "lacks metadata" in str(scores[2].details["reason"])
    assert fake.jobs == []


def test_lazy_calibration_gives_evalplus_limits_to_timed_out_items(rows):
    T = TestStatus.TIMEOUT
    names = ("has_close_elements", "separate_paren_groups", "truncate_number")  # HumanEval/0-2

    def respond(job: TestJob) -> TestReport:
        task = next(i for i, name in enumerate(names) if f"def {name}" in job.program)
        n = len(job.tests)
        if not job.stop_on_program_failure:  # a reference run (binary scoring jobs stop early)
            if task == 1:
                return report(F, *[P] * (n - 1))  # this reference "fails": default limit
            return report(*[P] * n, wall_s=(3.0, 0.0, 0.05)[task])
        limit = job.per_test_timeout_s or 0.0
        if task == 0:  # a slow but right solution: passes with 12 s per test
            return report(*[P] * n) if limit >= 12.0 else report(T)
        if task == 1:  # wrong, and slow: fails once given 5 s
            return report(F) if limit >= 5.0 else report(T)
        return report(T)  # an infinite loop

    fake = ScriptedSandbox(respond, workers=1)  # one feeder: jobs arrive in order
    env = HumanEvalEnv(sandbox=fake, default_test_timeout_s=5.0)  # type: ignore[arg-type]
    comps = [f"```python\ndef {name}(*a):\n    pass\n```" for name in names]
    scores = env.score_batch(comps, rows)
    first, refs, again = fake.jobs[:3], fake.jobs[3:6], fake.jobs[6:]
    assert [j.per_test_timeout_s for j in first] == [4.0, 4.0, 4.0]  # the EvalPlus floor
    assert all(not j.stop_on_program_failure for j in refs)  # references run every test
    assert env.test_timeout(env.task(Sample.from_row(rows[0]))) == pytest.approx(12.0)  # 4 x 3 s
    assert env.test_timeout(env.task(Sample.from_row(rows[1]))) == pytest.approx(5.0)  # default
    assert env.test_timeout(env.task(Sample.from_row(rows[2]))) == pytest.approx(4.0)  # floor
    assert "HumanEval/1" in env.reference_failures
    # Only the items whose limit went up run again.
    assert [j.per_test_timeout_s for j in again] == [pytest.approx(12.0), pytest.approx(5.0)]
    assert [s.outcome for s in scores] == [Outcome.PASSED, Outcome.FAILED, Outcome.TIMEOUT]
    env.score_batch(comps, rows)
    assert len(fake.jobs) == 8 + 3  # limits cached: no reference runs, no reruns


def test_no_reference_runs_when_nothing_times_out(rows):
    fake = ScriptedSandbox(all_pass)
    env = HumanEvalEnv(sandbox=fake)  # type: ignore[arg-type]
    comps = [str(env.reference_completion(Sample.from_row(r))) for r in rows]
    assert [s.outcome for s in env.score_batch(comps, rows)] == [Outcome.PASSED] * 3
    assert len(fake.jobs) == 3 and all(j.stop_on_program_failure for j in fake.jobs)
    # No job stops at a failed test: whether a later test runs must not depend on a verdict.
    assert not any(j.stop_on_first_failure for j in fake.jobs)


def test_fraction_mode_runs_every_test(rows):
    fake = ScriptedSandbox(all_pass)
    env = HumanEvalEnv(sandbox=fake, reward="fraction", calibrate=False)  # type: ignore[arg-type]
    env.score("```python\ndef has_close_elements(n, t):\n    return False\n```", rows[0])
    assert len(fake.jobs) == 1 and not fake.jobs[0].stop_on_first_failure
    assert not fake.jobs[0].stop_on_program_failure


def test_batch_time_is_bounded(rows):
    # Each job takes 0.4 s on one worker; a 1.0 s budget lets at most two start (a third would have
    # less than scoring.MIN_JOB_S left), the rest time out without running. Asserted loosely enough
    # for a loaded machine: what matters is the bound and that unstarted items say why.
    fake = ScriptedSandbox(all_pass, delay_s=0.4, workers=1)
    env = HumanEvalEnv(sandbox=fake, calibrate=False)  # type: ignore[arg-type]
    n = 40
    comps = [
        f"```python\ndef has_close_elements(n, t):\n    return False  # {i}\n```" for i in range(n)
    ]
    start = time.monotonic()
    scores = env.score_batch(comps, [rows[0]] * n, timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert elapsed < 2.5  # far below the 16 s that running all 40 would take
    outcomes = [s.outcome for s in scores]
    started = len(fake.jobs)
    assert 1 <= started <= 2
    assert outcomes[0] == Outcome.PASSED
    assert outcomes[started:] == [Outcome.TIMEOUT] * (n - started)
    assert "budget" in str(scores[-1].details["reason"])
    # A job started late gets at most the time left as its wall limit.
    last = fake.jobs[-1]
    assert last.limits is not None and last.limits.timeout_s <= 1.0


def test_pickled_env_leaves_the_sandbox_behind(rows):
    fake = ScriptedSandbox(all_pass)
    env = HumanEvalEnv(sandbox=fake, reward="fraction")  # type: ignore[arg-type]
    clone = pickle.loads(pickle.dumps(env))
    assert clone.config == env.config
    assert clone._sandbox is None
    env.close()  # a given sandbox is not closed (ScriptedSandbox.close would raise)


def test_chat_message_completions_are_accepted(rows):
    fake = ScriptedSandbox(all_pass)
    env = HumanEvalEnv(sandbox=fake, calibrate=False)  # type: ignore[arg-type]
    chat = [
        {
            "role": "assistant",
            "content": "```python\ndef has_close_elements(n, t):\n    return False\n```",
        }
    ]
    score = env.score(chat, rows[0])  # type: ignore[arg-type]
    assert score.outcome is Outcome.PASSED and score.details["extraction"] == "full_function"
    assert env.score(None, rows[0]).outcome is Outcome.UNPARSABLE  # type: ignore[arg-type]


def test_a_sandbox_that_raises_costs_the_items_not_the_caller(rows):
    def explode(job: TestJob) -> TestReport:
        raise RuntimeError("worker pool on fire")

    env = HumanEvalEnv(sandbox=ScriptedSandbox(explode), calibrate=False)  # type: ignore[arg-type]
    scores = env.score_batch([rows[0]["answer"], "no code"], [rows[0], rows[0]])
    assert [s.outcome for s in scores] == [Outcome.SANDBOX_ERROR, Outcome.UNPARSABLE]
    assert "worker pool on fire" in str(scores[0].details["reason"])


def test_identical_programs_in_a_batch_run_once(rows):
    fake = ScriptedSandbox(all_pass)
    env = HumanEvalEnv(sandbox=fake, calibrate=False)  # type: ignore[arg-type]
    same = "```python\ndef has_close_elements(n, t):\n    return False\n```"
    other = same.replace("False", "True")
    scores = env.score_batch([same] * 6 + [other, same], [rows[0]] * 7 + [rows[1]])
    assert len(fake.jobs) == 3  # (row 0, same), (row 0, other), (row 1, same)
    assert [s.outcome for s in scores] == [Outcome.PASSED] * 8
