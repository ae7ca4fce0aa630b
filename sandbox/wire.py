r"""The JSON form of test jobs and reports: what ``grpo sandbox serve``'s batch endpoint speaks.

The batch endpoint's request carries one ``TestJob`` (a completion's program and its whole test
set); its reply carries the ``TestReport`` the service's sandbox decided, outside the candidate's
process, as the local sandbox does. The single-run endpoint carries one ``Job`` and its
``ExecResult``. Both sides use these functions, so a field added to the dataclasses is added here
once.

Decoding is strict: the text comes from the network. An unknown key, a wrong type, a status the
enum does not know or limits that ``Limits`` refuses raise ``WireError`` naming the field (the
service answers 400 with that message), never a ``KeyError`` deep inside.

>>> from sandbox.types import IOTest, TestJob
>>> job = TestJob(program="print(input())", tests=(IOTest("1\n", "1\n"),))
>>> decode_job(encode_job(job)) == job
True
>>> decode_job({"program": "x", "tests": [], "colour": "red"})
Traceback (most recent call last):
...
sandbox.wire.WireError: job: unknown field(s) ['colour']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from sandbox.types import (
    CallTest,
    CompileResult,
    ExecResult,
    IOTest,
    Job,
    Limits,
    Status,
    TestJob,
    TestReport,
    TestResult,
    TestStatus,
)

#: Version of the batch protocol; the service reports it at ``/health`` and in every reply.
WIRE_VERSION = 1
#: The batch endpoint: one ``TestJob`` in, one ``TestReport`` out.
RUN_TESTS_PATH = "/v1/run_tests"
#: The single-run endpoint: one ``Job`` in, one ``ExecResult`` out.
RUN_PATH = "/v1/run"
#: Health and load: status, workers, requests in flight and served, languages, isolation.
HEALTH_PATH = "/health"
#: SandboxFusion's single-run endpoint (its request and response, field for field).
RUN_CODE_PATH = "/run_code"

_E = TypeVar("_E", bound=StrEnum)


class WireError(ValueError):
    """A request or reply that does not have the protocol's shape; the message names the field."""


def expect_object(
    value: object, where: str, allowed: set[str], required: set[str]
) -> Mapping[str, object]:
    """Return ``value`` as a JSON object with only ``allowed`` and every ``required`` key.

    This and the other ``expect_*`` checks are shared with ``sandbox.fusion``'s decoders.
    """
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise WireError(f"{where}: expected an object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise WireError(f"{where}: unknown field(s) {unknown}")
    missing = sorted(required - set(value))
    if missing:
        raise WireError(f"{where}: missing field(s) {missing}")
    return value


def expect_str(value: object, where: str) -> str:
    """Return ``value`` if it is a string, else raise ``WireError`` naming ``where``."""
    if not isinstance(value, str):
        raise WireError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def expect_bool(value: object, where: str) -> bool:
    """Return ``value`` if it is true or false."""
    if not isinstance(value, bool):
        raise WireError(f"{where}: expected true or false, got {type(value).__name__}")
    return value


def expect_number(value: object, where: str) -> float:
    """Return ``value`` as a float if it is a finite number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WireError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def expect_enum(kind: type[_E], value: object, where: str) -> _E:
    """Return the member of ``kind`` whose value ``value`` is (the message lists them)."""
    try:
        return kind(expect_str(value, where))
    except ValueError:
        valid = [m.value for m in kind]
        raise WireError(f"{where}: {value!r} is not one of {valid}") from None


def encode_limits(limits: Limits) -> dict[str, object]:
    """Return ``limits`` as a JSON object (every field, ``cpu_s`` may be null)."""
    return dataclasses.asdict(limits)


def decode_limits(value: object, where: str = "limits") -> Limits:
    """Inverse of ``encode_limits``; omitted fields take ``Limits``' defaults."""
    names = {f.name for f in dataclasses.fields(Limits)}
    data = expect_object(value, where, names, set())
    try:
        return Limits(**data)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise WireError(f"{where}: {exc}") from None


_JOB_FIELDS = {f.name for f in dataclasses.fields(TestJob)}


def encode_job(job: TestJob) -> dict[str, object]:
    """Return ``job`` as a JSON object; each test is tagged with its kind."""
    data: dict[str, object] = {}
    for field in dataclasses.fields(TestJob):
        value = getattr(job, field.name)
        if field.name == "tests":
            value = [_encode_test(t) for t in value]
        elif field.name == "limits" and value is not None:
            value = encode_limits(value)
        data[field.name] = value
    return data


def _encode_test(test: CallTest | IOTest) -> dict[str, object]:
    if isinstance(test, CallTest):
        return {"kind": "call", "source": test.source, "name": test.name}
    return {
        "kind": "io",
        "stdin": test.stdin,
        "expected_stdout": test.expected_stdout,
        "name": test.name,
    }


def _decode_test(value: object, where: str) -> CallTest | IOTest:
    data = expect_object(
        value, where, {"kind", "source", "stdin", "expected_stdout", "name"}, {"kind"}
    )
    kind = data["kind"]
    name = expect_str(data.get("name", ""), f"{where}.name")
    if kind == "call":
        expect_object(data, where, {"kind", "source", "name"}, {"source"})
        return CallTest(expect_str(data["source"], f"{where}.source"), name)
    if kind == "io":
        expect_object(
            data, where, {"kind", "stdin", "expected_stdout", "name"}, {"expected_stdout"}
        )
        stdin = expect_str(data.get("stdin", ""), f"{where}.stdin")
        return IOTest(stdin, expect_str(data["expected_stdout"], f"{where}.expected_stdout"), name)
    raise WireError(f"{where}.kind: {kind!r} is not 'call' or 'io'")


def decode_job(value: object, where: str = "job") -> TestJob:
    """Inverse of ``encode_job``: a ``TestJob``, or ``WireError`` naming what is wrong.

    Only the shape is checked here; what the sandbox itself refuses (mixed test kinds, sizes)
    is its ``run_tests`` validation's to say.
    """
    data = expect_object(value, where, _JOB_FIELDS, {"program", "tests"})
    raw_tests = data["tests"]
    if not isinstance(raw_tests, list):
        raise WireError(f"{where}.tests: expected a list, got {type(raw_tests).__name__}")
    tests = tuple(_decode_test(t, f"{where}.tests[{i}]") for i, t in enumerate(raw_tests))
    kwargs: dict[str, object] = {
        "program": expect_str(data["program"], f"{where}.program"),
        "tests": tests,
    }
    for name in _JOB_FIELDS - {"program", "tests"}:
        if name not in data or data[name] is None:
            continue
        raw, here = data[name], f"{where}.{name}"
        if name == "limits":
            kwargs[name] = decode_limits(raw, here)
        elif name.endswith("_s"):  # per_test_timeout_s and any later duration
            kwargs[name] = expect_number(raw, here)
        elif name.startswith("stop_on_"):
            kwargs[name] = expect_bool(raw, here)
        else:  # entry_point, setup and any later text field
            kwargs[name] = expect_str(raw, here)
    try:
        return TestJob(**kwargs)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise WireError(f"{where}: {exc}") from None


def encode_report(report: TestReport) -> dict[str, object]:
    """Return ``report`` as a JSON object (statuses by value)."""
    return {
        "results": [
            {"name": r.name, "status": r.status.value, "detail": r.detail} for r in report.results
        ],
        "status": report.status.value,
        "wall_s": report.wall_s,
        "isolation": list(report.isolation),
        "stdout": report.stdout,
        "stderr": report.stderr,
        "compile": encode_compile(report.compile),
    }


def encode_compile(result: CompileResult | None) -> dict[str, object] | None:
    """Return a compile step's result as a JSON object (null for languages without one)."""
    if result is None:
        return None
    return {**dataclasses.asdict(result), "status": result.status.value}


def decode_compile(value: object, where: str = "compile") -> CompileResult | None:
    """Inverse of ``encode_compile``."""
    if value is None:
        return None
    fields = {"status", "stdout", "stderr", "exit_code", "wall_s"}
    data = expect_object(value, where, fields, fields)
    return CompileResult(
        status=expect_enum(Status, data["status"], f"{where}.status"),
        stdout=expect_str(data["stdout"], f"{where}.stdout"),
        stderr=expect_str(data["stderr"], f"{where}.stderr"),
        exit_code=_exit_code(data["exit_code"], f"{where}.exit_code"),
        wall_s=expect_number(data["wall_s"], f"{where}.wall_s"),
    )


def expect_int(value: object, where: str) -> int:
    """Return ``value`` if it is an integer (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{where}: expected an integer, got {value!r}")
    return value


def _exit_code(value: object, where: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise WireError(f"{where}: expected an integer or null, got {value!r}")
    return value


def decode_report(value: object, where: str = "report") -> TestReport:
    """Inverse of ``encode_report``: the client's check of what a service sent back."""
    fields = {"results", "status", "wall_s", "isolation", "stdout", "stderr", "compile"}
    data = expect_object(value, where, fields, {"results", "status", "wall_s", "isolation"})
    raw_results, raw_layers = data["results"], data["isolation"]
    if not isinstance(raw_results, list):
        raise WireError(f"{where}.results: expected a list")
    if not isinstance(raw_layers, list):
        raise WireError(f"{where}.isolation: expected a list")
    results = []
    for i, raw in enumerate(raw_results):
        here = f"{where}.results[{i}]"
        item = expect_object(raw, here, {"name", "status", "detail"}, {"name", "status"})
        results.append(
            TestResult(
                expect_str(item["name"], f"{here}.name"),
                expect_enum(TestStatus, item["status"], f"{here}.status"),
                expect_str(item.get("detail", ""), f"{here}.detail"),
            )
        )
    return TestReport(
        results=tuple(results),
        status=expect_enum(Status, data["status"], f"{where}.status"),
        wall_s=expect_number(data["wall_s"], f"{where}.wall_s"),
        isolation=tuple(expect_str(x, f"{where}.isolation") for x in raw_layers),
        stdout=expect_str(data.get("stdout", ""), f"{where}.stdout"),
        stderr=expect_str(data.get("stderr", ""), f"{where}.stderr"),
        compile=decode_compile(data.get("compile"), f"{where}.compile"),
    )


_RUN_FIELDS = {f.name for f in dataclasses.fields(Job)}


def encode_run(job: Job) -> dict[str, object]:
    """Return a single run (``Sandbox.run``'s arguments) as a JSON object."""
    data: dict[str, object] = {}
    for field in dataclasses.fields(Job):
        value = getattr(job, field.name)
        if field.name == "limits" and value is not None:
            value = encode_limits(value)
        data[field.name] = value
    return data


def decode_run(value: object, where: str = "run") -> Job:
    """Inverse of ``encode_run``: a ``Job``, or ``WireError`` naming what is wrong."""
    data = expect_object(value, where, _RUN_FIELDS, {"code"})
    kwargs: dict[str, object] = {"code": expect_str(data["code"], f"{where}.code")}
    for name in _RUN_FIELDS - {"code"}:
        if name not in data or data[name] is None:
            continue
        raw, here = data[name], f"{where}.{name}"
        if name == "limits":
            kwargs[name] = decode_limits(raw, here)
        elif name == "files":
            if not isinstance(raw, Mapping):
                raise WireError(f"{here}: expected an object, got {type(raw).__name__}")
            kwargs[name] = {
                expect_str(k, f"{here} key"): expect_str(v, f"{here}[{k!r}]")
                for k, v in raw.items()
            }
        elif name.endswith("_s"):
            kwargs[name] = expect_number(raw, here)
        else:  # stdin and any later text field
            kwargs[name] = expect_str(raw, here)
    try:
        return Job(**kwargs)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise WireError(f"{where}: {exc}") from None


def encode_exec_result(result: ExecResult) -> dict[str, object]:
    """Return ``result`` as a JSON object (the status by value)."""
    data = dataclasses.asdict(result)
    data["status"] = result.status.value
    data["isolation"] = list(result.isolation)
    data["compile"] = encode_compile(result.compile)
    return data


def decode_exec_result(value: object, where: str = "result") -> ExecResult:
    """Inverse of ``encode_exec_result``: the client's check of a single run's reply."""
    names = {f.name for f in dataclasses.fields(ExecResult)}
    required = {"status", "stdout", "stderr", "exit_code", "wall_s", "isolation"}
    data = expect_object(value, where, names, required)
    layers = data["isolation"]
    if not isinstance(layers, list):
        raise WireError(f"{where}.isolation: expected a list")
    return ExecResult(
        status=expect_enum(Status, data["status"], f"{where}.status"),
        stdout=expect_str(data["stdout"], f"{where}.stdout"),
        stderr=expect_str(data["stderr"], f"{where}.stderr"),
        exit_code=_exit_code(data["exit_code"], f"{where}.exit_code"),
        wall_s=expect_number(data["wall_s"], f"{where}.wall_s"),
        isolation=tuple(expect_str(x, f"{where}.isolation") for x in layers),
        truncated=expect_bool(data.get("truncated", False), f"{where}.truncated"),
        detail=expect_str(data.get("detail", ""), f"{where}.detail"),
        compile=decode_compile(data.get("compile"), f"{where}.compile"),
    )
