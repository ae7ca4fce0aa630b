r"""Isolated execution of untrusted Python code, with verdicts the code cannot forge.

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
from sandbox.types import (
    ALL_LAYERS,
    MAX_REQUEST_BYTES,
    CallTest,
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
    "ExecResult",
    "IOTest",
    "Job",
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
    "normalize_output",
]
