"""RemoteSandbox: settings, SandboxFusion's recorded answers, and every way a service fails.

The services are fakes on loopback (tests/remote_fakes.py) that the tests control; none needs
the local sandbox (tests/sandbox/test_remote_verdicts.py runs the real verdict path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from remote_fakes import (
    FUSION_SERVER_SCRIPT,
    FakeService,
    Reply,
    dead_url,
    recorded,
    recorded_fusion_handler,
    silent_listener,
)

from sandbox import CallTest, IOTest, Limits, SandboxClosedError, Status, TestJob, TestStatus, wire
from sandbox.remote import (
    CALL_TESTS_NEED_GRPO,
    COMPILE_FAILED,
    DEAD_AFTER_PROBES,
    DOWN_AFTER,
    RemoteSandbox,
    RemoteSettings,
)

QUICK = {"backoff_base_s": 0.05, "backoff_cap_s": 0.2}


def fusion_box(*urls: str, **overrides: object) -> RemoteSandbox:
    settings = RemoteSettings(urls=urls, protocol="sandbox_fusion", **{**QUICK, **overrides})  # type: ignore[arg-type]
    return RemoteSandbox(settings)


def ok_fusion(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
    return Reply(body=recorded("success"))


# -- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"urls": ()}, "give at least one service URL"),
        ({"urls": ("sandbox:8080",)}, "is not an http:// or https:// URL"),
        ({"urls": ("ftp://a",)}, "is not an http:// or https:// URL"),
        ({"urls": ("http://a?x=1",)}, "query or fragment"),
        ({"urls": ("http://a:99999",)}, "invalid port"),
        ({"urls": ("http://a", "http://a/")}, "names a URL twice"),
        ({"urls": ("http://a",), "protocol": "fusion"}, "is not one of ['grpo', 'sandbox_fusion']"),
        ({"urls": ("http://a",), "token_env": "sk-12345-secret"}, "NAME of the environment"),
        ({"urls": ("http://a",), "max_in_flight": 0}, "max_in_flight must be an int"),
        ({"urls": ("http://a",), "retries": -1}, "retries must be an int"),
        ({"urls": ("http://a",), "request_timeout_s": 0}, "request_timeout_s must be"),
        ({"urls": ("http://a",), "backoff_cap_s": float("nan")}, "backoff_cap_s must be"),
    ],
)
def test_settings_refuse_what_cannot_work_saying_how_to_fix_it(
    kwargs: dict[str, object], says: str
) -> None:
    with pytest.raises(ValueError) as caught:
        RemoteSettings(**kwargs)  # type: ignore[arg-type]
    assert says in str(caught.value)


def test_settings_take_a_comma_separated_list_and_normalise_urls() -> None:
    settings = RemoteSettings(urls="http://a:1/, https://b ")  # type: ignore[arg-type]
    assert settings.urls == ("http://a:1", "https://b")


def test_a_token_env_that_is_not_set_fails_at_construction_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GRPO_TEST_SANDBOX_TOKEN", raising=False)
    settings = RemoteSettings(urls=("http://a",), token_env="GRPO_TEST_SANDBOX_TOKEN")
    with pytest.raises(ValueError, match="export GRPO_TEST_SANDBOX_TOKEN="):
        RemoteSandbox(settings)


def test_the_token_is_sent_as_a_bearer_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_TEST_SANDBOX_TOKEN", "s3cret")
    seen: list[str] = []

    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        seen.append(headers.get("Authorization", ""))
        return Reply(body=recorded("success"))

    with (
        FakeService(handle) as service,
        fusion_box(service.url, token_env="GRPO_TEST_SANDBOX_TOKEN") as box,
    ):
        assert box.run("print(3)").status is Status.OK
    assert seen == ["Bearer s3cret"]


# -- SandboxFusion's recorded answers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "status", "exit_code", "detail"),
    [
        ("success", Status.OK, 0, ""),
        ("runtime_error", Status.RUNTIME_ERROR, 1, "exit status 1"),
        ("timeout", Status.TIMEOUT, None, "time limit exceeded"),
        ("compile_error", COMPILE_FAILED, 1, "compile error: /tmp/tmp9x8y7z6w/tmp_3c4d.cpp: In"),
        ("sandbox_error", Status.SANDBOX_ERROR, None, "Too many open files"),
    ],
)
def test_recorded_sandbox_fusion_answers_map_to_run_statuses(
    name: str, status: Status, exit_code: int | None, detail: str
) -> None:
    with FakeService(recorded_fusion_handler()) as service, fusion_box(service.url) as box:
        result = box.run(f"# {name}\nprint(3)")
    assert (result.status, result.exit_code) == (status, exit_code)
    assert detail in result.detail
    if name == "runtime_error":
        assert "ZeroDivisionError" in result.stderr
    if name == "compile_error":
        assert "'cout' was not declared" in result.stderr


@pytest.mark.parametrize(
    ("name", "expected", "verdict"),
    [
        ("success", "3\n", TestStatus.PASSED),
        ("success", "3   \n\n", TestStatus.PASSED),  # the local sandbox's normalisation
        ("success", "4\n", TestStatus.FAILED),
        ("success", "3\n4\n", TestStatus.FAILED),  # a prefix of the expected output fails
        ("runtime_error", "3\n", TestStatus.RUNTIME_ERROR),
        ("timeout", "3\n", TestStatus.TIMEOUT),
        (
            "compile_error",
            "3\n",
            TestStatus(COMPILE_FAILED.value),
        ),  # the run's status, as a verdict
        ("sandbox_error", "3\n", TestStatus.SANDBOX_ERROR),
    ],
)
def test_io_tests_over_sandbox_fusion_are_judged_by_the_client(
    name: str, expected: str, verdict: TestStatus
) -> None:
    with FakeService(recorded_fusion_handler()) as service, fusion_box(service.url) as box:
        report = box.run_tests(f"# {name}\nprint(3)", [IOTest("", expected)])
    assert [r.status for r in report.results] == [verdict]


def test_each_io_test_is_one_run_code_request_with_its_stdin_and_limits() -> None:
    with FakeService(recorded_fusion_handler()) as service, fusion_box(service.url) as box:
        job = TestJob(
            "# success\nprint(input())",
            (IOTest("a\n", "3\n"), IOTest("b\n", "3\n")),
            limits=Limits(timeout_s=9, memory_mb=300),
            per_test_timeout_s=1.5,
        )
        report = box.run_tests_many([job])[0]
    assert report.passed == 2
    sent = [payload for _, payload in service.requests]
    assert [p["stdin"] for p in sent] == ["a\n", "b\n"]  # type: ignore[index]
    assert {(p["run_timeout"], p["memory_limit_MB"], p["language"]) for p in sent} == {  # type: ignore[index]
        (1.5, 300, "python")
    }


def test_a_sandbox_error_stops_the_other_io_tests_of_the_job() -> None:
    with FakeService(recorded_fusion_handler()) as service, fusion_box(service.url) as box:
        report = box.run_tests("# sandbox_error\n", [IOTest("", "1")] * 3)
    assert [r.status for r in report.results] == [TestStatus.SANDBOX_ERROR] * 3
    assert len(service.requests) == 1


def test_a_compile_error_fails_every_io_test_so_after_one_request() -> None:
    with FakeService(recorded_fusion_handler()) as service, fusion_box(service.url) as box:
        report = box.run_tests(
            "# compile_error\nint main() {}",
            [IOTest("", "1")] * 3,
            language="cpp",
            compile_timeout_s=30,
        )
    assert [r.status for r in report.results] == [TestStatus.COMPILE_ERROR] * 3
    assert report.status is Status.COMPILE_ERROR and report.compile is not None
    assert report.compile.status is Status.COMPILE_ERROR and report.compile.exit_code == 1
    ((_, sent),) = service.requests
    assert (sent["language"], sent["compile_timeout"]) == ("cpp", 30)  # type: ignore[index]


def test_unknown_languages_and_call_tests_of_other_languages_are_refused_at_once() -> None:
    with fusion_box("http://127.0.0.1:9") as box:
        with pytest.raises(ValueError, match="unknown language 'c\\+\\+'"):
            box.run("int main() {}", language="c++")
        with pytest.raises(ValueError, match="takes IOTests only"):
            box.run_tests("x", [CallTest("1")], entry_point="f", language="rust")
        with pytest.raises(ValueError, match="compile_timeout_s"):
            box.run("x", language="cpp", compile_timeout_s=-1)


def test_call_tests_are_refused_by_a_plain_sandbox_fusion_naming_the_fix() -> None:
    with FakeService(ok_fusion) as service, fusion_box(service.url) as box:
        report = box.run_tests("def f(): return 1", [CallTest("assert f() == 1")], entry_point="f")
    assert report.status is Status.SANDBOX_ERROR
    assert report.results[0].detail == CALL_TESTS_NEED_GRPO
    assert "grpo sandbox serve" in CALL_TESTS_NEED_GRPO
    assert service.requests == []


def test_bad_arguments_raise_at_once_as_the_local_sandbox_does() -> None:
    with fusion_box("http://127.0.0.1:9") as box:
        with pytest.raises(TypeError, match="all CallTest or all IOTest"):
            box.run_tests("x", [CallTest("1"), IOTest("", "")], entry_point="f")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="need entry_point"):
            box.run_tests("x", [CallTest("1")])
        with pytest.raises(ValueError, match="plain relative path"):
            box.run("x", files={"../etc/passwd": ""})


# -- faults --------------------------------------------------------------------------------------


def test_429_is_retried_after_its_retry_after() -> None:
    calls: list[float] = []

    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        calls.append(time.monotonic())
        if len(calls) == 1:
            return Reply(429, {"detail": "busy"}, {"Retry-After": "1"})
        return Reply(body=recorded("success"))

    with FakeService(handle) as service, fusion_box(service.url) as box:
        result = box.run("print(3)")
        stats = box.stats()
    assert result.status is Status.OK
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.95
    assert (stats.requests, stats.retries, stats.failures) == (2, 1, 0)


def test_503_always_ends_as_sandbox_error_after_the_retries() -> None:
    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        return Reply(503, {"detail": "the service is shutting down"})

    with FakeService(handle) as service, fusion_box(service.url, retries=2) as box:
        start = time.monotonic()
        result = box.run("print(3)")
        elapsed = time.monotonic() - start
    assert result.status is Status.SANDBOX_ERROR
    assert "503: the service is shutting down" in result.detail and service.url in result.detail
    assert len(service.requests) == 3 and elapsed < 2.0
    assert box.stats().failures == 1


def test_a_refused_request_is_not_retried_and_its_message_is_the_detail() -> None:
    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        return Reply(400, {"detail": "request.code: expected a string"})

    with FakeService(handle) as service, fusion_box(service.url) as box:
        report = box.run_tests("print(1)", [IOTest("", "1")])
    assert report.results[0].status is TestStatus.SANDBOX_ERROR
    assert "400 the service refused the request: request.code" in report.results[0].detail
    assert len(service.requests) == 1


def test_a_malformed_or_mismatched_reply_is_a_sandbox_error() -> None:
    replies = iter(
        [
            Reply(body={"status": "Done", "message": ""}),
            Reply(raw=b"<html>gateway</html>"),
        ]
    )

    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        return next(replies)

    with FakeService(handle) as service, fusion_box(service.url) as box:
        assert "response.status: 'Done'" in box.run("x").detail
        assert "not JSON" in box.run("x").detail


def test_a_hung_service_ends_as_sandbox_error_within_the_deadline() -> None:
    with silent_listener() as url, fusion_box(url, request_timeout_s=1.0, retries=5) as box:
        start = time.monotonic()
        result = box.run("print(3)")
        elapsed = time.monotonic() - start
    assert result.status is Status.SANDBOX_ERROR
    assert "no answer within" in result.detail and url in result.detail
    # job_timeout_s defaults to twice the request's deadline: 2 s, whatever the retries (six
    # tries of 1 s would take 6 s).
    assert 1.9 <= elapsed <= 4.0, elapsed


def test_the_request_deadline_is_derived_from_the_jobs_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sandbox import remote

    assert remote.REQUEST_SLACK_S == 10.0
    monkeypatch.setattr(remote, "REQUEST_SLACK_S", 1.0)  # the test's time, not the rule
    with silent_listener() as url, fusion_box(url, retries=0) as box:
        start = time.monotonic()
        result = box.run("print(3)", limits=Limits(timeout_s=0.5))
        elapsed = time.monotonic() - start
    assert result.status is Status.SANDBOX_ERROR
    assert 1.45 <= elapsed <= 3.5, elapsed  # 0.5 s of limits + REQUEST_SLACK_S
    assert "no answer within 1.5s" in result.detail


def test_failover_to_the_second_url_when_the_first_is_dead() -> None:
    right = TestJob("# success\n", (IOTest("", "3\n"),))
    wrong = TestJob("# success\n", (IOTest("", "4\n"),))
    with (
        FakeService(recorded_fusion_handler()) as service,
        fusion_box(dead_url(), service.url) as box,
    ):
        reports = box.run_tests_many([right] * 4 + [wrong] * 4)
        stats = box.stats()
    assert [r.results[0].status for r in reports] == [TestStatus.PASSED] * 4 + [
        TestStatus.FAILED
    ] * 4
    assert stats.failovers >= 1 and stats.failures == 0


def test_a_dead_url_is_probed_then_everything_fails_fast() -> None:
    with fusion_box(dead_url(), cooldown_s=0.2) as box:
        times = []
        for _ in range(4):
            start = time.monotonic()
            result = box.run("x")
            times.append(time.monotonic() - start)
            assert result.status is Status.SANDBOX_ERROR
    # Down after DOWN_AFTER failures, then probed once per cool-down: waited for; dead after
    # DEAD_AFTER_PROBES failed probes: jobs fail at once, naming why.
    assert max(times[:2]) >= 0.2 and times[-1] < 0.05, times
    assert "every sandbox service URL is down" in result.detail
    assert "connection failed" in result.detail
    assert box.stats().requests == DOWN_AFTER + DEAD_AFTER_PROBES


def test_a_short_outage_costs_time_not_verdicts() -> None:
    served = []

    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        served.append(path)
        if len(served) <= 6:  # a restart: the first requests fail
            return Reply(503, {"detail": "starting"})
        return Reply(body=recorded("success"))

    with FakeService(handle) as service, fusion_box(service.url, cooldown_s=0.3) as box:
        results = box.run_many(["print(3)"] * 8)
    assert [r.status for r in results] == [Status.OK] * 8
    assert box.stats().failures == 0


def test_requests_in_flight_stay_within_max_in_flight() -> None:
    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        time.sleep(0.2)
        return Reply(body=recorded("success"))

    with FakeService(handle) as service, fusion_box(service.url, max_in_flight=4) as box:
        assert box.workers == 4
        results = box.run_many(["print(3)"] * 20)
        # Many callers at once (as a code environment fans out): still at most 4 in flight.
        threads = [threading.Thread(target=box.run, args=("print(3)",)) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert all(r.status is Status.OK for r in results)
    assert service.max_in_flight == 4


def test_a_service_killed_mid_step_leaves_typed_failures_and_no_hang(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    server = subprocess.Popen([sys.executable, "-c", FUSION_SERVER_SCRIPT, str(port_file), "0.5"])
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text():
            assert time.monotonic() < deadline, "the fake service did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        box = fusion_box(url, max_in_flight=8, request_timeout_s=5.0, cooldown_s=0.5)
        results: list[object] = []
        start = time.monotonic()
        runner = threading.Thread(target=lambda: results.extend(box.run_many(["x"] * 48)))
        runner.start()
        time.sleep(1.2)  # two waves of 8 answered, the third in flight
        os.kill(server.pid, signal.SIGKILL)
        runner.join(timeout=30)
        elapsed = time.monotonic() - start
        assert not runner.is_alive(), "run_many hung after the service died"
        box.close()
    finally:
        server.kill()
        server.wait()
    statuses = [r.status for r in results]  # type: ignore[attr-defined]
    assert len(statuses) == 48 and set(statuses) == {Status.OK, Status.SANDBOX_ERROR}
    assert statuses.count(Status.OK) >= 8
    failed = [r for r in results if r.status is Status.SANDBOX_ERROR]  # type: ignore[attr-defined]
    assert all(url in r.detail for r in failed)  # type: ignore[attr-defined]
    assert elapsed < 10, elapsed


def test_a_closed_remote_sandbox_refuses_calls() -> None:
    box = fusion_box("http://127.0.0.1:9")
    box.close()
    with pytest.raises(SandboxClosedError):
        box.run("x")


# -- protocol grpo -------------------------------------------------------------------------------


def test_grpo_replies_are_checked_for_shape_and_version() -> None:
    replies = iter(
        [
            Reply(body={"version": wire.WIRE_VERSION + 1, "report": {}}),
            Reply(body={"report": {}}),
            Reply(body={"version": wire.WIRE_VERSION, "report": {"results": []}}),
        ]
    )

    def handle(path: str, payload: object, headers: Mapping[str, str]) -> Reply:
        return next(replies)

    job = TestJob("print(1)", (IOTest("", "1"),))
    with FakeService(handle) as service, RemoteSandbox(RemoteSettings(urls=(service.url,))) as box:
        details = [box.run_tests_many([job])[0].results[0].detail for _ in range(3)]
    assert "run the same grpo-kit version on both sides" in details[0]
    assert "expected {'version', 'report'}" in details[1]
    assert "report: missing field(s)" in details[2]
