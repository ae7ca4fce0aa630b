"""Whatever the candidate returns or raises ends as a failed test of the candidate.

Two classes of attack on trusted test code: an exception of the candidate that the test's code
would take for control flow (``StopIteration`` ends ``map``/``all``/``for``), and a value that
makes the verdict machinery itself fail (a value that cannot be printed or sent back), which
used to turn the whole job into ``SANDBOX_ERROR``: an item the trainer leaves out, so a wrong
answer escaped its penalty.
"""

from __future__ import annotations

import pytest

from sandbox import CallTest, Sandbox, TestStatus

#: Trusted test code in which a control-flow exception of the candidate would end an iteration
#: quietly and let the test pass.
ITERATING_TESTS = [
    CallTest("assert all(map(candidate, [3, 5, 7]))"),
    CallTest("assert not any(not r for r in map(candidate, [3, 5]))"),
    CallTest("assert sum(map(candidate, [1, 3])) == 2"),
    CallTest("assert list(filter(candidate, [1, 2, 3])) == [1, 3]"),
    CallTest("for got in map(candidate, [1]):\n    assert got is True"),
    CallTest("assert [*zip(map(candidate, [1]), [1])] == [(True, 1)]"),
    CallTest("assert next(map(candidate, [1]), True) is True"),
]

CONTROL_FLOW_RAISERS = {
    "StopIteration": "raise StopIteration",
    "StopIteration with a value": "raise StopIteration(True)",
    "StopAsyncIteration": "raise StopAsyncIteration",
    "GeneratorExit": "raise GeneratorExit",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "SystemExit subclass": "raise type('Quit', (SystemExit,), {})(0)",
    "own class named StopIteration": "raise type('StopIteration', (Exception,), {})()",
    "hostile str/repr/eq/hash": (
        "class E(Exception):\n"
        "        def __str__(self): raise StopIteration\n"
        "        __repr__ = __str__\n"
        "        def __eq__(self, other): raise StopIteration\n"
        "        def __hash__(self): raise StopIteration\n"
        "    raise E()"
    ),
    "generator that raises": "yield from iter(())\n    raise StopIteration",
}


@pytest.mark.parametrize("how", sorted(CONTROL_FLOW_RAISERS))
def test_a_candidates_exception_is_never_control_flow(sb: Sandbox, how: str) -> None:
    program = f"def is_odd(x):\n    {CONTROL_FLOW_RAISERS[how]}\n"
    report = sb.run_tests(program, ITERATING_TESTS, entry_point="is_odd")
    statuses = [r.status for r in report.results]
    assert TestStatus.PASSED not in statuses, report
    assert TestStatus.SANDBOX_ERROR not in statuses, report


def test_honest_program_passes_the_iterating_tests(sb: Sandbox) -> None:
    report = sb.run_tests(
        "def is_odd(x):\n    return x % 2 == 1\n", ITERATING_TESTS, entry_point="is_odd"
    )
    assert report.all_passed, report


def test_stop_iteration_reaches_the_test_as_a_runtime_error(sb: Sandbox) -> None:
    report = sb.run_tests(
        "def f(x):\n    raise StopIteration('done')\n",
        [CallTest("assert all(map(candidate, [1]))")],
        entry_point="f",
    )
    (result,) = report.results
    assert result.status is TestStatus.RUNTIME_ERROR
    assert "RuntimeError" in result.detail and "StopIteration" in result.detail


def test_expected_exceptions_still_work(sb: Sandbox) -> None:
    """``except ValueError:`` in a test still catches the candidate's ValueError."""
    tests = [
        CallTest("try:\n    candidate(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False")
    ]
    good = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    assert sb.run_tests(good, tests, entry_point="f").all_passed
    bad = "def f(x):\n    return x\n"
    assert sb.run_tests(bad, tests, entry_point="f").results[0].status is TestStatus.FAILED


#: Values of the candidate that the verdict machinery once failed on.
HOSTILE_VALUES = {
    "int that cannot be printed": ("10 ** 5000", "assert r == 4, r"),
    "that int inside the message": ("10 ** 5000", "assert r == 4, [r, 'x']"),
    "that int in an f-string": ("10 ** 5000", "assert r == 4, f'got {r}'"),
    "100 levels deep, sent back": (
        "deep(101)",
        "assert candidate(r) == 4",
    ),
    "100 levels deep, wrapped and sent back": (
        "deep(101)",
        "assert candidate([r]) == 4",
    ),
    "100 levels deep as the message": ("deep(101)", "assert r == 4, r"),
    "huge string as the message": ("'x' * (8 << 20)", "assert r == 4, r"),
    "lone surrogate": ("chr(0xD800)", "assert r == 4, r"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_VALUES))
def test_a_candidates_value_is_its_failure_never_a_sandbox_error(sb: Sandbox, case: str) -> None:
    value, check = HOSTILE_VALUES[case]
    program = (
        "def deep(n):\n"
        "    v = 0\n"
        "    for _ in range(n - 1):\n"
        "        v = [v]\n"
        "    return v\n"
        "def f(x):\n"
        f"    return 4 if x == 'ok' else {value}\n"
    )
    tests = [
        CallTest("assert candidate('ok') == 4"),
        CallTest(f"r = candidate(1)\n{check}"),
        CallTest("assert candidate('ok') == 4"),
    ]
    report = sb.run_tests(program, tests, entry_point="f")
    statuses = [r.status for r in report.results]
    assert statuses[0] is TestStatus.PASSED and statuses[2] is TestStatus.PASSED, report
    assert statuses[1] in (TestStatus.FAILED, TestStatus.RUNTIME_ERROR), report
    assert str(report.status) != "sandbox_error"


def test_a_value_the_candidate_returned_can_be_passed_back(sb: Sandbox) -> None:
    program = (
        "def f(x):\n"
        "    if x == 1:\n"
        "        v = 0\n"
        "        for _ in range(100):  # the most levels the codec carries\n"
        "            v = [v]\n"
        "        return v\n"
        "    depth = 0\n"
        "    while isinstance(x, list):\n"
        "        x, depth = x[0], depth + 1\n"
        "    return depth\n"
    )
    report = sb.run_tests(
        program, [CallTest("assert candidate(candidate(1)) == 100")], entry_point="f"
    )
    assert report.all_passed, report


def test_a_test_argument_the_sandbox_cannot_send_is_still_a_sandbox_error(sb: Sandbox) -> None:
    """Only the task's own data can fail this way (a function as an argument): not the model's
    fault, so it stays a sandbox error and the item is left out."""
    report = sb.run_tests(
        "def f(x):\n    return 1\n", [CallTest("assert candidate(len) == 1")], entry_point="f"
    )
    assert report.results[0].status is TestStatus.SANDBOX_ERROR
