"""The sandbox's public, typed contract: limits in, results and test verdicts out.

Everything here is a frozen dataclass or a str-enum so that results can be logged, compared and
sent between processes without ``dict[str, Any]`` state. The execution machinery lives in
``sandbox.core`` (the library side) and the slot server's modules (``sandbox._slot_server``
and below).
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from enum import StrEnum

from sandbox import _codec

#: The most one run's inputs may take (``ValueError`` beyond it, before anything is sent): code,
#: stdin and files (names and contents) for ``run``; program, setup and test sources for a
#: ``CallTest`` job; program and one test's stdin per ``IOTest``. UTF-8 bytes, plus 4 per text.
MAX_REQUEST_BYTES: int = _codec.MAX_REQUEST

#: Every isolation layer the sandbox knows, in the order it applies them to a child.
#: ``ExecResult.isolation`` lists the subset that was actually applied to that run.
ALL_LAYERS: tuple[str, ...] = (
    "empty_env",  # the slot server starts with an empty environment: no secrets to inherit
    "session",  # a new session and process group: group kills cannot reach the host
    "cgroup",  # cgroup v1 memory + pids limits for the whole run (fork bombs, memory)
    "pid_ns",  # a PID namespace: the run cannot see or signal host processes; killed as a unit
    "net_ns",  # an empty network namespace: no interfaces at all, not even loopback
    "mount_ns",  # a private mount namespace with fresh /proc, tmpfs /tmp and /dev/shm, hidden homes
    "ipc_ns",  # private SysV IPC / POSIX message queues
    "uid",  # an unprivileged per-slot uid/gid with no supplementary groups
    "rlimits",  # AS, CPU, FSIZE, NOFILE, NPROC, CORE=0, MEMLOCK=0
    "no_new_privs",  # setuid binaries cannot raise privileges
    "landlock",  # writes only in the work dir, reads only system dirs; no TCP; scoped signals
    "seccomp",  # ptrace, mount, namespaces, keyctl, bpf, modules, ..., non-AF_UNIX sockets denied
)


class SandboxUnavailableError(RuntimeError):
    """Raised by ``Sandbox(..., strict=True)`` when a required isolation layer cannot be applied."""


class SandboxClosedError(RuntimeError):
    """The ``Sandbox`` is closed.

    Raised by a call made after ``close()``, and in a thread whose call was running when
    another thread closed it.
    """


class SandboxForkedError(RuntimeError):
    """A ``Sandbox`` was used in a process forked from the one that made it.

    Its slot servers, pipes, request ids and threads belong to the parent: sharing them would
    attach one process's results to the other's jobs. Make a new ``Sandbox`` in the child.
    """


class Status(StrEnum):
    """How a program run ended."""

    OK = "ok"  # exited with status 0
    RUNTIME_ERROR = (
        "runtime_error"  # non-zero exit status (an uncaught exception, sys.exit(1), ...)
    )
    TIMEOUT = "timeout"  # wall-clock or CPU limit reached; killed by the supervisor / kernel
    MEMORY = "memory"  # MemoryError under the address-space limit, or killed by the cgroup OOM
    OUTPUT_LIMIT = "output_limit"  # stdout + stderr exceeded ``Limits.output_bytes``; killed
    KILLED = "killed"  # ended by a signal the sandbox did not send (e.g. it killed itself)
    SANDBOX_ERROR = (
        "sandbox_error"  # the sandbox could not run the program (not the program's fault)
    )
    COMPILE_ERROR = "compile_error"  # the program did not compile (``ExecResult.compile`` says how)


#: The longest time limit accepted (one day): far beyond any test, and safely inside what
#: ``select``/``poll``/``RLIMIT_CPU`` accept once several tests' limits are added up.
MAX_SECONDS = 86_400.0
#: Upper bounds of the integer limits: what RLIMIT_*, cgroup files and tmpfs sizes accept, with
#: room (a reply holds up to ``output_bytes`` of text, JSON-escaped).
_INT_LIMITS = {
    "memory_mb": 1 << 24,  # 16 TiB
    "output_bytes": 1 << 27,  # 128 MiB
    "max_processes": 1 << 22,  # the kernel's pid_max limit
    "max_file_mb": 1 << 20,  # 1 TiB
}


def check_seconds(name: str, value: object) -> float:
    """Return ``value`` as seconds if it is a finite number in (0, ``MAX_SECONDS``].

    >>> check_seconds("timeout_s", 2)
    2.0
    >>> check_seconds("timeout_s", 1e10)
    Traceback (most recent call last):
    ...
    ValueError: timeout_s must be a number of seconds in (0, 86400], got 10000000000.0
    """
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 < value <= MAX_SECONDS
    ):
        raise ValueError(
            f"{name} must be a number of seconds in (0, {MAX_SECONDS:g}], got {value!r}"
        )
    return float(value)


@dataclass(frozen=True)
class Limits:
    """Resource limits for one run. Defaults suit short model-written programs."""

    timeout_s: float = 10.0
    """Wall-clock limit, enforced by the supervisor (SIGKILL of the whole run), not by the child."""
    cpu_s: float | None = None
    """CPU-time limit (RLIMIT_CPU); ``None`` means ``ceil(timeout_s) + 1``."""
    memory_mb: int = 1024
    """Address-space limit per process (RLIMIT_AS) and memory limit of the run's cgroup."""
    output_bytes: int = 1 << 20
    """Cap on stdout + stderr together; on overflow the run is killed and ``truncated`` is set."""
    max_processes: int = 64
    """Processes + threads the run may have at once (RLIMIT_NPROC of its uid, cgroup pids.max)."""
    max_file_mb: int = 64
    """Largest file the run may write (RLIMIT_FSIZE); the private /tmp is 2x this size (at least
    16 MiB), and the run's input ``files`` must fit in it."""
    network: bool = False
    """Allow network access: no network namespace, TCP and all socket families allowed."""

    def __post_init__(self) -> None:
        """Reject limits that cannot be enforced, saying how to fix them (``ValueError``).

        Every bound is one the kernel and the supervisor's clocks accept: a value past it once
        passed here and then broke the slot (``select`` raised ``OverflowError`` after the
        request was sent).
        """
        check_seconds("Limits.timeout_s", self.timeout_s)
        if self.cpu_s is not None:
            check_seconds("Limits.cpu_s", self.cpu_s)
        for name, upper in _INT_LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= upper:
                raise ValueError(f"Limits.{name} must be an int in [1, {upper}], got {value!r}")
        if self.memory_mb < 64:
            raise ValueError("Limits.memory_mb must be >= 64: the interpreter itself needs ~40 MB")
        if not isinstance(self.network, bool):
            raise ValueError(f"Limits.network must be True or False, got {self.network!r}")

    @property
    def effective_cpu_s(self) -> int:
        """The CPU limit in whole seconds as applied with RLIMIT_CPU."""
        if self.cpu_s is not None:
            return max(1, math.ceil(self.cpu_s))
        return math.ceil(self.timeout_s) + 1


@dataclass(frozen=True)
class CompileResult:
    """How the compile step of a compiled language ended (it runs in the sandbox too).

    ``status``: ``OK``, ``COMPILE_ERROR`` (the compiler refused the program; its message is in
    ``stderr``), ``TIMEOUT``/``MEMORY``/``OUTPUT_LIMIT`` (the compile hit a limit: a compile
    bomb), ``SANDBOX_ERROR``.
    """

    status: Status
    stdout: str
    stderr: str
    exit_code: int | None
    wall_s: float


@dataclass(frozen=True)
class ExecResult:
    """The observable outcome of one program run. Nothing in it was judged by the program itself."""

    status: Status
    stdout: str
    stderr: str
    exit_code: int | None
    """The exit status, or ``-signal`` when killed by a signal; ``None`` if it never ran."""
    wall_s: float
    isolation: tuple[str, ...]
    """The isolation layers that were actually applied to this run (see ``ALL_LAYERS``)."""
    truncated: bool = False
    """True when stdout/stderr were cut at ``Limits.output_bytes``."""
    detail: str = ""
    """A short explanation for non-OK statuses (e.g. which limit, or the sandbox error)."""
    compile: CompileResult | None = None
    """The compile step (compiled languages only; ``None`` for Python, Node.js, bash). When it
    failed, ``status`` is ``COMPILE_ERROR``, the program never ran, and ``stderr`` holds the
    compiler's message."""

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0."""
        return self.status is Status.OK


def check_files(files: dict[str, str] | None) -> dict[str, str]:
    """Validate the extra files of a job: relative, normalized paths of str contents.

    Raises:
        ValueError: for absolute paths, ``..`` components, empty or NUL-containing names.
        TypeError: for non-str names or contents.
    """
    if files is None:
        return {}
    checked: dict[str, str] = {}
    for name, content in files.items():
        if not isinstance(name, str) or not isinstance(content, str):
            raise TypeError(f"files must map str names to str contents, got {name!r}")
        norm = posixpath.normpath(name)
        if (
            not name
            or "\x00" in name
            or name.startswith("/")
            or norm.startswith("..")
            or norm in (".", "")
            or norm != name.rstrip("/")
        ):
            raise ValueError(
                f"file name {name!r} must be a plain relative path inside the work dir"
            )
        checked[norm] = content
    return checked


@dataclass(frozen=True)
class Job:
    """One program run for ``Sandbox.run_many``."""

    code: str
    stdin: str = ""
    files: dict[str, str] | None = None
    limits: Limits | None = None
    language: str = "python"
    """One of ``sandbox.Language`` (SandboxFusion's names: python, cpp, java, nodejs, rust,
    bash)."""
    compile_timeout_s: float | None = None
    """The compile step's wall-clock limit (compiled languages); ``None``: the toolchain's."""


# --------------------------------------------------------------------------------------------
# The trusted test-verdict API (see README.md, "Test verdicts").
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallTest:
    """One test of a function-style task (HumanEval, MBPP).

    ``source`` is TRUSTED test code, e.g. ``"assert candidate(1, 2) == 3"`` or
    ``"check(candidate)"``. It runs in a separate, trusted verdict process, never in the untrusted
    one, in a namespace where ``candidate`` and the entry-point name are proxies: each call sends
    the serialized arguments to the untrusted program's function, which sends back its serialized
    return value (or its exception's type name and message). The proxy returns a plain builtin value
    or raises (a builtin exception type by name, else ``CandidateError``).
    """

    source: str
    name: str = ""


@dataclass(frozen=True)
class IOTest:
    """One stdin/stdout test: the program runs once with ``stdin``.

    The supervisor, not the program, compares stdout with ``expected_stdout`` after stripping
    trailing whitespace on every line and trailing blank lines; a prefix of the expected output
    fails.
    """

    stdin: str
    expected_stdout: str
    name: str = ""


class TestStatus(StrEnum):
    """The verdict for one test."""

    __test__ = False  # not a pytest test class

    PASSED = "passed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    RUNTIME_ERROR = "runtime_error"
    OUTPUT_LIMIT = "output_limit"
    SANDBOX_ERROR = "sandbox_error"
    COMPILE_ERROR = "compile_error"


@dataclass(frozen=True)
class TestResult:
    """The verdict for one test, with a short human-readable ``detail`` for failures."""

    __test__ = False

    name: str
    status: TestStatus
    detail: str = ""

    @property
    def passed(self) -> bool:
        """True when the test passed."""
        return self.status is TestStatus.PASSED


@dataclass(frozen=True)
class TestReport:
    """All test verdicts for one program, and how the program as a whole ended."""

    __test__ = False

    results: tuple[TestResult, ...]
    status: Status
    wall_s: float
    isolation: tuple[str, ...]
    stdout: str = ""
    stderr: str = ""
    compile: CompileResult | None = None
    """The compile step (compiled languages only). When it failed, ``status`` and every
    test are ``COMPILE_ERROR`` and ``stderr`` holds the compiler's message."""

    @property
    def passed(self) -> int:
        """How many tests passed."""
        return sum(r.passed for r in self.results)

    @property
    def total(self) -> int:
        """How many tests there were."""
        return len(self.results)

    @property
    def all_passed(self) -> bool:
        """True when there was at least one test and every test passed."""
        return self.total > 0 and self.passed == self.total

    @property
    def fraction(self) -> float:
        """The fraction of tests passed (0.0 when there are no tests)."""
        return self.passed / self.total if self.total else 0.0


@dataclass(frozen=True)
class TestJob:
    """One program and its tests for ``Sandbox.run_tests_many``."""

    __test__ = False

    program: str
    tests: tuple[CallTest, ...] | tuple[IOTest, ...]
    entry_point: str | None = None
    setup: str = ""
    limits: Limits | None = None
    per_test_timeout_s: float | None = None
    stop_on_first_failure: bool = False
    """Skip the tests after the first that does not pass. Whether a later test runs then
    depends on a verdict, which a program that keeps state between runs can observe: the
    code environments never use it (see ``stop_on_program_failure``)."""
    stop_on_program_failure: bool = False
    """Skip the tests after the first during which the program itself failed: timed out, ran
    out of memory, died or exited (``IOTest``: any run that did not end ``ok``). What the
    program does with inputs that do not depend on verdicts is its own doing, so stopping
    there tells it nothing; for a binary reward it saves the time a hung program would take
    on every remaining test."""
    language: str = "python"
    """One of ``sandbox.Language``. Languages other than Python take ``IOTest``s only: the
    program is compiled once (when its language is compiled), then each test runs it fresh."""
    compile_timeout_s: float | None = None
    """The compile step's wall-clock limit; ``None``: the toolchain's default."""
