"""What a program is asked does not depend on its verdicts.

A right and a wrong program log every call (or run) they get; the logs must be the same: the
same tests, in the same order, with the same arguments. Otherwise a program called again only
after a pass learns its verdict. Checked for separate tests, a loop of asserts inside one test,
a whole ``check`` function, and stdin/stdout tests, with the options the code environments use
(every test runs; only the program's own failure may stop a job).
"""

from __future__ import annotations

import pytest

from sandbox import CallTest, IOTest, Sandbox, TestStatus

LOGGING = "import sys\ndef double(x):\n    print(repr(x), file=sys.stderr)\n    return {body}\n"
RIGHT, WRONG = "2 * x", "2 * x if x < 2 else -1"

CHECK = "def check(candidate):\n" + "".join(
    f"    assert candidate({x}) == {2 * x}\n" for x in range(5)
)
CALL_TESTS = {
    "separate tests": [CallTest(f"assert candidate({x}) == {2 * x}") for x in range(5)],
    "a loop of asserts": [
        CallTest("for x in range(5):\n    assert candidate(x) == 2 * x, x"),
        CallTest("assert candidate(10) == 20"),
    ],
    "a whole check": [CallTest("check(candidate)"), CallTest("check(double)")],
}


@pytest.mark.parametrize("kind", sorted(CALL_TESTS))
@pytest.mark.parametrize("stop_on_program_failure", [True, False])
def test_calls_do_not_depend_on_verdicts(
    sb: Sandbox, kind: str, stop_on_program_failure: bool
) -> None:
    logs = []
    for body in (RIGHT, WRONG):
        report = sb.run_tests(
            LOGGING.format(body=body),
            CALL_TESTS[kind],
            entry_point="double",
            setup=CHECK,
            stop_on_program_failure=stop_on_program_failure,
        )
        logs.append((report.stderr, report.all_passed))
    (right_log, right_passed), (wrong_log, wrong_passed) = logs
    assert right_passed and not wrong_passed
    assert right_log == wrong_log and right_log.count("\n") >= 5


def test_a_failed_assert_inside_a_test_is_still_its_failure(sb: Sandbox) -> None:
    report = sb.run_tests(
        LOGGING.format(body=WRONG), CALL_TESTS["a loop of asserts"], entry_point="double"
    )
    first = report.results[0]
    assert first.status is TestStatus.FAILED
    assert first.detail == "AssertionError: 2"  # the first failed assertion's message


def test_stdio_runs_do_not_depend_on_verdicts(sb: Sandbox) -> None:
    tests = [IOTest(f"{x}\n", f"{2 * x}\n") for x in range(5)]
    logs = []
    for body in (RIGHT, WRONG):
        program = f"import sys\nx = int(input())\nprint(repr(x), file=sys.stderr)\nprint({body})\n"
        report = sb.run_tests(program, tests, stop_on_program_failure=True)
        logs.append(report.stderr)
    assert logs[0] == logs[1] == "".join(f"{x}\n" for x in range(5))


def test_stop_on_program_failure_stops_only_for_the_programs_own_failure(sb: Sandbox) -> None:
    program = "def double(x):\n    if x == 2:\n        while True: pass\n    return 0\n"
    tests = [CallTest(f"assert candidate({x}) == {2 * x}") for x in range(5)]
    report = sb.run_tests(
        program, tests, entry_point="double", per_test_timeout_s=0.5, stop_on_program_failure=True
    )
    statuses = [r.status for r in report.results]
    assert statuses[:3] == [TestStatus.PASSED, TestStatus.FAILED, TestStatus.TIMEOUT]
    assert statuses[3:] == [TestStatus.FAILED, TestStatus.FAILED]
    assert "not run" in report.results[4].detail
