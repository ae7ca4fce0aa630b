r"""SandboxFusion's ``/run_code`` request and response, typed and decoded strictly.

SandboxFusion (ByteDance's open-source code sandbox, which verl and others call for code
rewards) runs one program once per ``/run_code`` request. These dataclasses are that request and
its response, field for field (names included, ``memory_limit_MB`` too, so that the JSON keys are
the field names): ``grpo sandbox serve`` answers them, and the remote sandbox client speaks them
to a plain SandboxFusion deployment.

What SandboxFusion's server does with them (its ``run_code`` handler and its runners):

* the run's ``status`` is ``Success`` (every command finished with return code 0), ``Failed``
  (a command timed out or returned non-zero: the compile step of a compiled language, then the
  run, which is skipped when the compile failed) or ``SandboxError`` (the sandbox could not run a
  command, with ``message`` saying why);
* each command's ``status`` is ``Finished`` (it exited; ``return_code`` says how),
  ``TimeLimitExceeded`` (killed at ``compile_timeout``/``run_timeout``) or ``Error`` (the runner
  itself failed: the server then reports ``SandboxError``);
* ``files`` map a path in the work dir to its content in base64, both ways; ``fetch_files`` name
  the files to send back after the run;
* ``memory_limit_MB`` (verl sends it) caps the program's address space; ``-1`` (the default) or
  any value <= 0 is no cap.

The server's ``CommandRunResult`` has no ``cpu_time``; the official client's model does (and
leaves it ``None``), so it is accepted here, optional.

Decoding is strict, as in ``sandbox.wire``: an unknown key, a missing required key, a wrong type,
a status or language SandboxFusion does not know, or a file that is not base64 raise
``sandbox.wire.WireError`` naming the field.

>>> request = RunCodeRequest(code="print(input())", language="python", stdin="hi\n")
>>> decode_run_code_request(encode_run_code_request(request)) == request
True
>>> decode_run_code_response({"status": "Success", "message": "", "colour": "red"})
Traceback (most recent call last):
...
sandbox.wire.WireError: response: unknown field(s) ['colour']
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, cast, get_args

from sandbox.wire import (
    WireError,
    expect_enum,
    expect_int,
    expect_number,
    expect_object,
    expect_str,
)

#: Every language (execution mode) SandboxFusion's server or its official client names; a
#: request for another is refused. Which of them a given service runs is its own: see
#: ``RUNNABLE_LANGUAGES`` for ours.
FusionLanguage = Literal[
    "python",
    "python2",
    "cpp",
    "nodejs",
    "go",
    "go_test",
    "java",
    "php",
    "csharp",
    "bash",
    "typescript",
    "sql",
    "rust",
    "cuda",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "pytest",
    "junit",
    "kotlin_script",
    "jest",
    "verilog",
    "python_gpu",
    "lean",
    "swift",
    "racket",
    "gtest",
    "react",
]
#: ``FusionLanguage``'s names, in order.
FUSION_LANGUAGES: tuple[str, ...] = get_args(FusionLanguage)
#: The languages grpo-kit's own sandbox runs; the others are names SandboxFusion knows.
RUNNABLE_LANGUAGES: frozenset[str] = frozenset({"python", "cpp", "java", "nodejs", "rust", "bash"})


class RunStatus(StrEnum):
    """How a whole ``/run_code`` request ended."""

    SUCCESS = "Success"  # every command finished with return code 0
    FAILED = "Failed"  # a command timed out or returned non-zero (the compile, else the run)
    SANDBOX_ERROR = "SandboxError"  # the sandbox could not run a command; ``message`` says why


class CommandStatus(StrEnum):
    """How one command (the compile step or the run) ended."""

    FINISHED = "Finished"  # it exited; ``return_code`` says how
    ERROR = "Error"  # the runner failed to run it (the server then answers ``SandboxError``)
    TIME_LIMIT_EXCEEDED = "TimeLimitExceeded"  # killed at its time limit


@dataclass(frozen=True)
class CommandRunResult:
    """One command's result (SandboxFusion's ``CommandRunResult``).

    Every field but ``status`` may be absent (``None``).
    """

    status: CommandStatus
    execution_time: float | None = None
    """Wall-clock seconds."""
    return_code: int | None = None
    """The exit status (negative: killed by that signal); ``None`` when it did not exit."""
    stdout: str | None = None
    stderr: str | None = None
    cpu_time: float | None = None
    """Only in the official client's model; the server does not send it."""


@dataclass(frozen=True)
class RunCodeRequest:
    """A ``/run_code`` request: run ``code`` once as ``language`` with ``stdin``."""

    code: str
    language: FusionLanguage
    stdin: str | None = None
    compile_timeout: float = 10.0
    """Seconds for the compile step of a compiled language (SandboxFusion's default: 10)."""
    run_timeout: float = 10.0
    """Seconds for the run (SandboxFusion's default: 10)."""
    memory_limit_MB: int = -1  # SandboxFusion's spelling: the JSON key is the field name
    """Address-space cap of the program in MiB; <= 0 (the default, -1) is no cap."""
    files: Mapping[str, str | None] = field(default_factory=dict)
    """Work-dir path -> content in base64 (``encode_files``); a ``None`` content is skipped."""
    fetch_files: tuple[str, ...] = ()
    """Work-dir paths whose content the response's ``files`` bring back."""


@dataclass(frozen=True)
class RunCodeResponse:
    """A ``/run_code`` response."""

    status: RunStatus
    message: str
    """Why, for ``SandboxError``; empty otherwise."""
    compile_result: CommandRunResult | None = None
    """The compile step (compiled languages only)."""
    run_result: CommandRunResult | None = None
    """The run; ``None`` when the compile step failed or the sandbox could not start it."""
    executor_pod_name: str | None = None
    files: Mapping[str, str] = field(default_factory=dict)
    """The fetched files: path -> content in base64."""


def encode_files(files: Mapping[str, str]) -> dict[str, str]:
    """Text files (path -> text) as ``RunCodeRequest.files`` wants them (path -> UTF-8 base64).

    >>> encode_files({"a.txt": "hi"})
    {'a.txt': 'aGk='}
    """
    return {path: base64.b64encode(text.encode()).decode("ascii") for path, text in files.items()}


def decode_files(files: Mapping[str, str | None], where: str = "files") -> dict[str, bytes]:
    """Base64 contents back to bytes (``None`` contents are left out); ``WireError`` if not base64.

    >>> decode_files({"a.txt": "aGk=", "b": None})
    {'a.txt': b'hi'}
    """
    out: dict[str, bytes] = {}
    for path, content in files.items():
        if content is None:
            continue
        try:
            out[path] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise WireError(f"{where}[{path!r}]: not base64") from None
    return out


# -- strict decoding ---------------------------------------------------------------------------


def _optional_str(value: object, where: str) -> str | None:
    return None if value is None else expect_str(value, where)


def _number(value: object, where: str, *, positive: bool = False) -> float:
    number = expect_number(value, where)
    if positive and not number > 0:
        raise WireError(f"{where}: expected a number of seconds > 0, got {value!r}")
    return number


def _optional_number(value: object, where: str) -> float | None:
    return None if value is None else _number(value, where)


def _optional_int(value: object, where: str) -> int | None:
    return None if value is None else expect_int(value, where)


def _str_map(value: object, where: str, *, nullable: bool) -> dict[str, str | None]:
    if not isinstance(value, Mapping):
        raise WireError(f"{where}: expected an object, got {type(value).__name__}")
    out: dict[str, str | None] = {}
    for key, item in value.items():
        here = f"{where}[{key!r}]"
        key = expect_str(key, f"{where} key")
        out[key] = _optional_str(item, here) if nullable else expect_str(item, here)
    return out


def _str_list(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected a list, got {type(value).__name__}")
    return tuple(expect_str(item, f"{where}[{i}]") for i, item in enumerate(value))


_REQUEST_FIELDS = {
    "code",
    "language",
    "stdin",
    "compile_timeout",
    "run_timeout",
    "memory_limit_MB",
    "files",
    "fetch_files",
}
_COMMAND_FIELDS = {"status", "execution_time", "return_code", "stdout", "stderr", "cpu_time"}
_RESPONSE_FIELDS = {
    "status",
    "message",
    "compile_result",
    "run_result",
    "executor_pod_name",
    "files",
}


def encode_run_code_request(request: RunCodeRequest) -> dict[str, object]:
    """Return ``request`` as SandboxFusion's JSON object (every field)."""
    return {
        "code": request.code,
        "language": request.language,
        "stdin": request.stdin,
        "compile_timeout": request.compile_timeout,
        "run_timeout": request.run_timeout,
        "memory_limit_MB": request.memory_limit_MB,
        "files": dict(request.files),
        "fetch_files": list(request.fetch_files),
    }


def decode_run_code_request(value: object, where: str = "request") -> RunCodeRequest:
    """Inverse of ``encode_run_code_request``: omitted fields take SandboxFusion's defaults.

    ``WireError`` names the field: an unknown language, a time limit that is not a positive
    number, a file content that is not base64, an unknown key.
    """
    data = expect_object(value, where, _REQUEST_FIELDS, {"code", "language"})
    language = expect_str(data["language"], f"{where}.language")
    if language not in FUSION_LANGUAGES:
        raise WireError(
            f"{where}.language: {language!r} is not a SandboxFusion language; "
            f"known: {list(FUSION_LANGUAGES)}"
        )
    files = _str_map(data.get("files", {}), f"{where}.files", nullable=True)
    decode_files(files, f"{where}.files")  # refuse what is not base64 here, naming the file
    return RunCodeRequest(
        code=expect_str(data["code"], f"{where}.code"),
        language=cast(FusionLanguage, language),
        stdin=_optional_str(data.get("stdin"), f"{where}.stdin"),
        compile_timeout=_number(
            data.get("compile_timeout", 10.0), f"{where}.compile_timeout", positive=True
        ),
        run_timeout=_number(data.get("run_timeout", 10.0), f"{where}.run_timeout", positive=True),
        memory_limit_MB=expect_int(data.get("memory_limit_MB", -1), f"{where}.memory_limit_MB"),
        files=files,
        fetch_files=_str_list(data.get("fetch_files", []), f"{where}.fetch_files"),
    )


def encode_command_result(result: CommandRunResult) -> dict[str, object]:
    """Return ``result`` as a JSON object; ``cpu_time`` only when known (the server omits it)."""
    data: dict[str, object] = {
        "status": result.status.value,
        "execution_time": result.execution_time,
        "return_code": result.return_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
    if result.cpu_time is not None:
        data["cpu_time"] = result.cpu_time
    return data


def decode_command_result(value: object, where: str = "command") -> CommandRunResult:
    """Inverse of ``encode_command_result``."""
    data = expect_object(value, where, _COMMAND_FIELDS, {"status"})
    return CommandRunResult(
        status=expect_enum(CommandStatus, data["status"], f"{where}.status"),
        execution_time=_optional_number(data.get("execution_time"), f"{where}.execution_time"),
        return_code=_optional_int(data.get("return_code"), f"{where}.return_code"),
        stdout=_optional_str(data.get("stdout"), f"{where}.stdout"),
        stderr=_optional_str(data.get("stderr"), f"{where}.stderr"),
        cpu_time=_optional_number(data.get("cpu_time"), f"{where}.cpu_time"),
    )


def encode_run_code_response(response: RunCodeResponse) -> dict[str, object]:
    """Return ``response`` as SandboxFusion's JSON object (every field)."""
    return {
        "status": response.status.value,
        "message": response.message,
        "compile_result": None
        if response.compile_result is None
        else encode_command_result(response.compile_result),
        "run_result": None
        if response.run_result is None
        else encode_command_result(response.run_result),
        "executor_pod_name": response.executor_pod_name,
        "files": dict(response.files),
    }


def decode_run_code_response(value: object, where: str = "response") -> RunCodeResponse:
    """Inverse of ``encode_run_code_response``: the client's check of a server's reply."""
    data = expect_object(value, where, _RESPONSE_FIELDS, {"status", "message"})
    compile_raw, run_raw = data.get("compile_result"), data.get("run_result")
    files = _str_map(data.get("files", {}), f"{where}.files", nullable=False)
    decode_files(files, f"{where}.files")
    return RunCodeResponse(
        status=expect_enum(RunStatus, data["status"], f"{where}.status"),
        message=expect_str(data["message"], f"{where}.message"),
        compile_result=None
        if compile_raw is None
        else decode_command_result(compile_raw, f"{where}.compile_result"),
        run_result=None
        if run_raw is None
        else decode_command_result(run_raw, f"{where}.run_result"),
        executor_pod_name=_optional_str(
            data.get("executor_pod_name"), f"{where}.executor_pod_name"
        ),
        files={k: v for k, v in files.items() if v is not None},
    )
