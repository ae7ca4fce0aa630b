"""The batch endpoint's JSON form: round trips, and strict decoding of hostile shapes."""

from __future__ import annotations

import json

import pytest

from sandbox import CallTest, IOTest, Limits, Status, TestJob, TestReport, TestResult, TestStatus
from sandbox.wire import WireError, decode_job, decode_report, encode_job, encode_report


def test_a_call_job_with_every_field_survives_json() -> None:
    job = TestJob(
        program="def f(x):\n    return x\n",
        tests=(CallTest("assert candidate(1) == 1", "t0"), CallTest("check(candidate)")),
        entry_point="f",
        setup="def check(c):\n    assert c(2) == 2\n",
        limits=Limits(timeout_s=3.5, cpu_s=2.0, memory_mb=256),
        per_test_timeout_s=1.25,
        stop_on_first_failure=True,
        stop_on_program_failure=True,
    )
    assert decode_job(json.loads(json.dumps(encode_job(job)))) == job


def test_a_report_survives_json() -> None:
    report = TestReport(
        results=(TestResult("a", TestStatus.PASSED), TestResult("b", TestStatus.TIMEOUT, "2 s")),
        status=Status.TIMEOUT,
        wall_s=2.5,
        isolation=("seccomp", "landlock"),
        stdout="out\udcff",
        stderr="err",
    )
    assert decode_report(json.loads(json.dumps(encode_report(report)))) == report


@pytest.mark.parametrize(
    ("payload", "names"),
    [
        ([], "job: expected an object"),
        ({"tests": []}, "missing field(s) ['program']"),
        ({"program": 1, "tests": []}, "job.program: expected a string"),
        ({"program": "", "tests": {}}, "job.tests: expected a list"),
        ({"program": "", "tests": [{"kind": "shell"}]}, "job.tests[0].kind"),
        ({"program": "", "tests": [{"kind": "io", "source": "x"}]}, "job.tests[0]"),
        ({"program": "", "tests": [], "limits": {"timeout_s": -1}}, "job.limits: Limits.timeout_s"),
        ({"program": "", "tests": [], "limits": {"network": "yes"}}, "Limits.network"),
        ({"program": "", "tests": [], "per_test_timeout_s": float("nan")}, "per_test_timeout_s"),
        ({"program": "", "tests": [], "stop_on_first_failure": 1}, "stop_on_first_failure"),
        ({"program": "", "tests": [], "limits": {"uid": 0}}, "unknown field(s) ['uid']"),
    ],
)
def test_malformed_jobs_name_the_field(payload: object, names: str) -> None:
    with pytest.raises(WireError) as caught:
        decode_job(payload)
    assert names in str(caught.value)


def test_a_report_with_an_unknown_status_is_refused() -> None:
    good = encode_report(TestReport((TestResult("a", TestStatus.PASSED),), Status.OK, 0.1, ()))
    good["results"] = [{"name": "a", "status": "passed-ish"}]
    with pytest.raises(WireError, match=r"report.results\[0\].status"):
        decode_report(good)
    with pytest.raises(WireError, match="wall_s"):
        decode_report({**encode_report(TestReport((), Status.OK, 0.1, ())), "wall_s": "fast"})


def test_io_tests_keep_their_kind_and_defaults() -> None:
    decoded = decode_job({"program": "p", "tests": [{"kind": "io", "expected_stdout": "1"}]})
    assert decoded.tests == (IOTest("", "1"),)
    assert decoded.limits is None and decoded.entry_point is None


def test_a_single_run_and_its_result_survive_json() -> None:
    from sandbox import ExecResult, Job
    from sandbox.wire import decode_exec_result, decode_run, encode_exec_result, encode_run

    job = Job("print(open('d/x').read())", "in", {"d/x": "data"}, Limits(timeout_s=2))
    assert decode_run(json.loads(json.dumps(encode_run(job)))) == job
    result = ExecResult(Status.MEMORY, "o", "e", -9, 0.5, ("uid",), True, "cgroup oom")
    assert decode_exec_result(json.loads(json.dumps(encode_exec_result(result)))) == result
    with pytest.raises(WireError, match=r"run.files\['x'\]"):
        decode_run({"code": "", "files": {"x": 1}})
    with pytest.raises(WireError, match="exit_code"):
        decode_exec_result({**encode_exec_result(result), "exit_code": True})


def test_compiled_jobs_and_their_compile_results_survive_json() -> None:
    from sandbox import CompileResult, ExecResult, Job
    from sandbox.wire import decode_exec_result, decode_run, encode_exec_result, encode_run

    job = TestJob("int main(){}", (IOTest("", ""),), language="cpp", compile_timeout_s=7.5)
    assert decode_job(json.loads(json.dumps(encode_job(job)))) == job
    run = Job("fn main(){}", language="rust", compile_timeout_s=3)
    assert decode_run(json.loads(json.dumps(encode_run(run)))) == run
    failed = CompileResult(Status.COMPILE_ERROR, "", "main.cpp:1: error: x", 1, 0.2)
    report = TestReport(
        (TestResult("t", TestStatus.COMPILE_ERROR, "error: x"),),
        Status.COMPILE_ERROR, 0.3, ("uid",), compile=failed,
    )  # fmt: skip
    assert decode_report(json.loads(json.dumps(encode_report(report)))) == report
    result = ExecResult(Status.COMPILE_ERROR, "", "error", None, 0.2, (), compile=failed)
    assert decode_exec_result(json.loads(json.dumps(encode_exec_result(result)))) == result
    bad = {**encode_report(report), "compile": {**encode_compile_dict(failed), "exit_code": "1"}}
    with pytest.raises(WireError, match=r"report.compile.exit_code"):
        decode_report(bad)


def encode_compile_dict(result: object) -> dict[str, object]:
    from sandbox.wire import encode_compile

    encoded = encode_compile(result)  # type: ignore[arg-type]
    assert encoded is not None
    return encoded
