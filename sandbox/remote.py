r"""A sandbox on other machines: the ``Sandbox`` methods, answered by HTTP services.

``RemoteSandbox(settings)`` has the methods the code environments use (``run``, ``run_many``,
``run_tests``, ``run_tests_many``, ``workers``, ``owner_pid``, ``close``) and sends each job to
one of ``settings.urls``:

* protocol ``grpo``: ``grpo sandbox serve``'s endpoints (``sandbox.wire``): a ``TestJob`` in, the
  ``TestReport`` its service's sandbox decided out, outside the candidate's process as locally;
* protocol ``sandbox_fusion``: a plain SandboxFusion's ``/run_code`` (``sandbox.fusion``), one
  request per run. An ``IOTest`` job runs once per test and its output is judged HERE, by the
  local sandbox's rules (``sandbox.core.normalize_output``), so the verdict is still not the
  candidate's to give. A ``CallTest`` job cannot be judged outside the candidate's process by a
  plain SandboxFusion: it comes back ``SANDBOX_ERROR`` saying to use ``grpo sandbox serve``.

A service that is dead, hung, overloaded or broken never makes a method raise or hang: the job
comes back ``SANDBOX_ERROR`` (never ``failed``, never a wrong answer: it is not the model's
doing) with a ``detail`` naming the URLs tried and how each failed, within the job's deadline.
How, in order:

* at most ``max_in_flight`` requests are in flight at once (a semaphore), which is also
  ``workers``, the threads a code environment fans its jobs over;
* 429 (overloaded) is retried after its ``Retry-After``; 5xx, connection errors and timeouts are
  retried at once on the next URL (round-robin start, failover), or after a jittered exponential
  backoff on the same one; up to ``retries`` times. Other 4xx (a request the service refused, our
  bug) are not retried: their message is the detail;
* a URL that failed ``DOWN_AFTER`` times in a row is down: avoided for ``cooldown_s``, then
  probed by one job (the others keep waiting), up again when a probe succeeds. While every URL
  is down, jobs wait for the next probe within their deadline, so a short outage costs time, not
  verdicts; once every URL has failed ``DEAD_AFTER_PROBES`` probes in a row, jobs fail at once
  (a dead service costs a step about twice ``cooldown_s``, not every job's timeout), and the
  trainer's ``max_reward_errors`` guard stops the run;
* each request has a deadline (``request_timeout_s``, by default the job's own limits plus
  ``REQUEST_SLACK_S``), each job one for all its tries (``job_timeout_s``, by default twice the
  request's).

>>> settings = RemoteSettings(urls=("http://sandbox-a:8080/", "https://sandbox-b"))
>>> settings.urls
('http://sandbox-a:8080', 'https://sandbox-b')
>>> RemoteSettings(urls=("ftp://x",))
Traceback (most recent call last):
...
ValueError: RemoteSettings.urls: 'ftp://x' is not an http:// or https:// URL; write e.g. http://sandbox-host:8080
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar, cast, get_args

from sandbox import fusion, wire
from sandbox.core import _judge_io, clean_text
from sandbox.languages import Language, parse_language
from sandbox.types import (
    CallTest,
    CompileResult,
    ExecResult,
    IOTest,
    Job,
    Limits,
    SandboxClosedError,
    SandboxForkedError,
    Status,
    TestJob,
    TestReport,
    TestResult,
    TestStatus,
    check_files,
    check_seconds,
)

if TYPE_CHECKING:  # httpx loads with the first RemoteSandbox: `grpo train` runs without it
    import httpx

_T = TypeVar("_T")
_R = TypeVar("_R")

#: The protocols a remote sandbox speaks: ``grpo`` (``grpo sandbox serve``'s batch endpoints,
#: the verdict decided by the service) or ``sandbox_fusion`` (a plain SandboxFusion's
#: ``/run_code``, stdin/stdout tests judged by this client).
Protocol = Literal["grpo", "sandbox_fusion"]
PROTOCOLS: tuple[str, ...] = get_args(Protocol)

#: Seconds added to a job's own time limits for its request's deadline: the transfer, the
#: service's start-up of the run and a short wait in its queue.
REQUEST_SLACK_S = 10.0
#: Consecutive failures after which a URL is down: avoided for ``RemoteSettings.cooldown_s``.
DOWN_AFTER = 3
#: Failed probes in a row (one per cool-down) after which a down URL counts as dead: while every
#: URL is, jobs fail at once instead of waiting for the next probe.
DEAD_AFTER_PROBES = 2
#: Characters of a service's error message kept in a detail.
MESSAGE_CHARS = 300

#: What a SandboxFusion compile failure (or compile timeout) becomes, as the local sandbox's: the
#: program never ran (``ExecResult.compile`` says how the compile step ended).
COMPILE_FAILED: Status = Status.COMPILE_ERROR

#: The answer to a CallTest job on a plain SandboxFusion.
CALL_TESTS_NEED_GRPO = (
    "a plain SandboxFusion service cannot judge function-call tests (CallTest) outside the "
    "candidate's process: serve them with `grpo sandbox serve` and use protocol grpo "
    "(--sandbox_protocol grpo)"
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_url(url: object) -> str:
    if not isinstance(url, str):
        raise ValueError(f"RemoteSettings.urls: expected strings, got {url!r}")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"RemoteSettings.urls: {url!r} is not an http:// or https:// URL; "
            "write e.g. http://sandbox-host:8080"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"RemoteSettings.urls: {url!r} has a query or fragment; give the base URL")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise ValueError(f"RemoteSettings.urls: {url!r} has an invalid port") from None
    return url.strip().rstrip("/")


@dataclass(frozen=True)
class RemoteSettings:
    """Where the remote sandbox is and how to talk to it (saved with a run's config: no secret).

    Validated at construction (``ValueError`` naming the field and the fix).
    """

    urls: tuple[str, ...]
    """Base URLs of the services (``http://host:port``), all serving the same protocol."""
    protocol: Protocol = "grpo"
    """``grpo``: ``grpo sandbox serve`` (every test kind; verdicts decided by the service).
    ``sandbox_fusion``: a plain SandboxFusion (stdin/stdout tests only, judged here)."""
    token_env: str = ""
    """Name of the environment variable that holds the bearer token (sent as ``Authorization:
    Bearer <token>``); empty: no token. Never the token itself: settings are saved in runs."""
    max_in_flight: int = 64
    """Requests in flight at once, over all URLs (verl's default concurrency: 64)."""
    retries: int = 3
    """Tries after the first for one request (on 429, 5xx, connection errors, timeouts)."""
    backoff_base_s: float = 0.5
    """First backoff before retrying the same URL; doubled each time, jittered."""
    backoff_cap_s: float = 8.0
    """Longest backoff (a ``Retry-After`` is honoured as given, within the job's deadline)."""
    request_timeout_s: float | None = None
    """Deadline of one request; ``None``: the job's own time limits plus ``REQUEST_SLACK_S``."""
    job_timeout_s: float | None = None
    """Deadline of one job over all its tries; ``None``: twice its request deadline."""
    connect_timeout_s: float = 5.0
    """Deadline of opening a connection."""
    cooldown_s: float = 5.0
    """How long a URL that failed ``DOWN_AFTER`` times in a row is avoided before a probe."""

    def __post_init__(self) -> None:
        urls = self.urls
        if isinstance(urls, str):
            urls = tuple(u for u in urls.split(",") if u.strip())
        if not isinstance(urls, tuple | list) or not urls:
            raise ValueError(
                "RemoteSettings.urls: give at least one service URL, e.g. "
                "('http://sandbox-host:8080',)"
            )
        checked = tuple(_check_url(u) for u in urls)
        if len(set(checked)) != len(checked):
            raise ValueError(f"RemoteSettings.urls: {list(checked)} names a URL twice")
        object.__setattr__(self, "urls", checked)
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"RemoteSettings.protocol: {self.protocol!r} is not one of {list(PROTOCOLS)}"
            )
        if not isinstance(self.token_env, str) or (
            self.token_env and not _ENV_NAME.fullmatch(self.token_env)
        ):
            raise ValueError(
                "RemoteSettings.token_env: give the NAME of the environment variable that holds "
                "the token (e.g. SANDBOX_TOKEN), not the token itself: settings are saved with "
                "the run"
            )
        for name, low, high in (("max_in_flight", 1, 4096), ("retries", 0, 100)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"RemoteSettings.{name} must be an int in [{low}, {high}]")
        for name in ("backoff_base_s", "backoff_cap_s", "connect_timeout_s", "cooldown_s"):
            check_seconds(f"RemoteSettings.{name}", getattr(self, name))
        for name in ("request_timeout_s", "job_timeout_s"):
            if getattr(self, name) is not None:
                check_seconds(f"RemoteSettings.{name}", getattr(self, name))

    def token(self) -> str:
        """Return the bearer token from ``token_env`` ("" without one); ``ValueError`` if unset."""
        if not self.token_env:
            return ""
        value = os.environ.get(self.token_env, "")
        if not value:
            raise ValueError(
                f"the remote sandbox's token is read from the environment variable "
                f"{self.token_env} (token_env), which is not set: export {self.token_env}=<token> "
                "before starting, or leave token_env empty for a service without a token"
            )
        return value


@dataclass(frozen=True)
class RemoteStats:
    """What a ``RemoteSandbox`` did so far (counters since it was made)."""

    requests: int = 0
    """HTTP requests sent (every try)."""
    retries: int = 0
    """Tries after a request's first."""
    failovers: int = 0
    """Retries sent to another URL than the try before."""
    failures: int = 0
    """Jobs (or single runs) that came back ``SANDBOX_ERROR`` because of the service."""

    def minus(self, earlier: RemoteStats) -> RemoteStats:
        """Return the counts since ``earlier`` (e.g. one training step's)."""
        return RemoteStats(
            *(getattr(self, f.name) - getattr(earlier, f.name) for f in dataclasses.fields(self))
        )

    def plus(self, **counts: int) -> RemoteStats:
        """Return these counts with ``counts`` added (``requests=1``...)."""
        return dataclasses.replace(self, **{k: getattr(self, k) + v for k, v in counts.items()})


_PROCESS_STATS = RemoteStats()
_PROCESS_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    # A lock another thread held at the fork stays held forever in the child.
    global _PROCESS_LOCK
    _PROCESS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def process_stats() -> RemoteStats:
    """Return the counts of every ``RemoteSandbox`` of this process together, since it started.

    The trainer logs their change per step (``sandbox/*`` metrics).
    """
    with _PROCESS_LOCK:
        return _PROCESS_STATS


class _Endpoint:
    """One URL and what its recent requests say about it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.failures = 0  # in a row
        self.failed_probes = 0  # in a row
        self.down_until = 0.0  # avoided until then (DOWN_AFTER failures in a row)
        self.busy_until = 0.0  # its Retry-After
        self.last_error = ""

    @property
    def dead(self) -> bool:
        """Whether its last ``DEAD_AFTER_PROBES`` probes failed."""
        return self.failed_probes >= DEAD_AFTER_PROBES


@dataclass(frozen=True)
class _Choice:
    """Where the next try goes: ``endpoint``, or wait ``wait_s`` for a probe, or (neither) fail."""

    endpoint: _Endpoint | None = None
    probe: bool = False
    wait_s: float | None = None


@dataclass(frozen=True)
class _Failure:
    """Why one call (all its tries) got no answer: the job's ``SANDBOX_ERROR`` detail."""

    detail: str


@dataclass(frozen=True)
class _Try:
    """How one HTTP request ended."""

    body: object = None
    error: str = ""
    retry: bool = False  # worth another try
    failed: bool = False  # counts against the URL (5xx, connection, timeout)
    retry_after_s: float = 0.0


class RemoteSandbox:
    """The ``Sandbox`` methods, run by remote services (see the module docstring).

    Args:
        settings: where the services are and how to talk to them.
        limits: default limits for jobs without their own (protocol ``sandbox_fusion``; the
            ``grpo`` service applies its own default to a job without limits).
        transport: an ``httpx`` transport to use instead of the network (tests).
    """

    def __init__(
        self,
        settings: RemoteSettings,
        limits: Limits | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not isinstance(settings, RemoteSettings):
            raise TypeError(f"settings must be RemoteSettings, got {type(settings).__name__}")
        self.settings = settings
        self.limits = limits if limits is not None else Limits()
        self.owner_pid = os.getpid()
        """The process that made this RemoteSandbox, the only one that may use it."""
        self.isolation: tuple[str, ...] = ()
        """Unknown here: each report carries the layers its service applied."""
        headers = {"Accept": "application/json"}
        token = settings.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        import httpx

        self._client = httpx.Client(
            headers=headers,
            limits=httpx.Limits(
                max_connections=settings.max_in_flight,
                max_keepalive_connections=settings.max_in_flight,
            ),
            transport=transport,
            follow_redirects=False,
        )
        self._slots = threading.BoundedSemaphore(settings.max_in_flight)
        self._lock = threading.Lock()
        #: Notified when a URL's health changes (a probe's verdict): jobs waiting on it look again.
        self._health = threading.Condition(self._lock)
        self._endpoints = [_Endpoint(url) for url in settings.urls]
        self._next = 0
        self._stats = RemoteStats()
        self._closed = False
        self._executor = ThreadPoolExecutor(
            max_workers=settings.max_in_flight, thread_name_prefix="remote-sandbox"
        )

    @property
    def workers(self) -> int:
        """Jobs run at once: ``max_in_flight`` (the code environments fan out that many)."""
        return self.settings.max_in_flight

    def stats(self) -> RemoteStats:
        """Return the requests, retries, failovers and failed jobs so far."""
        with self._lock:
            return self._stats

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connections; later calls raise ``SandboxClosedError``."""
        if os.getpid() != self.owner_pid:
            self._closed = True  # the connections are the parent's
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def __enter__(self) -> RemoteSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_usable(self) -> None:
        if os.getpid() != self.owner_pid:
            raise SandboxForkedError(
                f"this RemoteSandbox belongs to process {self.owner_pid}; process {os.getpid()} "
                "is a fork of it and must make its own (its connections are the parent's)"
            )
        if self._closed:
            raise SandboxClosedError("the RemoteSandbox is closed")

    # -- the Sandbox methods -------------------------------------------------------------------
    def run(
        self,
        code: str,
        stdin: str = "",
        files: dict[str, str] | None = None,
        limits: Limits | None = None,
        *,
        language: str = "python",
        compile_timeout_s: float | None = None,
    ) -> ExecResult:
        """Run one program remotely (``Sandbox.run``); service trouble is ``SANDBOX_ERROR``.

        Whether the service has ``language``'s toolchain is its own to say (a
        ``SANDBOX_ERROR`` naming it when it has not).
        """
        self._check_usable()
        job = Job(code, stdin, files, limits, language, compile_timeout_s)
        return self._run_job(_check_job(job))

    def run_many(self, jobs: Sequence[str | Job]) -> list[ExecResult]:
        """``run`` for many programs, ``max_in_flight`` at once; results in input order."""
        self._check_usable()
        checked = [_check_job(Job(j) if isinstance(j, str) else j) for j in jobs]
        return self._map(self._run_job, checked)

    def run_tests(
        self,
        program: str,
        tests: Sequence[CallTest] | Sequence[IOTest],
        *,
        entry_point: str | None = None,
        setup: str = "",
        limits: Limits | None = None,
        per_test_timeout_s: float | None = None,
        stop_on_first_failure: bool = False,
        stop_on_program_failure: bool = False,
        language: str = "python",
        compile_timeout_s: float | None = None,
    ) -> TestReport:
        """Judge ``program`` on ``tests`` remotely (``Sandbox.run_tests``)."""
        self._check_usable()
        job = TestJob(
            program=program,
            tests=tuple(tests),  # type: ignore[arg-type]
            entry_point=entry_point,
            setup=setup,
            limits=limits,
            per_test_timeout_s=per_test_timeout_s,
            stop_on_first_failure=stop_on_first_failure,
            stop_on_program_failure=stop_on_program_failure,
            language=language,
            compile_timeout_s=compile_timeout_s,
        )
        return self._run_test_job(_check_test_job(job))

    def run_tests_many(self, jobs: Sequence[TestJob]) -> list[TestReport]:
        """``run_tests`` for many jobs, ``max_in_flight`` at once; reports in input order."""
        self._check_usable()
        checked = [_check_test_job(job) for job in jobs]
        return self._map(self._run_test_job, checked)

    def _map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        if len(items) == 1:  # the code environments' way: one job per call, from many threads
            return [fn(items[0])]
        try:
            return list(self._executor.map(fn, items))
        except RuntimeError as exc:  # the executor refuses work once shut down
            if self._closed and not isinstance(exc, SandboxClosedError):
                raise SandboxClosedError("the RemoteSandbox was closed during this call") from exc
            raise

    # -- jobs ----------------------------------------------------------------------------------
    def _run_job(self, job: Job) -> ExecResult:
        start = time.monotonic()
        if self.settings.protocol == "grpo":
            timeout = self._request_timeout(_run_bound(job, self.limits))
            got = self._call(wire.RUN_PATH, wire.encode_run(job), timeout)
            if isinstance(got, _Failure):
                return _exec_failure(got.detail, time.monotonic() - start)
            try:
                return _clean_result(wire.decode_exec_result(_envelope(got, "result")))
            except wire.WireError as exc:
                return self._malformed(exc, start)
        return self._run_fusion(job, job.limits or self.limits, start)

    def _run_test_job(self, job: TestJob) -> TestReport:
        start = time.monotonic()
        if not job.tests:
            return TestReport(results=(), status=Status.OK, wall_s=0.0, isolation=())
        if self.settings.protocol == "sandbox_fusion":
            if isinstance(job.tests[0], CallTest):
                return _report_failure(job, CALL_TESTS_NEED_GRPO, 0.0)
            return self._run_fusion_io_tests(job)
        timeout = self._request_timeout(_test_job_bound(job, self.limits))
        got = self._call(wire.RUN_TESTS_PATH, wire.encode_job(job), timeout)
        if isinstance(got, _Failure):
            return _report_failure(job, got.detail, time.monotonic() - start)
        try:
            report = wire.decode_report(_envelope(got, "report"))
        except wire.WireError as exc:
            self._count_failure()
            why = f"the service's reply is malformed: {exc}"
            return _report_failure(job, why, time.monotonic() - start)
        if len(report.results) != len(job.tests):
            self._count_failure()
            return _report_failure(
                job,
                f"the service returned {len(report.results)} results for {len(job.tests)} tests",
                time.monotonic() - start,
            )
        return _clean_report(report)

    def _malformed(self, exc: Exception, start: float) -> ExecResult:
        self._count_failure()
        return _exec_failure(f"the service's reply is malformed: {exc}", time.monotonic() - start)

    def _run_fusion(self, job: Job, limits: Limits, start: float) -> ExecResult:
        """One ``/run_code`` request for ``job``; its response as an ``ExecResult``."""
        language = _language_of(job)
        request = fusion.RunCodeRequest(
            code=job.code,
            language=language,
            stdin=job.stdin,
            # None: SandboxFusion's default (10 s), as it has no toolchain defaults of ours.
            compile_timeout=job.compile_timeout_s or fusion.RunCodeRequest.compile_timeout,
            run_timeout=limits.timeout_s,
            memory_limit_MB=limits.memory_mb,
            files=fusion.encode_files(check_files(job.files)),
        )
        bound = limits.timeout_s + (request.compile_timeout if language != "python" else 0.0)
        got = self._call(
            wire.RUN_CODE_PATH,
            fusion.encode_run_code_request(request),
            self._request_timeout(bound),
        )
        if isinstance(got, _Failure):
            return _exec_failure(got.detail, time.monotonic() - start)
        try:
            response = fusion.decode_run_code_response(got)
        except wire.WireError as exc:
            return self._malformed(exc, start)
        return exec_result_of(response, time.monotonic() - start)

    def _run_fusion_io_tests(self, job: TestJob) -> TestReport:
        """Each IOTest as one ``/run_code`` run, judged here as the local sandbox judges it."""
        start = time.monotonic()
        lim = job.limits or self.limits
        if job.per_test_timeout_s is not None:
            lim = dataclasses.replace(lim, timeout_s=job.per_test_timeout_s, cpu_s=None)
        results: list[TestResult] = []
        program_status = Status.OK
        stdout: list[str] = []
        stderr: list[str] = []
        stopped: TestResult | None = None
        compiled: CompileResult | None = None
        for index, test in enumerate(job.tests):
            assert isinstance(test, IOTest)  # _check_test_job: one kind per job
            name = test.name or f"test_{index}"
            if stopped is not None:
                results.append(dataclasses.replace(stopped, name=name))
                continue
            run = Job(job.program, test.stdin, None, lim, job.language, job.compile_timeout_s)
            res = self._run_fusion(run, lim, time.monotonic())
            compiled = compiled or res.compile
            if sum(map(len, stdout)) < 64 << 10:
                stdout.append(res.stdout[: 64 << 10])
                stderr.append(res.stderr[: 64 << 10])
            if res.status is not Status.OK and program_status is Status.OK:
                program_status = res.status
            results.append(_judge_io(name, test, res))
            if res.status is Status.SANDBOX_ERROR:
                # The service failed, not the program: the job's outcome is a sandbox error
                # whatever the other tests say, so they are not sent to a failing service.
                stopped = TestResult(name, TestStatus.SANDBOX_ERROR, "not run: " + res.detail)
            elif res.status is COMPILE_FAILED:
                # As the local sandbox: a program that does not compile fails every test so.
                stopped = results[-1]
            elif job.stop_on_program_failure and res.status is not Status.OK:
                why = f"not run: the program failed in test {index} (stop_on_program_failure)"
                stopped = TestResult(name, TestStatus.FAILED, why)
            elif job.stop_on_first_failure and not results[-1].passed:
                why = "not run: an earlier test failed (stop_on_first_failure)"
                stopped = TestResult(name, TestStatus.FAILED, why)
        return TestReport(
            results=tuple(results),
            status=program_status,
            wall_s=time.monotonic() - start,
            isolation=(),
            stdout="".join(stdout)[: 64 << 10],
            stderr="".join(stderr)[: 64 << 10],
            compile=compiled,
        )

    # -- transport -----------------------------------------------------------------------------
    def _request_timeout(self, job_bound_s: float) -> float:
        if self.settings.request_timeout_s is not None:
            return self.settings.request_timeout_s
        return job_bound_s + REQUEST_SLACK_S

    def _count(self, **counts: int) -> None:
        global _PROCESS_STATS
        with self._lock:
            self._stats = self._stats.plus(**counts)
        with _PROCESS_LOCK:
            _PROCESS_STATS = _PROCESS_STATS.plus(**counts)

    def _count_failure(self) -> None:
        self._count(failures=1)

    def _pick(self, avoid: _Endpoint | None) -> _Choice:
        """Choose the URL for the next try: round-robin among those up, ``avoid`` last.

        A down URL whose cool-down has passed is probed by one try (its cool-down restarts, so
        the others do not pile on). With every URL down: wait for the next probe, unless every
        URL is dead (then fail).
        """
        now = time.monotonic()
        with self._lock:
            n = len(self._endpoints)
            start, self._next = self._next, (self._next + 1) % n
            order = [self._endpoints[(start + i) % n] for i in range(n)]
            usable = [ep for ep in order if ep.down_until <= now]
            if not usable:
                if all(ep.dead for ep in order):
                    return _Choice()
                return _Choice(wait_s=min(ep.down_until for ep in order) - now)
            ready = [ep for ep in usable if ep.busy_until <= now]
            preferred = [ep for ep in ready if ep is not avoid] or ready or usable
            chosen = min(preferred, key=lambda ep: ep.busy_until) if not ready else preferred[0]
            probe = chosen.failures >= DOWN_AFTER
            if probe:
                chosen.down_until = now + self.settings.cooldown_s
            return _Choice(chosen, probe)

    def _down_text(self) -> str:
        with self._lock:
            return "; ".join(f"{ep.url}: {ep.last_error}" for ep in self._endpoints)

    def _record(self, endpoint: _Endpoint, attempt: _Try, probe: bool) -> None:
        with self._lock:
            if probe:
                self._health.notify_all()  # the jobs waiting for this probe look again
            if not attempt.error:
                endpoint.failures = endpoint.failed_probes = 0
                endpoint.down_until = 0.0
                return
            endpoint.last_error = attempt.error
            if attempt.retry_after_s:
                endpoint.busy_until = time.monotonic() + attempt.retry_after_s
            if attempt.failed:
                endpoint.failures += 1
                endpoint.failed_probes += probe
                if endpoint.failures >= DOWN_AFTER:
                    endpoint.down_until = time.monotonic() + self.settings.cooldown_s

    def _call(self, path: str, payload: dict[str, object], timeout_s: float) -> object | _Failure:
        """POST ``payload`` to ``path`` of some URL until one answers, within the deadlines."""
        settings = self.settings
        job_deadline = time.monotonic() + (settings.job_timeout_s or 2 * timeout_s)
        body = json.dumps(payload).encode()
        errors: list[str] = []
        previous: _Endpoint | None = None
        attempt = 0
        while attempt <= settings.retries:
            choice = self._pick(avoid=previous)
            endpoint = choice.endpoint
            if endpoint is None:
                down = f"every sandbox service URL is down ({self._down_text()})"
                if choice.wait_s is None:  # dead: no probe to wait for
                    return self._give_up(down)
                if time.monotonic() + choice.wait_s >= job_deadline:
                    return self._give_up(f"{down}; no probe of it within the job's deadline")
                with self._health:  # until the next probe is due, or a probe's verdict
                    self._health.wait(timeout=max(choice.wait_s, 0.001))
                if self._closed:
                    raise SandboxClosedError("the RemoteSandbox was closed during this call")
                continue
            wait = max(0.0, endpoint.busy_until - time.monotonic())
            if endpoint is previous:
                backoff = min(settings.backoff_cap_s, settings.backoff_base_s * 2 ** (attempt - 1))
                wait = max(wait, backoff * random.uniform(0.5, 1.0))
            if wait >= job_deadline - time.monotonic():
                return self._give_up(_tried(errors) or "the job's deadline passed")
            if wait > 0:
                time.sleep(wait)
            if self._closed:
                raise SandboxClosedError("the RemoteSandbox was closed during this call")
            if attempt:
                self._count(retries=1, failovers=int(endpoint is not previous))
            got = self._post(endpoint, path, body, min(timeout_s, job_deadline - time.monotonic()))
            self._record(endpoint, got, choice.probe)
            if not got.error:
                return got.body
            errors.append(f"{endpoint.url}{path}: {got.error}")
            if not got.retry:
                return self._give_up(_tried(errors))
            previous, attempt = endpoint, attempt + 1
            if time.monotonic() >= job_deadline:
                break
        return self._give_up(_tried(errors))

    def _give_up(self, detail: str) -> _Failure:
        self._count_failure()
        return _Failure(detail)

    def _post(self, endpoint: _Endpoint, path: str, body: bytes, timeout_s: float) -> _Try:
        """One HTTP request, bounded by ``timeout_s`` (also while waiting for a free slot)."""
        import httpx

        if timeout_s <= 0:
            return _Try(error="the job's deadline passed", failed=False)
        deadline = time.monotonic() + timeout_s
        if not self._slots.acquire(timeout=timeout_s):
            return _Try(
                error=f"no request slot free within {timeout_s:.1f}s "
                f"(max_in_flight={self.settings.max_in_flight})",
                retry=False,
            )
        try:
            self._count(requests=1)
            left = max(0.001, deadline - time.monotonic())
            timeout = httpx.Timeout(left, connect=min(left, self.settings.connect_timeout_s))
            with self._client.stream(
                "POST",
                endpoint.url + path,
                content=body,
                headers={"Content-Type": "application/json"},
                timeout=timeout,
            ) as response:
                chunks = []
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    if time.monotonic() > deadline:  # a service that trickles its answer
                        raise httpx.ReadTimeout("the answer did not end within the deadline")
                return _answer(response, b"".join(chunks))
        except httpx.TimeoutException as exc:
            return _Try(
                error=f"no answer within {timeout_s:.1f}s ({type(exc).__name__})",
                retry=True,
                failed=True,
            )
        except (httpx.TransportError, OSError) as exc:
            if self._closed:
                raise SandboxClosedError("the RemoteSandbox was closed during this call") from None
            text = str(exc) or type(exc).__name__
            return _Try(error=f"connection failed: {text}"[:MESSAGE_CHARS], retry=True, failed=True)
        except RuntimeError as exc:  # httpx refuses a closed client
            if self._closed:
                raise SandboxClosedError("the RemoteSandbox was closed during this call") from None
            return _Try(error=f"request failed: {exc}"[:MESSAGE_CHARS], retry=False)
        finally:
            self._slots.release()


def _tried(errors: list[str]) -> str:
    if not errors:
        return ""
    shown = errors[-4:]
    more = f" (and {len(errors) - len(shown)} earlier)" if len(errors) > len(shown) else ""
    return f"the sandbox service failed {len(errors)} time(s): " + "; ".join(shown) + more


def _answer(response: httpx.Response, content: bytes) -> _Try:
    """Classify an HTTP answer: a JSON body, or why not and whether to try again."""
    status = response.status_code
    if status == 200:
        try:
            return _Try(body=json.loads(content))
        except ValueError:
            return _Try(error=f"200 with a body that is not JSON: {content[:80]!r}")
    message = _message(content)
    if status == 429:
        return _Try(
            error=f"429 overloaded: {message}",
            retry=True,
            retry_after_s=_retry_after(response.headers.get("Retry-After")),
        )
    if status >= 500:
        return _Try(error=f"{status}: {message}", retry=True, failed=True)
    if status in (401, 403):
        return _Try(error=f"{status} the service refused the token: {message}")
    return _Try(error=f"{status} the service refused the request: {message}")


def _message(content: bytes) -> str:
    """Return a service's error text: the ``detail``/``message`` of a JSON body, else the body."""
    try:
        data = json.loads(content)
    except ValueError:
        return clean_text(content[:MESSAGE_CHARS].decode(errors="replace")) or "(empty body)"
    if isinstance(data, dict):
        for key in ("detail", "message", "error"):
            if isinstance(data.get(key), str):
                return clean_text(data[key][:MESSAGE_CHARS])
    return clean_text(json.dumps(data)[:MESSAGE_CHARS])


def _retry_after(value: str | None) -> float:
    """Seconds of a ``Retry-After`` header (seconds, or an HTTP date); 1 s if absent or odd."""
    if value is None:
        return 1.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            from email.utils import parsedate_to_datetime

            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return 1.0
    return min(max(seconds, 0.0), 3600.0) if math.isfinite(seconds) else 1.0


def _envelope(body: object, key: str) -> object:
    """Return the ``key`` of a batch endpoint's reply ``{"version", key}``, checking the version."""
    if not isinstance(body, dict) or set(body) != {"version", key}:
        shape = sorted(body) if isinstance(body, dict) else type(body).__name__
        raise wire.WireError(f"reply: expected {{'version', {key!r}}}, got {shape}")
    if body["version"] != wire.WIRE_VERSION:
        raise wire.WireError(
            f"reply: the service speaks protocol version {body['version']!r}, this client "
            f"{wire.WIRE_VERSION}: run the same grpo-kit version on both sides"
        )
    return body[key]


# -- results -------------------------------------------------------------------------------------


def _exec_failure(detail: str, wall_s: float) -> ExecResult:
    return ExecResult(
        status=Status.SANDBOX_ERROR,
        stdout="",
        stderr="",
        exit_code=None,
        wall_s=wall_s,
        isolation=(),
        detail=clean_text(detail),
    )


def _report_failure(job: TestJob, detail: str, wall_s: float) -> TestReport:
    text = clean_text(detail)
    tests: Sequence[CallTest | IOTest] = job.tests
    return TestReport(
        results=tuple(
            TestResult(t.name or f"test_{i}", TestStatus.SANDBOX_ERROR, text)
            for i, t in enumerate(tests)
        ),
        status=Status.SANDBOX_ERROR,
        wall_s=wall_s,
        isolation=(),
    )


def _clean_result(result: ExecResult) -> ExecResult:
    """Remote text made encodable as the local sandbox's (``clean_text``)."""
    return dataclasses.replace(
        result,
        stdout=clean_text(result.stdout),
        stderr=clean_text(result.stderr),
        detail=clean_text(result.detail),
    )


def _clean_report(report: TestReport) -> TestReport:
    return dataclasses.replace(
        report,
        results=tuple(dataclasses.replace(r, detail=clean_text(r.detail)) for r in report.results),
        stdout=clean_text(report.stdout),
        stderr=clean_text(report.stderr),
    )


def exec_result_of(response: fusion.RunCodeResponse, wall_s: float) -> ExecResult:
    """Return what a SandboxFusion ``/run_code`` response says about the run (``ExecResult``).

    ``SandboxError``, or a command the runner could not run (``Error``) -> ``SANDBOX_ERROR``; a
    compile step that failed or timed out -> ``COMPILE_FAILED``; the run's
    ``TimeLimitExceeded`` -> ``TIMEOUT``; a non-zero return code -> ``RUNTIME_ERROR``; else
    ``OK``. ``wall_s``: the run's ``execution_time`` when the service measured it. A compile
    step is kept in ``ExecResult.compile`` (``COMPILE_ERROR`` or ``TIMEOUT`` when it failed).
    """
    compiled, run = response.compile_result, response.run_result
    compile_result = None
    if compiled is not None:
        built = Status.OK if compiled.return_code == 0 else COMPILE_FAILED
        compile_status = {
            fusion.CommandStatus.FINISHED: built,
            fusion.CommandStatus.TIME_LIMIT_EXCEEDED: Status.TIMEOUT,
            fusion.CommandStatus.ERROR: Status.SANDBOX_ERROR,
        }[compiled.status]
        compile_result = CompileResult(
            compile_status,
            clean_text(compiled.stdout or ""),
            clean_text(compiled.stderr or ""),
            compiled.return_code,
            compiled.execution_time or 0.0,
        )

    def result(status: Status, command: fusion.CommandRunResult | None, detail: str) -> ExecResult:
        return ExecResult(
            status=status,
            stdout=clean_text((command.stdout if command else None) or ""),
            stderr=clean_text((command.stderr if command else None) or ""),
            exit_code=command.return_code if command else None,
            wall_s=(command.execution_time if command else None) or wall_s,
            isolation=(),
            detail=clean_text(detail[:MESSAGE_CHARS]),
            compile=compile_result,
        )

    if response.status is fusion.RunStatus.SANDBOX_ERROR:
        return result(Status.SANDBOX_ERROR, run, f"SandboxFusion: {response.message}")
    for command in (compiled, run):
        if command is not None and command.status is fusion.CommandStatus.ERROR:
            return result(Status.SANDBOX_ERROR, command, "SandboxFusion could not run a command")
    if compiled is not None and (
        compiled.status is fusion.CommandStatus.TIME_LIMIT_EXCEEDED or compiled.return_code != 0
    ):
        timed_out = compiled.status is fusion.CommandStatus.TIME_LIMIT_EXCEEDED
        stderr = (compiled.stderr or "").strip()
        why = "compile: the compile step timed out" if timed_out else "compile error: " + stderr
        return result(COMPILE_FAILED, compiled, why)
    if run is None:
        return result(Status.SANDBOX_ERROR, None, f"SandboxFusion {response.status}: no run result")
    if run.status is fusion.CommandStatus.TIME_LIMIT_EXCEEDED:
        return result(Status.TIMEOUT, run, "time limit exceeded")
    if run.return_code != 0:
        return result(Status.RUNTIME_ERROR, run, f"exit status {run.return_code}")
    return result(Status.OK, run, "")


def _language_of(job: Job) -> fusion.FusionLanguage:
    """Return the job's language by SandboxFusion's name (ours are SandboxFusion's)."""
    language = str(job.language)
    if language not in fusion.FUSION_LANGUAGES:
        raise ValueError(f"language {language!r} is not one SandboxFusion knows")
    return cast(fusion.FusionLanguage, language)


def _run_bound(job: Job, default: Limits) -> float:
    limits = job.limits or default
    return limits.timeout_s + (job.compile_timeout_s or 0.0)


def _test_job_bound(job: TestJob, default: Limits) -> float:
    """Return the longest a service may take to judge ``job`` by its limits (``Sandbox``'s)."""
    limits = job.limits or default
    per_test = job.per_test_timeout_s or limits.timeout_s
    module_level = limits.timeout_s if isinstance(job.tests[0], CallTest) else 0.0
    return module_level + per_test * len(job.tests) + (job.compile_timeout_s or 0.0)


def _check_language(language: object, compile_timeout_s: float | None) -> Language:
    if compile_timeout_s is not None:
        check_seconds("compile_timeout_s", compile_timeout_s)
    return parse_language(language)


def _check_job(job: Job) -> Job:
    """Refuse what ``Sandbox.run`` refuses, at once (``TypeError``/``ValueError``)."""
    if not isinstance(job.code, str) or not isinstance(job.stdin, str):
        raise TypeError("code and stdin must be str")
    _check_language(job.language, job.compile_timeout_s)
    if job.limits is not None and not isinstance(job.limits, Limits):
        raise TypeError(f"limits must be a sandbox.Limits, got {type(job.limits).__name__}")
    check_files(job.files)
    return job


def _check_test_job(job: TestJob) -> TestJob:
    """Refuse what ``Sandbox.run_tests`` refuses, at once (``TypeError``/``ValueError``)."""
    if not isinstance(job.program, str) or not isinstance(job.setup, str):
        raise TypeError("program and setup must be str")
    tests = tuple(job.tests)
    if not (
        all(isinstance(t, CallTest) for t in tests) or all(isinstance(t, IOTest) for t in tests)
    ):
        raise TypeError("tests must be all CallTest or all IOTest")
    if (
        tests
        and isinstance(tests[0], CallTest)
        and not (job.entry_point and job.entry_point.isidentifier())
    ):
        raise ValueError("CallTest jobs need entry_point, the name of the function to test")
    language = _check_language(job.language, job.compile_timeout_s)
    if language is not Language.PYTHON and tests and not isinstance(tests[0], IOTest):
        raise ValueError(f"language {language.value!r} takes IOTests only (CallTests need Python)")
    if job.per_test_timeout_s is not None:
        check_seconds("per_test_timeout_s", job.per_test_timeout_s)
    if job.limits is not None and not isinstance(job.limits, Limits):
        raise TypeError(f"limits must be a sandbox.Limits, got {type(job.limits).__name__}")
    return job
