"""The library side of runs in other languages: a run's inputs, and how a compile ended.

``sandbox.core.Sandbox`` drives the runs (a compile run, then a run of what it built per
test); this module holds what turns their results into the typed outcome of a compiled
language: ``COMPILE_ERROR`` with the compiler's message, the compile step's own status, and the
``MEMORY`` a runtime reports on its stderr.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sandbox import languages
from sandbox.languages import Toolchain
from sandbox.types import (
    CompileResult,
    ExecResult,
    IOTest,
    Limits,
    Status,
    TestReport,
    TestResult,
    TestStatus,
)


@dataclass(frozen=True)
class LanguageRun:
    """A validated run of a program in a language other than Python (compiled per run)."""

    toolchain: Toolchain
    code: str
    stdin: str
    files: dict[str, str]
    limits: Limits
    compile_timeout_s: float


def compile_error_report(tests: list[IOTest], failed: ExecResult, wall_s: float) -> TestReport:
    """Mark every test ``COMPILE_ERROR`` (the program never ran), with the compiler's message."""
    detail = failed.detail[:1000]
    return TestReport(
        results=tuple(
            TestResult(test.name or f"test_{i}", TestStatus.COMPILE_ERROR, detail)
            for i, test in enumerate(tests)
        ),
        status=Status.COMPILE_ERROR,
        wall_s=wall_s,
        isolation=failed.isolation,
        stderr=failed.stderr[: 64 << 10],
        compile=failed.compile,
    )


def compile_failure(res: ExecResult, no_artifact: bool, timeout_s: float) -> tuple[Status, str]:
    """Return the compile status and a detail, for a compile run that produced no program."""
    if res.status is Status.OK and no_artifact:
        return Status.SANDBOX_ERROR, "the compile run printed no program"
    if res.status is Status.RUNTIME_ERROR and res.exit_code == languages.COMPILE_TIMEOUT_EXIT:
        return Status.TIMEOUT, f"compile: the compiler reached its CPU limit ({timeout_s:g} s)"
    if res.status is Status.RUNTIME_ERROR:
        return Status.COMPILE_ERROR, "compile error: " + _first_lines(res.stderr)
    if res.status is Status.OUTPUT_LIMIT:
        return Status.OUTPUT_LIMIT, (
            f"compile: the compiled program is over {languages.ARTIFACT_MAX_BYTES} bytes"
        )
    if res.status is Status.KILLED:
        return Status.COMPILE_ERROR, f"compile: {res.detail}"
    return res.status, f"compile: {res.detail or res.status.value}"


def _first_lines(text: str, limit: int = 1000) -> str:
    """Return the start of a compiler's message (its first errors say the most)."""
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " [...]"


def too_large(exc: ValueError, compile_result: CompileResult | None) -> ExecResult:
    """Return the result of a compiled program too large to run with its input files."""
    return ExecResult(
        status=Status.COMPILE_ERROR,
        stdout="",
        stderr="",
        exit_code=None,
        wall_s=0.0,
        isolation=(),
        detail=f"the compiled program does not fit in the run: {exc}",
        compile=compile_result,
    )


def memory_status(res: ExecResult, toolchain: Toolchain) -> ExecResult:
    """``MEMORY`` for a run that died saying its runtime ran out of memory (its own stderr).

    Like Python's final ``MemoryError`` line, this reads the program's own stderr: a program
    can only turn one failure into another this way.
    """
    if res.status not in (Status.RUNTIME_ERROR, Status.KILLED) or not toolchain.memory_markers:
        return res
    tail = res.stderr[-4096:]
    for marker in toolchain.memory_markers:
        if marker in tail:
            return dataclasses.replace(
                res, status=Status.MEMORY, detail=f"out of memory ({marker}; {res.detail})"
            )
    return res
