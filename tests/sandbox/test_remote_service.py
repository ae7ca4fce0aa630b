"""RemoteSandbox against ``grpo sandbox serve``'s real app, served on loopback.

Both protocols (``grpo``: verdicts decided by the service's sandbox; ``sandbox_fusion``: its
``/run_code``, stdin/stdout tests judged by the client), the service's token, and its refusal
over capacity (429 with Retry-After) absorbed by the client's retries.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from service_helpers import running_service

from sandbox import CallTest, IOTest, Sandbox, Status, TestJob, TestStatus
from sandbox.remote import RemoteSandbox, RemoteSettings
from sandbox.service import ServiceSettings

TOKEN = "remote-test-token-7c2f"
ADD_TESTS = (CallTest("assert candidate(1, 2) == 3"), CallTest("assert add(2, 2) == 4"))
IO_TESTS = (IOTest("21\n", "42\n"), IOTest("2\n", "4\n"))
JOBS = [
    TestJob("def add(a, b):\n    return a + b\n", ADD_TESTS, entry_point="add"),
    TestJob("def add(a, b):\n    return a - b\n", ADD_TESTS, entry_point="add"),
    TestJob("print('PASS')\nimport sys\nsys.exit(0)\n", ADD_TESTS, entry_point="add"),
    TestJob("print(int(input()) * 2)", IO_TESTS),
    TestJob("print(int(input()) + 2)", IO_TESTS),
    TestJob("while True:\n    pass", IO_TESTS, per_test_timeout_s=0.5),
]


@pytest.fixture(scope="module")
def url(sb: Sandbox) -> Iterator[str]:
    settings = ServiceSettings(port=0, workers=2, max_queue=2, token=TOKEN)
    with running_service(settings, sb) as address:
        yield address


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GRPO_TEST_REMOTE_TOKEN", TOKEN)
    return "GRPO_TEST_REMOTE_TOKEN"


def verdicts(reports: list) -> list[list[TestStatus]]:
    return [[r.status for r in report.results] for report in reports]


def test_grpo_protocol_reports_equal_the_local_sandboxes(url: str, sb: Sandbox, token: str) -> None:
    with RemoteSandbox(RemoteSettings(urls=(url,), token_env=token)) as box:
        remote = box.run_tests_many(JOBS)
        assert box.run("print(input()[::-1])", stdin="abc\n").stdout == "cba\n"
    assert verdicts(remote) == verdicts(sb.run_tests_many(JOBS))
    assert remote[0].all_passed and not remote[2].all_passed  # a forged "PASS" is no pass


def test_sandbox_fusion_protocol_judges_io_tests_here(url: str, token: str) -> None:
    settings = RemoteSettings(urls=(url,), protocol="sandbox_fusion", token_env=token)
    with RemoteSandbox(settings) as box:
        reports = box.run_tests_many(JOBS[3:])
        crashed = box.run("1/0")
    assert verdicts(reports) == [
        [TestStatus.PASSED, TestStatus.PASSED],
        [TestStatus.FAILED, TestStatus.PASSED],
        [TestStatus.TIMEOUT, TestStatus.TIMEOUT],
    ]
    assert crashed.status is Status.RUNTIME_ERROR and "ZeroDivisionError" in crashed.stderr


def test_without_the_token_every_job_is_a_sandbox_error_saying_so(url: str) -> None:
    with RemoteSandbox(RemoteSettings(urls=(url,))) as box:
        report = box.run_tests_many(JOBS[:1])[0]
    assert report.status is Status.SANDBOX_ERROR
    assert "401 the service refused the token" in report.results[0].detail


def test_over_capacity_429s_are_retried_until_every_job_is_judged(url: str, token: str) -> None:
    # 2 workers + 2 queued: 12 at once are partly refused (429, Retry-After), then retried.
    settings = RemoteSettings(urls=(url,), token_env=token, max_in_flight=12, retries=20)
    slow = TestJob("import time\ntime.sleep(0.3)\nprint(int(input()) * 2)", IO_TESTS[:1])
    with RemoteSandbox(settings) as box:
        reports = box.run_tests_many([slow] * 12)
        stats = box.stats()
    assert all(r.all_passed for r in reports)
    assert stats.retries > 0 and stats.failures == 0
