"""SandboxFusion's /run_code request and response: the official models' fields, strict decoding."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import sandbox_fusion.models as official

from sandbox.fusion import (
    FUSION_LANGUAGES,
    RUNNABLE_LANGUAGES,
    CommandRunResult,
    CommandStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunStatus,
    decode_files,
    decode_run_code_request,
    decode_run_code_response,
    encode_files,
    encode_run_code_request,
    encode_run_code_response,
)
from sandbox.wire import WireError

DATA = Path(__file__).parent / "data" / "fusion"
RECORDED = sorted(p.stem for p in DATA.glob("*.json"))


def test_the_fields_are_the_official_clients_field_for_field() -> None:
    def names(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    # The official client's request model lacks memory_limit_MB; the server has it, verl sends it.
    assert names(RunCodeRequest) == set(official.RunCodeRequest.__fields__) | {"memory_limit_MB"}
    assert names(RunCodeResponse) == set(official.RunCodeResponse.__fields__)
    assert names(CommandRunResult) == set(official.CommandRunResult.__fields__)
    assert {s.value for s in RunStatus} == {s.value for s in official.RunStatus}
    assert {s.value for s in CommandStatus} == {s.value for s in official.CommandRunStatus}
    assert set(FUSION_LANGUAGES) >= set(official.Language.__args__)  # type: ignore[attr-defined]
    assert set(FUSION_LANGUAGES) >= RUNNABLE_LANGUAGES


def test_a_request_with_every_field_survives_json_and_the_official_model_reads_it() -> None:
    request = RunCodeRequest(
        code='#include <cstdio>\nint main(){puts("hi");}',
        language="cpp",
        stdin="1 2\n",
        compile_timeout=20.0,
        run_timeout=2.5,
        memory_limit_MB=512,
        files=encode_files({"data/in.txt": "x\u00e9"}),
        fetch_files=("out.txt",),
    )
    wire = json.loads(json.dumps(encode_run_code_request(request)))
    assert decode_run_code_request(wire) == request
    theirs = official.RunCodeRequest.parse_obj(wire)
    assert (theirs.code, theirs.language, theirs.run_timeout) == (request.code, "cpp", 2.5)
    assert decode_files(dict(request.files)) == {"data/in.txt": "x\u00e9".encode()}


def test_a_minimal_request_takes_sandbox_fusions_defaults() -> None:
    request = decode_run_code_request({"code": "print(1)", "language": "python"})
    assert (request.compile_timeout, request.run_timeout, request.memory_limit_MB) == (10, 10, -1)
    assert (request.stdin, dict(request.files), request.fetch_files) == (None, {}, ())


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_responses_decode_and_reencode_unchanged(name: str) -> None:
    raw = json.loads((DATA / f"{name}.json").read_text())
    response = decode_run_code_response(raw)
    assert encode_run_code_response(response) == raw
    official.RunCodeResponse.parse_obj(raw)  # the recordings are valid for the official client too


def test_recorded_responses_carry_what_their_names_say() -> None:
    def load(name: str) -> RunCodeResponse:
        return decode_run_code_response(json.loads((DATA / f"{name}.json").read_text()))

    assert RECORDED == ["compile_error", "runtime_error", "sandbox_error", "success", "timeout"]
    ok = load("success")
    assert ok.status is RunStatus.SUCCESS and ok.run_result and ok.run_result.stdout == "3\n"
    crashed = load("runtime_error")
    assert crashed.run_result and crashed.run_result.return_code == 1
    slow = load("timeout")
    assert slow.run_result and slow.run_result.status is CommandStatus.TIME_LIMIT_EXCEEDED
    bad = load("compile_error")
    assert bad.run_result is None and bad.compile_result and bad.compile_result.return_code == 1
    broken = load("sandbox_error")
    assert broken.status is RunStatus.SANDBOX_ERROR and "Too many open files" in broken.message


def test_cpu_time_of_the_official_model_is_accepted_and_kept() -> None:
    raw = {"status": "Finished", "execution_time": 0.5, "cpu_time": 0.25, "return_code": 0}
    response = decode_run_code_response(
        {"status": "Success", "message": "", "run_result": raw, "files": {}}
    )
    assert response.run_result == CommandRunResult(
        CommandStatus.FINISHED, execution_time=0.5, return_code=0, cpu_time=0.25
    )
    assert encode_run_code_response(response)["run_result"] == {
        **raw,
        "stdout": None,
        "stderr": None,
    }


@pytest.mark.parametrize(
    ("payload", "names"),
    [
        ([], "request: expected an object"),
        ({"code": "x"}, "missing field(s) ['language']"),
        ({"code": "x", "language": "cobol"}, "request.language: 'cobol' is not"),
        ({"code": 1, "language": "python"}, "request.code: expected a string"),
        ({"code": "", "language": "python", "run_timeout": 0}, "request.run_timeout"),
        ({"code": "", "language": "python", "compile_timeout": "9"}, "request.compile_timeout"),
        ({"code": "", "language": "python", "run_timeout": float("inf")}, "request.run_timeout"),
        ({"code": "", "language": "python", "memory_limit_MB": 1.5}, "request.memory_limit_MB"),
        ({"code": "", "language": "python", "memory_limit_MB": True}, "request.memory_limit_MB"),
        ({"code": "", "language": "python", "stdin": 3}, "request.stdin"),
        ({"code": "", "language": "python", "files": []}, "request.files: expected an object"),
        ({"code": "", "language": "python", "files": {"a": "%%%"}}, "request.files['a']"),
        ({"code": "", "language": "python", "files": {"a": 3}}, "request.files['a']"),
        ({"code": "", "language": "python", "fetch_files": "a"}, "request.fetch_files"),
        ({"code": "", "language": "python", "fetch_files": [1]}, "request.fetch_files[0]"),
        ({"code": "", "language": "python", "timeout": 3}, "unknown field(s) ['timeout']"),
    ],
)
def test_malformed_requests_name_the_field(payload: object, names: str) -> None:
    with pytest.raises(WireError) as caught:
        decode_run_code_request(payload)
    assert names in str(caught.value)


def test_a_null_file_content_is_allowed_in_a_request_as_sandbox_fusion_skips_it() -> None:
    request = decode_run_code_request(
        {"code": "", "language": "bash", "files": {"skip": None, "a": "aGk="}}
    )
    assert decode_files(dict(request.files)) == {"a": b"hi"}


@pytest.mark.parametrize(
    ("payload", "names"),
    [
        ("Success", "response: expected an object"),
        ({"status": "Success"}, "missing field(s) ['message']"),
        ({"status": "Done", "message": ""}, "response.status: 'Done' is not one of"),
        ({"status": "Success", "message": None}, "response.message"),
        ({"status": "Success", "message": "", "run_result": {}}, "response.run_result: missing"),
        (
            {"status": "Failed", "message": "", "run_result": {"status": "Killed"}},
            "response.run_result.status",
        ),
        (
            {"status": "Failed", "message": "", "run_result": {"status": "Finished", "x": 1}},
            "response.run_result: unknown field(s) ['x']",
        ),
        (
            {
                "status": "Failed",
                "message": "",
                "compile_result": {"status": "Finished", "return_code": "1"},
            },
            "response.compile_result.return_code",
        ),
        (
            {
                "status": "Failed",
                "message": "",
                "run_result": {"status": "Finished", "execution_time": "fast"},
            },
            "response.run_result.execution_time",
        ),
        ({"status": "Success", "message": "", "files": {"a": None}}, "response.files['a']"),
        ({"status": "Success", "message": "", "files": {"a": "???"}}, "response.files['a']"),
        ({"status": "Success", "message": "", "executor_pod_name": 7}, "executor_pod_name"),
    ],
)
def test_malformed_responses_name_the_field(payload: object, names: str) -> None:
    with pytest.raises(WireError) as caught:
        decode_run_code_response(payload)
    assert names in str(caught.value)
