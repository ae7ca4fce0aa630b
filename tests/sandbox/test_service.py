"""``grpo sandbox serve``'s app, served for real on loopback: SandboxFusion's official client,
our batch endpoint against the local Sandbox, and the service's limits (429, 413, 400, 401)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from sandbox_fusion import RunCodeRequest, RunStatus, run_code, set_endpoint
from service_helpers import ServiceSandbox, health, running_service

from sandbox import CallTest, IOTest, Language, Limits, Sandbox, TestJob, TestStatus, wire
from sandbox.service import DEFAULT_MAX_LIMITS, ServiceSettings, build_app

TOKEN = "test-token-4b1d9e"


@pytest.fixture(scope="module")
def url(sb: Sandbox) -> Iterator[str]:
    with running_service(ServiceSettings(port=0, workers=2), sb) as address:
        yield address


@pytest.fixture(scope="module")
def remote(url: str, sb: Sandbox) -> Iterator[ServiceSandbox]:
    client = ServiceSandbox(url, sb)
    yield client
    client.close()


def fusion(url: str, language: str = "python", **fields: object) -> object:
    """``/run_code`` through SandboxFusion's official client (one attempt: no retries)."""
    set_endpoint(url)
    request = RunCodeRequest(language=language, **fields)  # type: ignore[arg-type]
    return run_code(request, max_attempts=1, client_timeout=60)


# -- SandboxFusion's official client ------------------------------------------------------------


def test_fusion_client_hello_and_stdin(url: str) -> None:
    hello = fusion(url, code="print('hello')")
    assert hello.status == RunStatus.Success and hello.message == ""
    assert hello.compile_result is None and hello.files == {}
    run = hello.run_result
    assert (run.status, run.return_code, run.stdout, run.stderr) == ("Finished", 0, "hello\n", "")
    assert 0 < run.execution_time < 10
    echo = fusion(url, code="print(input()[::-1])", stdin="abc\n")
    assert echo.run_result.stdout == "cba\n"


def test_fusion_client_runtime_error_and_timeout(url: str) -> None:
    error = fusion(url, code="import sys\nprint('partial')\n1/0\n")
    assert error.status == RunStatus.Failed
    assert error.run_result.status == "Finished" and error.run_result.return_code == 1
    assert error.run_result.stdout == "partial\n"
    assert "ZeroDivisionError" in error.run_result.stderr
    exit3 = fusion(url, code="raise SystemExit(3)")
    assert exit3.status == RunStatus.Failed and exit3.run_result.return_code == 3
    slow = fusion(url, code="while True:\n    pass\n", run_timeout=1)
    assert slow.status == RunStatus.Failed
    assert slow.run_result.status == "TimeLimitExceeded"
    assert slow.run_result.return_code is None  # SandboxFusion sends none for a timeout
    assert 1 <= slow.run_result.execution_time < 10


#: A program per compiled or other language that reverses its stdin line.
REVERSE = {
    "cpp": "#include <bits/stdc++.h>\nint main(){std::string s;std::getline(std::cin,s);"
    "std::reverse(s.begin(),s.end());std::cout<<s<<std::endl;}\n",
    "java": "import java.util.*;\npublic class Main{public static void main(String[] a){"
    "String s=new Scanner(System.in).nextLine();"
    "System.out.println(new StringBuilder(s).reverse());}}\n",
    "rust": "use std::io::*;\nfn main(){let mut s=String::new();stdin().read_line(&mut s)"
    '.unwrap();println!("{}",s.trim_end().chars().rev().collect::<String>());}\n',
    "nodejs": "const s=require('fs').readFileSync(0,'utf8').trimEnd();"
    "console.log([...s].reverse().join(''));\n",
    "bash": 'read s; echo "$s" | rev\n',
}
COMPILED = {"cpp", "java", "rust"}


@pytest.mark.parametrize("language", sorted(REVERSE))
def test_fusion_client_runs_every_language_the_sandbox_runs(url: str, language: str) -> None:
    reply = fusion(url, language, code=REVERSE[language], stdin="abc\n", compile_timeout=30)
    assert reply.status == RunStatus.Success, reply
    assert reply.run_result.stdout == "cba\n" and reply.run_result.return_code == 0
    if language in COMPILED:  # SandboxFusion reports the compile step of compiled languages
        assert reply.compile_result.status == "Finished"
        assert reply.compile_result.return_code == 0
    else:
        assert reply.compile_result is None


def test_fusion_client_sees_a_compile_error_as_sandboxfusion_reports_it(url: str) -> None:
    reply = fusion(url, "cpp", code="int main() { return undefined_name; }\n")
    assert reply.status == RunStatus.Failed and reply.run_result is None
    compiled = reply.compile_result
    assert compiled.status == "Finished" and compiled.return_code != 0
    assert "undefined_name" in compiled.stderr  # the compiler's own message
    java = fusion(url, "java", code="public class Main { void f( }\n", compile_timeout=30)
    assert java.status == RunStatus.Failed and java.run_result is None
    assert java.compile_result.return_code != 0 and "error" in java.compile_result.stderr


def test_the_batch_endpoint_judges_a_cpp_job_as_the_local_sandbox(
    remote: ServiceSandbox, sb: Sandbox
) -> None:
    tests = (IOTest("abc\n", "cba\n"), IOTest("xy\n", "yx\n"), IOTest("q\n", "qq\n"))
    job = TestJob(REVERSE["cpp"], tests, language="cpp")
    there, here = remote.run_tests_many([job])[0], sb.run_tests_many([job])[0]
    assert [r.status for r in there.results] == [r.status for r in here.results]
    assert [r.status for r in there.results] == [
        TestStatus.PASSED, TestStatus.PASSED, TestStatus.FAILED,
    ]  # fmt: skip
    broken = TestJob("int main( {", tests, language="cpp")
    report = remote.run_tests_many([broken])[0]
    assert {r.status for r in report.results} == {TestStatus.COMPILE_ERROR}
    assert report.compile is not None and "error" in report.compile.stderr


def test_fusion_client_files_in_and_fetched_back(url: str) -> None:
    code = (
        "import os, sys\n"
        "data = open('data/in.txt').read()\n"
        "open('out.txt', 'w').write(data.upper())\n"
        "open('raw.bin', 'wb').write(bytes(range(256)))\n"
        "print('wrote', end='')\n"
        "sys.stdout.flush()\n"
        "os._exit(4)\n"  # skips every exit handler: the files come back all the same
    )
    files = {"data/in.txt": base64.b64encode(b"hi there").decode(), "skipped": None}
    reply = fusion(url, code=code, files=files, fetch_files=["out.txt", "raw.bin", "absent"])
    assert reply.status == RunStatus.Failed
    assert reply.run_result.return_code == 4
    assert reply.run_result.stdout == "wrote"  # the fetched files are not in the program's stdout
    assert set(reply.files) == {"out.txt", "raw.bin"}  # a missing file is left out, as there
    assert base64.b64decode(reply.files["out.txt"]) == b"HI THERE"
    assert base64.b64decode(reply.files["raw.bin"]) == bytes(range(256))


def test_verl_payload_and_sandboxfusion_ping(url: str) -> None:
    # What verl's call_sandbox_api posts (stdin may be null; memory_limit_MB always sent).
    payload = {
        "compile_timeout": 10,
        "run_timeout": 10,
        "code": "print(sum(map(int, input().split())))",
        "stdin": "1 2 3\n",
        "memory_limit_MB": 1024,
        "language": "python",
        "files": {},
        "fetch_files": [],
    }
    reply = httpx.post(f"{url}{wire.RUN_CODE_PATH}", content=json.dumps(payload), timeout=60)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "6\n"
    assert set(body) == {
        "status", "message", "compile_result", "run_result", "executor_pod_name", "files"
    }  # fmt: skip
    assert set(body["run_result"]) == {
        "status", "execution_time", "return_code", "stdout", "stderr"
    }  # fmt: skip
    assert httpx.get(f"{url}/v1/ping").json() == "pong"


def test_fusion_memory_limit_is_applied(url: str) -> None:
    # The official client's request has no memory_limit_MB (verl's payload has): posted raw.
    code = "x = bytearray(300 << 20)\nprint('ok')"
    for limit, status in ((128, "Failed"), (-1, "Success"), (1024, "Success")):
        body = {"code": code, "language": "python", "memory_limit_MB": limit}
        reply = httpx.post(f"{url}{wire.RUN_CODE_PATH}", json=body, timeout=60).json()
        assert reply["status"] == status, (limit, reply)
    assert reply["run_result"]["stdout"] == "ok\n"
    small = {"code": code, "language": "python", "memory_limit_MB": 128}
    run = httpx.post(f"{url}{wire.RUN_CODE_PATH}", json=small, timeout=60).json()["run_result"]
    assert run["return_code"] == 1 and "MemoryError" in run["stderr"]


def test_fusion_languages_the_service_does_not_run(url: str) -> None:
    body = {"code": "x", "language": "racket"}  # a SandboxFusion language, not run here
    reply = httpx.post(f"{url}{wire.RUN_CODE_PATH}", json=body)
    assert reply.status_code == 422 and "racket" in reply.json()["detail"]
    unknown = httpx.post(f"{url}{wire.RUN_CODE_PATH}", json={"code": "x", "language": "cobol"})
    assert unknown.status_code == 400 and "language" in unknown.json()["detail"]


# -- the batch endpoint judges as the local Sandbox does ----------------------------------------

ADD_SETUP = (
    "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
)
ADD_TESTS = (CallTest("check(candidate)"), CallTest("assert add(2, 2) == 4", "direct"))
PRINT_TESTS = (IOTest("21\n", "42\n"), IOTest("5\n", "10\n", "five"))

#: (program, tests, entry point, should pass): honest programs and forgers.
JUDGED = {
    "call_correct": ("def add(a, b):\n    return a + b\n", ADD_TESTS, "add", True),
    "call_wrong": ("def add(a, b):\n    return a - b\n", ADD_TESTS, "add", False),
    "call_prints_pass_and_exits": (
        "print('PASS')\nimport sys\nsys.exit(0)\ndef add(a, b):\n    return a + b\n",
        ADD_TESTS,
        "add",
        False,
    ),
    "call_always_equal": (
        "class Same:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Same()\n",
        ADD_TESTS,
        "add",
        False,
    ),
    "call_os_exit_zero": (
        "import os\ndef add(a, b):\n    os._exit(0)\n",
        ADD_TESTS,
        "add",
        False,
    ),
    "io_correct": ("print(int(input()) * 2)\n", PRINT_TESTS, None, True),
    "io_prints_pass": ("print('PASS')\n", PRINT_TESTS, None, False),
    "io_prefix_then_exit_zero": (
        "import os\nprint(42, flush=True)\nos._exit(0)\n",
        PRINT_TESTS,
        None,
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(JUDGED))
def test_batch_endpoint_reports_what_the_local_sandbox_does(
    case: str, sb: Sandbox, remote: ServiceSandbox
) -> None:
    program, tests, entry_point, should_pass = JUDGED[case]
    job = TestJob(program, tests, entry_point=entry_point, setup=ADD_SETUP if entry_point else "")
    local = sb.run_tests_many([job])[0]
    served = remote.run_tests_many([job])[0]
    assert served.results == local.results, (served, local)
    assert served.status == local.status
    assert served.all_passed is should_pass
    assert served.total == len(tests)


def test_single_run_endpoint_matches_local(sb: Sandbox, remote: ServiceSandbox) -> None:
    code = "import sys\nprint(open('f.txt').read(), input())\nsys.exit(2)\n"
    local = sb.run(code, stdin="in\n", files={"f.txt": "file"})
    served = remote.run(code, stdin="in\n", files={"f.txt": "file"})
    assert (served.status, served.stdout, served.exit_code) == (
        local.status,
        local.stdout,
        local.exit_code,
    )
    assert served.stdout == "file in\n" and served.isolation == local.isolation


# -- the service's own limits -------------------------------------------------------------------


def test_over_capacity_is_refused_at_once_with_retry_after(sb: Sandbox) -> None:
    settings = ServiceSettings(port=0, workers=1, max_queue=0)
    slow = {"code": "import time\ntime.sleep(2)\nprint('done')\n"}
    with running_service(settings, sb) as address:
        first: list[httpx.Response] = []
        thread = threading.Thread(
            target=lambda: first.append(
                httpx.post(f"{address}{wire.RUN_PATH}", json=slow, timeout=60)
            )
        )
        thread.start()
        deadline = time.monotonic() + 20
        while health(address)["in_flight"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        start = time.monotonic()
        second = httpx.post(f"{address}{wire.RUN_PATH}", json=slow, timeout=60)
        assert time.monotonic() - start < 1.5  # answered at once, not after the first run
        assert second.status_code == 429 and second.headers["Retry-After"] == "1"
        assert "over capacity" in second.json()["detail"]
        thread.join()
        assert first[0].status_code == 200
        assert first[0].json()["result"]["stdout"] == "done\n"
        counts = health(address)
    assert counts["served"] == {wire.RUN_PATH: 1}
    assert counts["refused"] == {"429": 1}
    assert counts["in_flight"] == counts["waiting"] == 0


def test_queue_admits_up_to_max_queue(sb: Sandbox) -> None:
    settings = ServiceSettings(port=0, workers=1, max_queue=2)
    body = {"code": "import time\ntime.sleep(0.5)\n"}
    with running_service(settings, sb) as address:
        with httpx.Client(timeout=60) as client:
            replies: list[int] = []

            def post() -> None:
                replies.append(client.post(f"{address}{wire.RUN_PATH}", json=body).status_code)

            threads = [threading.Thread(target=post) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert replies == [200, 200, 200]  # one running, two waiting: all admitted
        assert health(address)["served"] == {wire.RUN_PATH: 3}


def test_huge_bodies_are_refused_413_declared_or_chunked(sb: Sandbox) -> None:
    settings = ServiceSettings(port=0, workers=1, max_request_bytes=4096)
    big = json.dumps({"code": "print(1)  # " + "x" * 10_000}).encode()
    with running_service(settings, sb) as address:
        declared = httpx.post(f"{address}{wire.RUN_PATH}", content=big)
        assert declared.status_code == 413, declared.text

        def chunks() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
            for start in range(0, len(big), 1000):
                yield big[start : start + 1000]

        chunked = httpx.post(f"{address}{wire.RUN_PATH}", content=chunks())
        assert chunked.status_code == 413, chunked.text
        fits = httpx.post(f"{address}{wire.RUN_PATH}", json={"code": "print(1)"})
        assert fits.status_code == 200
        counts = health(address)
    assert counts["refused"] == {"413": 2} and counts["served"] == {wire.RUN_PATH: 1}


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        (wire.RUN_PATH, b"{", "invalid JSON"),
        (wire.RUN_PATH, b"[" * 100_000, "invalid JSON"),
        (wire.RUN_PATH, b'{"code": 3}', "run.code"),
        (wire.RUN_TESTS_PATH, b'{"program": "x", "tests": [], "colour": "red"}', "colour"),
        (wire.RUN_TESTS_PATH, b'{"program": "x", "tests": [{"kind": "sql"}]}', "tests[0].kind"),
        (wire.RUN_PATH, b'{"code": "1", "limits": {"timeout_s": 1000}}', "timeout_s"),
        (wire.RUN_PATH, b'{"code": "1", "limits": {"memory_mb": 1000000}}', "memory_mb"),
        (wire.RUN_PATH, b'{"code": "1", "limits": {"timeout_s": -1}}', "timeout_s"),
        (wire.RUN_PATH, b'{"code": "1", "files": {"../x": "y"}}', "../x"),
        (
            wire.RUN_CODE_PATH,
            b'{"code": "1", "language": "python", "run_timeout": 1e6}',
            "run_timeout",
        ),
        (
            wire.RUN_CODE_PATH,
            b'{"code": "1", "language": "python", "files": {"a": "%%"}}',
            "base64",
        ),
        (
            wire.RUN_CODE_PATH,
            b'{"code": "1", "language": "python", "fetch_files": ["/etc/passwd"]}',
            "/etc/passwd",
        ),
    ],
)
def test_malformed_requests_are_400_naming_the_field(
    url: str, path: str, body: bytes, named: str
) -> None:
    before = health(url)["served"]
    reply = httpx.post(f"{url}{path}", content=body, timeout=30)
    assert reply.status_code == 400, reply.text
    assert named in reply.json()["detail"]
    assert health(url)["served"] == before  # nothing ran


def test_network_is_never_granted(url: str) -> None:
    job = TestJob("print(1)", (IOTest("", "1\n"),), limits=Limits(network=True))
    run = httpx.post(f"{url}{wire.RUN_PATH}", json={"code": "1", "limits": {"network": True}})
    tests = httpx.post(f"{url}{wire.RUN_TESTS_PATH}", json=wire.encode_job(job))
    for reply in (run, tests):
        assert reply.status_code == 400
        assert "network" in reply.json()["detail"]


def test_a_whole_test_set_is_bounded_in_time(sb: Sandbox) -> None:
    settings = ServiceSettings(port=0, workers=1, max_request_s=10)
    tests = tuple(IOTest("", "1\n") for _ in range(5))
    long_job = TestJob("print(1)", tests, per_test_timeout_s=3)  # 15 s at its limits
    with running_service(settings, sb) as address:
        reply = httpx.post(f"{address}{wire.RUN_TESTS_PATH}", json=wire.encode_job(long_job))
        assert reply.status_code == 400 and "per request" in reply.json()["detail"]
        short = TestJob("print(1)", tests[:3], per_test_timeout_s=3)
        assert httpx.post(f"{address}{wire.RUN_TESTS_PATH}", json=wire.encode_job(short)).is_success


def test_token_is_required_and_never_shown(sb: Sandbox) -> None:
    settings = ServiceSettings(port=0, workers=1, token=TOKEN)
    body = {"code": "print('ran')"}
    with running_service(settings, sb) as address:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            reply = httpx.post(f"{address}{wire.RUN_PATH}", json=body, headers=headers)
            assert reply.status_code == 401, headers
            assert reply.headers["WWW-Authenticate"] == "Bearer"
        fusion_reply = httpx.post(
            f"{address}{wire.RUN_CODE_PATH}", json={"code": "1", "language": "python"}
        )
        assert fusion_reply.status_code == 401
        good = httpx.post(
            f"{address}{wire.RUN_PATH}", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert good.status_code == 200 and good.json()["result"]["stdout"] == "ran\n"
        page = httpx.get(f"{address}{wire.HEALTH_PATH}")  # no token needed to read the load
        assert page.status_code == 200 and TOKEN not in page.text
        counts = page.json()
    assert counts["token_required"] is True
    assert counts["refused"] == {"401": 4} and counts["served"] == {wire.RUN_PATH: 1}
    assert TOKEN not in repr(settings)


def test_settings_refuse_a_public_address_without_a_token() -> None:
    with pytest.raises(ValueError, match="without a token"):
        ServiceSettings(host="0.0.0.0")
    with pytest.raises(ValueError, match="without a token"):
        ServiceSettings(host="10.1.2.3")
    assert ServiceSettings(host="0.0.0.0", token=TOKEN).token == TOKEN
    assert ServiceSettings(host="::1").token is None
    with pytest.raises(ValueError, match="network"):
        ServiceSettings(max_limits=Limits(network=True))


def test_health_counts_follow_the_requests(url: str, remote: ServiceSandbox) -> None:
    before = health(url)
    remote.run("print(1)")
    remote.run_tests("print(1)", [IOTest("", "1\n")])
    after = health(url)
    served_before: dict[str, int] = before["served"]  # type: ignore[assignment]
    served_after: dict[str, int] = after["served"]  # type: ignore[assignment]
    assert served_after[wire.RUN_PATH] == served_before.get(wire.RUN_PATH, 0) + 1
    assert served_after[wire.RUN_TESTS_PATH] == served_before.get(wire.RUN_TESTS_PATH, 0) + 1
    assert after["workers"] == 2 and after["version"] == wire.WIRE_VERSION
    assert after["languages"] == list(remote.local.languages) == list(Language)
    assert after["isolation"] == list(remote.isolation)
    assert after["max_limits"] == wire.encode_limits(DEFAULT_MAX_LIMITS)


def test_the_verdict_statuses_survive_the_wire(remote: ServiceSandbox) -> None:
    report = remote.run_tests(
        "def f(x):\n    while x:\n        pass\n    return 1\n",
        [CallTest("assert f(0) == 1"), CallTest("assert f(1) == 1")],
        entry_point="f",
        per_test_timeout_s=1,
    )
    assert [r.status for r in report.results] == [TestStatus.PASSED, TestStatus.TIMEOUT]


def test_the_app_refuses_more_workers_or_larger_defaults_than_it_can_serve(sb: Sandbox) -> None:
    with pytest.raises(ValueError, match="slot servers"):
        build_app(ServiceSettings(workers=sb.workers + 1), sb)
    with pytest.raises(wire.WireError, match="timeout_s"):  # defaults above the ceiling
        build_app(ServiceSettings(max_limits=Limits(timeout_s=1.0)), sb)


def test_a_humaneval_sized_job_is_admitted_by_a_default_service(remote: ServiceSandbox) -> None:
    """The code environments' HumanEval jobs (EvalPlus limits, many tests) fit the default bound.

    A default service once refused every HumanEval problem with 11 or more tests (400): the
    bound counted a restart per test even where ``stop_on_program_failure`` forbids one.
    """
    from sandbox.service import worst_case_s

    tests = tuple(CallTest(f"assert candidate({i}) == {i + 1}") for i in range(14))
    job = TestJob(
        "def inc(x):\n    return x + 1\n", tests, entry_point="inc",
        limits=Limits(timeout_s=58.0), per_test_timeout_s=4.0, stop_on_program_failure=True,
    )  # fmt: skip
    assert worst_case_s(job, Limits()) == 58 + 14 * 4 + 1
    assert ServiceSettings().max_request_s >= worst_case_s(job, Limits())
    partial = TestJob(job.program, tests, "inc", limits=job.limits, per_test_timeout_s=4.0)
    assert worst_case_s(partial, Limits()) == (58 + 4 + 1) * 15  # a restart after each test
    assert ServiceSettings().max_request_s >= worst_case_s(partial, Limits())
    report = remote.run_tests_many([job])[0]
    assert report.all_passed and report.total == 14
