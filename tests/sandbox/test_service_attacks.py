"""The adversarial suites of ``test_attacks.py`` and ``test_language_attacks.py`` (C++, Java,
Node.js, Rust, bash) again, every run posted through the service.

Each attack test there that takes the shared Sandbox (``sb``) runs here unchanged against
``ServiceSandbox``: its ``run``/``run_many`` post to ``/v1/run`` and its ``run_tests`` to
``/v1/run_tests``, so the same assertions hold of what a remote caller gets. The service runs in
this process (a thread), so the attacks that signal "the harness" aim at the service itself; the
autouse ``no_leftovers`` fixture checks the host after each one, as there.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator

import pytest
import test_attacks
import test_language_attacks
from service_helpers import ServiceSandbox, running_service

from sandbox import CallTest, Sandbox, TestJob, TestStatus
from sandbox.service import DEFAULT_MAX_LIMITS, ServiceSettings

#: The attack tests that take only the shared Sandbox (and the canary file); the others make
#: Sandboxes of their own, which the service does not change.
ATTACKS: dict[str, Callable[..., None]] = {
    name: fn
    for name, fn in vars(test_attacks).items()
    if name.startswith("test_")
    and callable(fn)
    and "sb" in inspect.signature(fn).parameters
    and set(inspect.signature(fn).parameters) <= {"sb", "canary"}
}

#: The other languages' attacks: each takes the shared Sandbox and a language (parametrized).
LANGUAGE_ATTACKS: dict[str, Callable[..., None]] = {
    name: fn
    for name, fn in vars(test_language_attacks).items()
    if name.startswith("test_")
    and callable(fn)
    and set(inspect.signature(fn).parameters) <= {"sb", "language"}
}
LANGUAGE_CASES = [
    (name, value)
    for name, fn in LANGUAGE_ATTACKS.items()
    for mark in getattr(fn, "pytestmark", [])
    if mark.name == "parametrize"
    for value in mark.args[1]
]


@pytest.fixture(scope="module")
def remote(sb: Sandbox) -> Iterator[ServiceSandbox]:
    # A ceiling above every limit the attacks ask for (/dev/shm filling asks max_file_mb=512).
    ceiling = dataclasses.replace(DEFAULT_MAX_LIMITS, max_file_mb=1024)
    with running_service(ServiceSettings(port=0, workers=2, max_limits=ceiling), sb) as url:
        client = ServiceSandbox(url, sb)
        yield client
        client.close()


def test_the_suite_is_the_attack_table() -> None:
    assert len(ATTACKS) >= 15, sorted(ATTACKS)
    assert "test_fork_bomb_is_bounded" in ATTACKS
    assert "test_writes_and_deletes_outside_workdir_fail" in ATTACKS  # takes the canary too


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attack_through_the_service(
    attack: str, remote: ServiceSandbox, request: pytest.FixtureRequest
) -> None:
    fn = ATTACKS[attack]
    kwargs: dict[str, object] = {"sb": remote}
    if "canary" in inspect.signature(fn).parameters:
        kwargs["canary"] = request.getfixturevalue("canary")
    fn(**kwargs)


def test_verdict_forgeries_through_run_tests(sb: Sandbox, remote: ServiceSandbox) -> None:
    """Programs that try to pass without solving: judged failed remotely as locally."""
    tests = (CallTest("assert candidate(2) == 4"), CallTest("assert candidate(3) == 9"))
    forgers = [
        "import sys\nprint('PASSED')\nsys.exit(0)\n",  # no function: every test fails
        "def square(x):\n    raise SystemExit(0)\n",  # exits cleanly inside the call
        "class Any(int):\n    def __eq__(self, o):\n        return True\n"
        "def square(x):\n    return Any(0)\n",  # a subclass reduced to its base value: 0
        "def square(x):\n    raise StopIteration\n",  # would end a loop in the test quietly
        "import os\ndef square(x):\n    os.kill(os.getppid(), 9)\n",  # kills its supervisor
    ]
    jobs = [TestJob(p, tests, entry_point="square") for p in forgers]
    local = sb.run_tests_many(jobs)
    served = remote.run_tests_many(jobs)
    for program, mine, theirs in zip(forgers, local, served):
        assert theirs.results == mine.results, program
        assert theirs.passed == 0, (program, theirs)
        assert all(r.status is not TestStatus.PASSED for r in theirs.results)


def test_the_language_suite_is_the_attack_table() -> None:
    attacked = {language for _, language in LANGUAGE_CASES}
    assert {"cpp", "java", "nodejs", "rust", "bash"} <= attacked
    assert len(LANGUAGE_CASES) >= 25, LANGUAGE_CASES


@pytest.mark.parametrize(("attack", "language"), LANGUAGE_CASES)
def test_language_attack_through_the_service(
    attack: str, language: str, remote: ServiceSandbox
) -> None:
    LANGUAGE_ATTACKS[attack](sb=remote, language=language)
