"""RemoteSandbox over services whose runs are the local sandbox's: the real verdict path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from remote_fakes import FakeService, fusion_handler, grpo_handler

from sandbox import CallTest, IOTest, Limits, Sandbox, Status, TestJob, TestStatus
from sandbox.remote import RemoteSandbox, RemoteSettings

ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
DOUBLE = "print(int(input()) * 2)"
DOUBLE_CPP = (
    "#include <iostream>\nint main() { long n; std::cin >> n; std::cout << 2 * n << '\\n'; }\n"
)
NOT_CPP = "int main() { cout << 1; }\n"


@pytest.fixture(scope="module")
def grpo_box(sb: Sandbox) -> Iterator[RemoteSandbox]:
    with FakeService(grpo_handler(sb)) as service:
        box = RemoteSandbox(RemoteSettings(urls=(service.url,), max_in_flight=4))
        yield box
        box.close()


@pytest.fixture(scope="module")
def fusion_box(sb: Sandbox) -> Iterator[RemoteSandbox]:
    with FakeService(fusion_handler(sb)) as service:
        settings = RemoteSettings(urls=(service.url,), protocol="sandbox_fusion")
        with RemoteSandbox(settings) as box:
            yield box


def test_call_tests_are_judged_by_the_services_sandbox(grpo_box: RemoteSandbox) -> None:
    tests = (CallTest("assert candidate(1, 2) == 3"), CallTest("assert add(2, 2) == 4"))
    right, wrong = grpo_box.run_tests_many(
        [TestJob(ADD, tests, entry_point="add"), TestJob(WRONG_ADD, tests, entry_point="add")]
    )
    assert right.all_passed and right.status is Status.OK
    assert [r.status for r in wrong.results] == [TestStatus.FAILED, TestStatus.FAILED]
    assert right.isolation  # the service's sandbox says which layers it applied


def test_io_tests_and_single_runs_over_grpo(grpo_box: RemoteSandbox) -> None:
    report = grpo_box.run_tests(DOUBLE, [IOTest("21\n", "42\n"), IOTest("1\n", "3\n")])
    assert [r.status for r in report.results] == [TestStatus.PASSED, TestStatus.FAILED]
    result = grpo_box.run("print(input()[::-1])", stdin="abc\n")
    assert (result.status, result.stdout) == (Status.OK, "cba\n")
    crashed = grpo_box.run("1/0")
    assert crashed.status is Status.RUNTIME_ERROR and "ZeroDivisionError" in crashed.stderr


def test_io_tests_over_sandbox_fusion_are_judged_here(fusion_box: RemoteSandbox) -> None:
    tests = (IOTest("21\n", "42\n"), IOTest("2\n", "4\n"))
    right, wrong, slow = fusion_box.run_tests_many(
        [
            TestJob(DOUBLE, tests),
            TestJob("print(int(input()) + 2)", tests),
            TestJob("while True:\n    pass", tests, per_test_timeout_s=0.5),
        ]
    )
    assert right.all_passed
    assert [r.status for r in wrong.results] == [TestStatus.FAILED, TestStatus.PASSED]
    assert [r.status for r in slow.results] == [TestStatus.TIMEOUT, TestStatus.TIMEOUT]
    assert fusion_box.run("print(1)", limits=Limits(timeout_s=2)).stdout == "1\n"


@pytest.mark.parametrize("protocol", ["grpo", "sandbox_fusion"])
def test_cpp_io_tests_compile_and_are_judged_over_both_protocols(
    protocol: str, grpo_box: RemoteSandbox, fusion_box: RemoteSandbox
) -> None:
    box = grpo_box if protocol == "grpo" else fusion_box
    tests = (IOTest("21\n", "42\n"), IOTest("2\n", "5\n"))
    right, broken = box.run_tests_many(
        [TestJob(DOUBLE_CPP, tests, language="cpp"), TestJob(NOT_CPP, tests, language="cpp")]
    )
    assert [r.status for r in right.results] == [TestStatus.PASSED, TestStatus.FAILED]
    assert broken.status is Status.COMPILE_ERROR
    assert [r.status for r in broken.results] == [TestStatus.COMPILE_ERROR] * 2
    assert "cout" in broken.results[0].detail
