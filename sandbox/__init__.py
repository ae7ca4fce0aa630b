r"""Isolated execution of untrusted code, with verdicts the code cannot forge.

Languages: Python, C++, Java, Node.js, Rust and bash (``Sandbox.run(..., language="cpp")``).

Quick use::

    from sandbox import Sandbox, CallTest

    with Sandbox() as sb:
        print(sb.run("print(1 + 1)").stdout)  # "2\\n"
        report = sb.run_tests(
            "def add(a, b): return a + b",
            [CallTest("assert candidate(1, 2) == 3")],
            entry_point="add",
        )
        assert report.all_passed

See ``sandbox/README.md`` for the design, the isolation layers and the threat model.
"""

from sandbox._codec import CandidateError
from sandbox.core import Sandbox, normalize_output
from sandbox.languages import (
    Language,
    LanguageUnavailableError,
    Toolchain,
    available_languages,
    require_language,
)
from sandbox.types import (
    ALL_LAYERS,
    MAX_REQUEST_BYTES,
    CallTest,
    CompileResult,
    ExecResult,
    IOTest,
    Job,
    Limits,
    SandboxClosedError,
    SandboxForkedError,
    SandboxUnavailableError,
    Status,
    TestJob,
    TestReport,
    TestResult,
    TestStatus,
)

__all__ = [
    "ALL_LAYERS",
    "MAX_REQUEST_BYTES",
    "CallTest",
    "CandidateError",
    "CompileResult",
    "ExecResult",
    "IOTest",
    "Job",
    "Language",
    "LanguageUnavailableError",
    "Limits",
    "Sandbox",
    "SandboxClosedError",
    "SandboxForkedError",
    "SandboxUnavailableError",
    "Status",
    "TestJob",
    "TestReport",
    "TestResult",
    "TestStatus",
    "Toolchain",
    "available_languages",
    "normalize_output",
    "require_language",
]
