"""run_tests: correct programs pass; every known verdict forgery fails."""

from __future__ import annotations

import pytest
from sandbox_helpers import FAST

from sandbox import CallTest, IOTest, Limits, Sandbox, Status, TestJob, TestStatus

ADD_TESTS = [CallTest("assert candidate(1, 2) == 3"), CallTest("assert add(-1, 1) == 0")]
CORRECT_ADD = "def add(a, b):\n    return a + b\n"


def verdicts(sb: Sandbox, program: str, tests: list[CallTest] | None = None, **kw: object) -> list:
    report = sb.run_tests(program, tests or ADD_TESTS, entry_point="add", **kw)  # type: ignore[arg-type]
    return [r.status for r in report.results]


def test_correct_program_passes(sb: Sandbox) -> None:
    report = sb.run_tests(CORRECT_ADD, ADD_TESTS, entry_point="add")
    assert report.all_passed
    assert (report.passed, report.total, report.fraction) == (2, 2, 1.0)
    assert report.status is Status.OK
    assert "pid_ns" in report.isolation or report.isolation


def test_wrong_program_fails(sb: Sandbox) -> None:
    wrong = "def add(a, b):\n    return a + b if a > 0 else 99\n"
    report = sb.run_tests(wrong, ADD_TESTS, entry_point="add")
    assert [r.status for r in report.results] == [TestStatus.PASSED, TestStatus.FAILED]
    assert report.fraction == 0.5
    assert not report.all_passed


FORGERIES = {
    "always_true_eq": """
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
def add(a, b):
    return Anything()
""",
    "int_subclass_eq": """
class Int(int):
    def __eq__(self, other): return True
def add(a, b):
    return Int(7)
""",
    "sys_exit_before_tests": "import sys\nsys.exit(0)\ndef add(a, b):\n    return a - b\n",
    "os_exit_before_tests": "import os\nos._exit(0)\n",
    "atexit_exit": "import atexit, os\natexit.register(lambda: os._exit(0))\n"
    "def add(a, b):\n    import os; os._exit(0)\n",
    "exit_inside_call": "def add(a, b):\n    raise SystemExit(0)\n",
    "patch_builtins": """
import builtins
builtins.AssertionError = type("Nope", (Exception,), {})
def fake_assert(*a, **k): return None
builtins.__import__ = builtins.__import__
def add(a, b):
    return None
""",
    "patch_harness": """
import sys
for name, mod in list(sys.modules.items()):
    for attr in ("decode_value", "encode_value", "_candidate_exception"):
        if hasattr(mod, attr):
            setattr(mod, attr, lambda *a, **k: 3)
def add(a, b):
    return a - b
""",
    "fake_passed_prints": """
print("passed"); print("ALL TESTS PASSED"); print('{"status": "passed"}')
import sys; sys.stderr.write("passed\\n")
def add(a, b):
    print("passed")
    return 42
""",
    "swallow_everything": """
import sys
sys.excepthook = lambda *a: None
sys.settrace(lambda *a: None)
def add(a, b):
    try:
        raise AssertionError
    except BaseException:
        return "ok"
""",
    "kill_the_harness": """
import os, signal
def add(a, b):
    for pid in (os.getppid(), 0, -1):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return a - b
""",
    "write_the_private_channel": """
import os, json, struct
msg = json.dumps(["ret", 0, ["i", "3"]]).encode()
os.write(3, struct.pack(">I", len(msg)) + msg)
os.write(3, b"garbage" * 100)
def add(a, b):
    return a - b
""",
    "close_the_channel": "import os\nos.close(3)\ndef add(a, b):\n    return a + b\n",
    "reexec_with_O": """
import os, sys
os.execv("/usr/bin/python3", ["python3", "-O", "-c", "import sys; sys.exit(0)"])
""",
    "missing_entry_point": "def plus(a, b):\n    return a + b\n",
    "not_serializable": "def add(a, b):\n    return lambda: a + b\n",
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forgery_fails(sb: Sandbox, name: str) -> None:
    report = sb.run_tests(FORGERIES[name], ADD_TESTS, entry_point="add")
    assert report.passed == 0, (name, report)
    assert not report.all_passed
    assert all(r.status is not TestStatus.PASSED for r in report.results)


def test_candidate_exceptions_map_to_builtin_types(sb: Sandbox) -> None:
    program = (
        "def add(a, b):\n    if a < 0:\n        raise ValueError('negative')\n    return a + b\n"
    )
    tests = [
        CallTest(
            "try:\n    candidate(-1, 0)\n    assert False\nexcept ValueError as e:\n"
            "    assert 'negative' in str(e)"
        ),
        CallTest("assert candidate(-1, 0) == -1"),
    ]
    report = sb.run_tests(program, tests, entry_point="add")
    assert [r.status for r in report.results] == [TestStatus.PASSED, TestStatus.RUNTIME_ERROR]
    assert "ValueError" in report.results[1].detail


def test_values_round_trip_exactly(sb: Sandbox) -> None:
    program = "def add(a, b):\n    return a\n"
    value = (
        "[1, -2**100, 0.1, float('inf'), 1+2j, 'é\\x00', b'\\xff', (1,), {1: {2}},"
        " frozenset({3}), None, True]"
    )
    tests = [
        CallTest(
            f"v = {value}\nassert candidate(v, 0) == v\nassert type(candidate(v, 0)[6]) is bytes"
        )
    ]
    report = sb.run_tests(program, tests, entry_point="add")
    assert report.all_passed, report


def test_timeout_then_restart_for_remaining_tests(sb: Sandbox) -> None:
    program = "def add(a, b):\n    while a == 0:\n        pass\n    return a + b\n"
    tests = [CallTest("assert candidate(0, 1) == 1"), CallTest("assert candidate(2, 3) == 5")]
    report = sb.run_tests(program, tests, entry_point="add", per_test_timeout_s=0.5)
    assert [r.status for r in report.results] == [TestStatus.TIMEOUT, TestStatus.PASSED]
    assert report.status is Status.TIMEOUT


def test_swallowed_timeout_still_times_out(sb: Sandbox) -> None:
    program = "def add(a, b):\n    while True:\n        pass\n"
    tests = [CallTest("try:\n    candidate(1, 2)\nexcept BaseException:\n    pass")]
    report = sb.run_tests(program, tests, entry_point="add", per_test_timeout_s=0.5)
    assert report.results[0].status is TestStatus.TIMEOUT


def test_module_level_hang_and_crash(sb: Sandbox) -> None:
    hang = sb.run_tests(
        "while True: pass\n", ADD_TESTS, entry_point="add", limits=Limits(timeout_s=1.0)
    )
    assert [r.status for r in hang.results] == [TestStatus.TIMEOUT] * 2
    crash = sb.run_tests("1/0\n", ADD_TESTS, entry_point="add")
    assert [r.status for r in crash.results] == [TestStatus.RUNTIME_ERROR] * 2
    assert crash.status is Status.RUNTIME_ERROR
    assert "ZeroDivisionError" in crash.stderr


def test_missing_entry_point_is_a_runtime_error_not_a_timeout() -> None:
    """Regression: the sandbox's own kill after the verdicts was once read as RLIMIT_CPU.

    The program without its entry point exits by itself right after saying so, while the zygote
    kills it as soon as the verdict process is done: whichever comes first decided the status
    (about half the time 'timeout', "CPU limit of N s"). One worker and a passing run before
    each check reproduce the interleaving; 25 rounds made the old code fail every time here.
    """
    with Sandbox(limits=FAST, workers=1) as box:
        seen = set()
        for _ in range(25):
            assert box.run_tests(CORRECT_ADD, ADD_TESTS, entry_point="add").all_passed
            report = box.run_tests(
                "def plus(a, b):\n    return a + b\n", ADD_TESTS, entry_point="add"
            )
            seen.add((report.status, *((r.status, r.detail) for r in report.results)))
    detail = "NameError: entry point 'add' is not defined"
    expected = (Status.RUNTIME_ERROR, *[(TestStatus.RUNTIME_ERROR, detail)] * 2)
    assert seen == {expected}


def test_candidate_closing_its_channel_is_a_runtime_error(sb: Sandbox) -> None:
    """A program that closes the call channel and lingers is killed by us: not a CPU timeout."""
    program = "def add(a, b):\n    import os, time\n    os.close(3)\n    time.sleep(30)\n"
    report = sb.run_tests(program, ADD_TESTS, entry_point="add")
    assert [r.status for r in report.results] == [TestStatus.RUNTIME_ERROR] * 2
    assert report.status is Status.RUNTIME_ERROR
    assert report.wall_s < 10


def test_memory_and_output_limits_in_calls(sb: Sandbox) -> None:
    mem = "def add(a, b):\n    return len(bytearray(8 << 30))\n"
    report = sb.run_tests(mem, ADD_TESTS[:1], entry_point="add", limits=Limits(memory_mb=256))
    assert report.results[0].status is TestStatus.MEMORY
    flood = "def add(a, b):\n    while True:\n        print('x' * 1000)\n"
    report = sb.run_tests(flood, ADD_TESTS[:1], entry_point="add", limits=FAST)
    assert report.results[0].status is TestStatus.OUTPUT_LIMIT


def test_humaneval_style_setup_with_helpers(sb: Sandbox) -> None:
    prompt = 'def helper(x):\n    return x * 2\n\ndef double_all(xs):\n    """Double."""\n'
    completion = "    return [helper(x) for x in xs]\n"
    test = "def check(candidate):\n    assert candidate([1, 2]) == [helper(1), helper(2)]\n"
    report = sb.run_tests(
        prompt + completion,
        [CallTest("check(candidate)")],
        entry_point="double_all",
        setup=prompt + "\n" + test,
    )
    assert report.all_passed, report


def test_stop_on_first_failure(sb: Sandbox) -> None:
    program = "def add(a, b):\n    return 0\n"
    tests = [
        CallTest("assert candidate(0, 0) == 0"),
        CallTest("assert candidate(1, 1) == 2"),
        CallTest("assert candidate(0, 0) == 0"),
    ]
    report = sb.run_tests(program, tests, entry_point="add", stop_on_first_failure=True)
    assert [r.status for r in report.results] == [
        TestStatus.PASSED,
        TestStatus.FAILED,
        TestStatus.FAILED,
    ]
    assert "not run" in report.results[2].detail


def test_bad_setup_and_bad_test_source_are_sandbox_errors(sb: Sandbox) -> None:
    report = sb.run_tests(CORRECT_ADD, ADD_TESTS, entry_point="add", setup="1/0")
    assert {r.status for r in report.results} == {TestStatus.SANDBOX_ERROR}
    report = sb.run_tests(CORRECT_ADD, [CallTest("assert (")], entry_point="add")
    assert report.results[0].status is TestStatus.SANDBOX_ERROR


def test_io_tests(sb: Sandbox) -> None:
    program = "n = int(input())\nprint(n * 2)   \nprint()\n"
    tests = [
        IOTest("2\n", "4\n"),
        IOTest("3\n", "6"),
        IOTest("1\n", "2\n3\n"),
        IOTest("x\n", "0\n"),
    ]
    report = sb.run_tests(program, tests)
    assert [r.status for r in report.results] == [
        TestStatus.PASSED,
        TestStatus.PASSED,
        TestStatus.FAILED,
        TestStatus.RUNTIME_ERROR,
    ]
    assert report.status is Status.RUNTIME_ERROR
    fake = sb.run_tests("print('passed')\nimport sys\nsys.exit(0)\n", [IOTest("2\n", "4\n")])
    assert fake.results[0].status is TestStatus.FAILED


def test_run_tests_many_keeps_input_order(sb: Sandbox) -> None:
    jobs = [
        TestJob(
            f"def add(a, b):\n    return a + b + {k}\n",
            (CallTest("assert candidate(1, 1) == 2"),),
            "add",
        )
        for k in (0, 1, 0, 2)
    ]
    reports = sb.run_tests_many(jobs)
    assert [r.all_passed for r in reports] == [True, False, True, False]


def test_invalid_arguments_raise_at_once(sb: Sandbox) -> None:
    with pytest.raises(ValueError):
        sb.run_tests(CORRECT_ADD, ADD_TESTS)  # no entry point
    with pytest.raises(TypeError):
        sb.run_tests(CORRECT_ADD, [ADD_TESTS[0], IOTest("", "")], entry_point="add")  # type: ignore[list-item]
    empty = sb.run_tests(CORRECT_ADD, [], entry_point="add")
    assert empty.total == 0 and not empty.all_passed
