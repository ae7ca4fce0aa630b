"""CI's skip policy: with ``GRPO_FAIL_ON_SKIP=1`` a skip is a failure unless its reason is allowed.

A skipped test checks nothing, and a run stays green around it: an optional package that went
missing (``importorskip``), a sandbox layer the host lacks, a tool not on PATH. CI (``.ci/run``)
sets the variable, so a skip whose reason matches no entry of ``ALLOWED_SKIPS`` fails the session
and the summary lists each one (test id and reason). Without the variable nothing changes: a
developer's machine may lack what CI installs.

The policy runs where the reports arrive: in the one pytest process, or on pytest-xdist's
controller, which receives every worker's test and collection reports (its workers do not judge).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import pytest

#: The environment variable that turns unexpected skips into a failed session.
FAIL_ON_SKIP = "GRPO_FAIL_ON_SKIP"


@dataclass(frozen=True)
class AllowedSkip:
    """A skip reason CI accepts: ``pattern`` is searched in the reason; ``why`` says why."""

    pattern: re.Pattern[str]
    why: str


#: Kept tiny on purpose: each entry is a class of tests CI cannot run, never a missing package.
ALLOWED_SKIPS = (
    # CI's machine has no GPU. This matches the tests that need CUDA, and the CPU-build tests
    # that step aside where a GPU is (their reasons name CUDA or the GPU so that they match).
    AllowedSkip(re.compile(r"\bCUDA\b|\bGPUs?\b"), "hardware: needs, or steps aside for, a GPU"),
)


@dataclass(frozen=True)
class Skip:
    """One skipped test (or collected module), as the summary lists it."""

    nodeid: str
    reason: str


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason a skipped report gives, without pytest's ``Skipped: `` prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def is_allowed(reason: str, allowed: tuple[AllowedSkip, ...] = ALLOWED_SKIPS) -> bool:
    """Whether ``reason`` matches an allowed skip.

    >>> is_allowed("needs CUDA"), is_allowed("trl not installed")
    (True, False)
    """
    return any(entry.pattern.search(reason) for entry in allowed)


class SkipPolicy:
    """A pytest plugin: notes the skips outside ``allowed`` and fails the session on them."""

    def __init__(self, allowed: tuple[AllowedSkip, ...] = ALLOWED_SKIPS) -> None:
        self.allowed = allowed
        self.unexpected: dict[str, Skip] = {}

    def _note(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        # An xfail is reported as skipped too (with ``wasxfail``): xfail_strict judges those.
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        reason = skip_reason(report)
        if not is_allowed(reason, self.allowed):
            self.unexpected.setdefault(report.nodeid, Skip(report.nodeid, reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)  # a module-level importorskip skips the whole module at collection

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        ok = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.unexpected and session.exitstatus in ok:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.unexpected:
            return
        terminalreporter.section(f"unexpected skips ({FAIL_ON_SKIP}=1)", sep="=", red=True)
        for skip in self.unexpected.values():
            terminalreporter.line(f"UNEXPECTED SKIP {skip.nodeid}: {skip.reason}")
        terminalreporter.line(
            f"{len(self.unexpected)} test(s) skipped for a reason outside "
            "tests/skip_policy.py's ALLOWED_SKIPS: make them run (install what they need), "
            "or allow the reason there with a comment saying why."
        )


def install(config: pytest.Config) -> None:
    """Register the policy when ``GRPO_FAIL_ON_SKIP=1``, on the process that gets the reports."""
    if os.environ.get(FAIL_ON_SKIP) != "1" or hasattr(config, "workerinput"):
        return  # off, or an xdist worker: its reports go to the controller, which judges them
    config.pluginmanager.register(SkipPolicy(), "grpo_skip_policy")
