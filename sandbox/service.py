"""``grpo sandbox serve``'s HTTP app: the sandbox behind a bounded, authenticated service.

Endpoints (``sandbox/README.md``, "The sandbox service"):

* ``POST /v1/run_tests`` (``sandbox.wire``): one ``TestJob`` (a completion and its whole test
  set) -> ``{"version", "report"}``, judged by ``Sandbox.run_tests_many`` as locally: the verdict
  is decided outside the candidate's process.
* ``POST /v1/run``: one ``Job`` -> ``{"version", "result"}`` (``Sandbox.run``).
* ``POST /run_code``: SandboxFusion's request and response, field for field (``sandbox.fusion``),
  so that its official client and verl's work unchanged; ``GET /v1/ping`` answers ``"pong"`` as
  SandboxFusion's does.
* ``GET /health``: load and counts; it runs no code, needs no token and shows no secret.

Every code-running request holds one of ``workers + max_queue`` tickets from its first byte to
its answer (beyond them: 429 with ``Retry-After`` at once, never an unbounded queue), and one of
``workers`` run slots while its blocking sandbox call runs in a thread pool of that size.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import math
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandbox import fusion, wire
from sandbox.core import Sandbox
from sandbox.languages import Language, LanguageUnavailableError, require_language
from sandbox.types import (
    CallTest,
    CompileResult,
    ExecResult,
    Limits,
    SandboxClosedError,
    Status,
    TestJob,
    TestReport,
    check_files,
)

_T = TypeVar("_T")

#: SandboxFusion's liveness route (its server answers the JSON string "pong").
PING_PATH = "/v1/ping"
#: The ceiling of what a request may ask for when ``ServiceSettings.max_limits`` is not given.
DEFAULT_MAX_LIMITS = Limits(
    timeout_s=60.0,
    memory_mb=4096,
    output_bytes=16 << 20,
    max_processes=256,
    max_file_mb=256,
)
_LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Return whether ``host`` names an address only this machine reaches.

    >>> [is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "::1", "localhost", "0.0.0.0")]
    [True, True, True, True, False]
    """
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServiceSettings:
    """What the service listens on and what it admits.

    ``max_limits`` is the ceiling of the limits a request may ask for: a request over it is
    refused (400 naming the field and the maximum), never run with less than it asked, so that
    a verdict always comes from the limits its client chose. ``network`` is never granted.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    """0: the system picks a free port (``grpo sandbox serve`` prints the real one)."""
    workers: int = 1
    """Runs executing at once (the Sandbox's slot servers, the thread pool's size)."""
    max_queue: int = 64
    """Requests admitted beyond the running ones; more at once are answered 429."""
    max_request_bytes: int = 16 << 20
    """Largest request body (413 beyond it, on Content-Length and while reading)."""
    max_limits: Limits = DEFAULT_MAX_LIMITS
    max_request_s: float = 3600.0
    """Longest time one request's runs may take at their limits (a test set's sum); over it: 400.

    An hour: a function-call job whose program may restart after each failing test (partial
    credit: ``stop_on_program_failure`` off) is bounded by about (limit + per-test limit) x
    (tests + 1), e.g. 20 min for HumanEval's longest test set at EvalPlus's limits."""
    read_timeout_s: float = 30.0
    """Longest time to receive a request's body (a slow sender holds a ticket meanwhile)."""
    token: str | None = field(default=None, repr=False)
    """Required as ``Authorization: Bearer <token>`` by every code-running endpoint when set;
    mandatory when ``host`` is not loopback."""

    def __post_init__(self) -> None:
        """Refuse settings that cannot work or would expose the sandbox (``ValueError``)."""
        for name, low in (("workers", 1), ("max_queue", 0), ("max_request_bytes", 1024)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"ServiceSettings.{name} must be an int >= {low}, got {value!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"ServiceSettings.port must be in [0, 65535], got {self.port}")
        for name in ("max_request_s", "read_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"ServiceSettings.{name} must be > 0 seconds, got {value!r}")
        if self.max_limits.network:
            raise ValueError("ServiceSettings.max_limits.network must be False: never granted")
        if self.token is not None and (not self.token or self.token != self.token.strip()):
            raise ValueError("the token must be non-empty, without surrounding whitespace")
        if self.token is None and not is_loopback(self.host):
            raise ValueError(
                f"refusing to listen on {self.host} without a token: anyone who reaches it "
                "could run code. Give one with --token-file or GRPO_SANDBOX_TOKEN, or listen "
                "on 127.0.0.1"
            )


class _Refused(Exception):
    """A request answered with an error status and a message; no code ran for it."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


def check_limits(limits: Limits, ceiling: Limits, where: str) -> None:
    """Refuse (``WireError``) limits over ``ceiling``, and any network access.

    >>> check_limits(Limits(timeout_s=5), Limits(timeout_s=10), "job.limits")
    >>> check_limits(Limits(timeout_s=50.0), Limits(timeout_s=10.0), "job.limits")
    Traceback (most recent call last):
    ...
    sandbox.wire.WireError: job.limits.timeout_s: 50.0 is over this service's maximum 10.0
    """
    if limits.network:
        raise wire.WireError(f"{where}.network: this service never grants network access")
    for item in dataclasses.fields(Limits):
        value, most = getattr(limits, item.name), getattr(ceiling, item.name)
        if item.name == "cpu_s":
            value, most = limits.effective_cpu_s, ceiling.effective_cpu_s
        if isinstance(value, bool) or value is None:
            continue
        if value > most:
            raise wire.WireError(
                f"{where}.{item.name}: {value} is over this service's maximum {most}"
            )


def worst_case_s(job: TestJob, default: Limits) -> float:
    """Return the longest a test job may take at its limits (the sandbox's own bound).

    Function-call tests run in rounds: the program is restarted after a test it died or hung
    in, each round bounded by ``timeout_s + remaining tests x per_test``; with
    ``stop_on_program_failure`` there is no second round.
    """
    lim = job.limits if job.limits is not None else default
    per_test = job.per_test_timeout_s or lim.timeout_s
    if job.tests and isinstance(job.tests[0], CallTest):
        if job.stop_on_program_failure:
            return lim.timeout_s + per_test * len(job.tests) + 1.0
        return (lim.timeout_s + per_test + 1.0) * (len(job.tests) + 1)
    return (job.compile_timeout_s or 0.0) + per_test * len(job.tests)


class _Admission:
    """Tickets for requests (``workers + max_queue``) and slots for runs (``workers``).

    Only the event loop's thread touches the counters. A run's slot is released when its thread
    ends, not when its request does: a cancelled request does not free a worker still running.
    """

    def __init__(self, workers: int, max_queue: int) -> None:
        self.workers, self.max_queue = workers, max_queue
        self.tickets = 0
        self.running = 0
        self._slots: asyncio.Semaphore | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, "sandbox-service")

    @contextlib.contextmanager
    def ticket(self) -> Iterator[None]:
        """Admit one request for its whole life, or refuse it (429) at once."""
        if self.tickets >= self.workers + self.max_queue:
            raise _Refused(
                429,
                f"over capacity: {self.running} running, {self.waiting} waiting "
                f"(workers={self.workers}, max_queue={self.max_queue})",
                {"Retry-After": "1"},
            )
        self.tickets += 1
        try:
            yield
        finally:
            self.tickets -= 1

    @property
    def waiting(self) -> int:
        """Requests admitted and not running (a cancelled request's run still counts running)."""
        return max(0, self.tickets - self.running)

    async def run(self, fn: Callable[[], _T]) -> _T:
        """Run the blocking ``fn`` on a worker thread once a slot is free; its result."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        slots = self._slots
        await slots.acquire()
        self.running += 1
        loop = asyncio.get_running_loop()

        def release(_: object) -> None:
            self.running -= 1
            slots.release()

        try:
            future = self._pool.submit(fn)
        except BaseException:
            release(None)
            raise

        def release_soon(done: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to release
                loop.call_soon_threadsafe(release, done)

        future.add_done_callback(release_soon)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass
class _Counts:
    """What ``/health`` reports: answers per endpoint and refusals per status code."""

    served: Counter[str] = field(default_factory=Counter)
    refused: Counter[int] = field(default_factory=Counter)


class _Service:
    """The handlers, sharing one Sandbox, its settings, the admission and the counts."""

    def __init__(self, settings: ServiceSettings, sandbox: Sandbox) -> None:
        check_limits(sandbox.limits, settings.max_limits, "the sandbox's default limits")
        if settings.workers > sandbox.workers:
            # The extra runs would wait inside the Sandbox, counted as running by /health.
            raise ValueError(
                f"ServiceSettings.workers={settings.workers} is more than the Sandbox's "
                f"{sandbox.workers} slot servers"
            )
        self.settings, self.sandbox = settings, sandbox
        self.admission = _Admission(settings.workers, settings.max_queue)
        self.counts = _Counts()
        self._token = settings.token.encode() if settings.token is not None else None

    # -- the request pipeline --------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        if self._token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, credentials = given.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode(), self._token
        )
        if not ok:
            raise _Refused(
                401,
                "a valid 'Authorization: Bearer <token>' header is required",
                {"WWW-Authenticate": "Bearer"},
            )

    async def _body(self, request: Request) -> object:
        limit = self.settings.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise _Refused(400, f"invalid Content-Length {declared[:40]!r}")
            if int(declared) > limit:
                raise _Refused(413, f"the body takes {declared} bytes, over the limit of {limit}")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.read_timeout_s):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise _Refused(413, f"the body is over the limit of {limit} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            raise _Refused(408, "the body did not arrive in time") from None
        except ClientDisconnect:
            raise _Refused(400, "the client disconnected before its body arrived") from None
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, deep nesting
            raise _Refused(400, f"invalid JSON: {str(exc)[:200]}") from None

    async def _handle(
        self, request: Request, answer: Callable[[object], Awaitable[object]]
    ) -> Response:
        """Authorize, admit, read and answer one code-running request; count the outcome."""
        path = request.url.path
        try:
            self._authorize(request)
            with self.admission.ticket():
                data = await self._body(request)
                reply = await answer(data)
        except _Refused as exc:
            self.counts.refused[exc.status] += 1
            return JSONResponse({"detail": str(exc)}, exc.status, headers=exc.headers)
        except wire.WireError as exc:
            self.counts.refused[400] += 1
            return JSONResponse({"detail": str(exc)}, 400)
        except LanguageUnavailableError as exc:
            # SandboxFusion answers a language it does not run with 422 (request validation).
            self.counts.refused[422] += 1
            message = f"{exc} (this service runs: {', '.join(self.sandbox.languages)})"
            return JSONResponse({"detail": message}, 422)
        except SandboxClosedError:
            self.counts.refused[503] += 1
            return JSONResponse({"detail": "the service is shutting down"}, 503)
        self.counts.served[path] += 1
        return JSONResponse(reply)

    async def _call(self, fn: Callable[[], _T]) -> _T:
        """Run a sandbox call on a worker; its argument errors are the request's (400)."""
        try:
            return await self.admission.run(fn)
        except (TypeError, ValueError) as exc:
            raise _Refused(400, str(exc)) from None

    def _check_time(self, seconds: float, where: str) -> None:
        if seconds > self.settings.max_request_s:
            raise wire.WireError(
                f"{where}: its runs may take {seconds:g} s at their limits, over this service's "
                f"maximum of {self.settings.max_request_s:g} s per request"
            )

    # -- endpoints -----------------------------------------------------------------------------
    async def run_tests(self, request: Request) -> Response:
        async def answer(data: object) -> object:
            job = wire.decode_job(data)
            ceiling = self.settings.max_limits
            if job.limits is not None:
                check_limits(job.limits, ceiling, "job.limits")
            if job.per_test_timeout_s is not None and job.per_test_timeout_s > ceiling.timeout_s:
                raise wire.WireError(
                    f"job.per_test_timeout_s: {job.per_test_timeout_s} is over this service's "
                    f"maximum {ceiling.timeout_s}"
                )
            self._check_time(worst_case_s(job, self.sandbox.limits), "job")
            report: TestReport = await self._call(lambda: self.sandbox.run_tests_many([job])[0])
            return {"version": wire.WIRE_VERSION, "report": wire.encode_report(report)}

        return await self._handle(request, answer)

    async def run(self, request: Request) -> Response:
        async def answer(data: object) -> object:
            job = wire.decode_run(data)
            limits = job.limits if job.limits is not None else self.sandbox.limits
            check_limits(limits, self.settings.max_limits, "run.limits")
            self._check_time(limits.timeout_s + (job.compile_timeout_s or 0.0), "run")
            result: ExecResult = await self._call(
                lambda: self.sandbox.run(
                    job.code,
                    job.stdin,
                    job.files,
                    job.limits,
                    language=job.language,
                    compile_timeout_s=job.compile_timeout_s,
                )
            )
            return {"version": wire.WIRE_VERSION, "result": wire.encode_exec_result(result)}

        return await self._handle(request, answer)

    async def run_code(self, request: Request) -> Response:
        async def answer(data: object) -> object:
            req = fusion.decode_run_code_request(data)
            prepared = _prepare_fusion(req, self.sandbox.limits, self.settings.max_limits)
            if req.language not in self.sandbox.languages:  # refused before a worker is taken
                _refuse_language(req.language)
            self._check_time(prepared.limits.timeout_s + req.compile_timeout, "request")
            result = await self._call(
                lambda: run_fusion_program(
                    self.sandbox,
                    req.language,
                    prepared.code,
                    prepared.stdin,
                    prepared.files,
                    prepared.limits,
                    req.compile_timeout,
                )
            )
            response = _fusion_response(result, prepared.fetch)
            return fusion.encode_run_code_response(response)

        return await self._handle(request, answer)

    async def ping(self, request: Request) -> Response:
        return JSONResponse("pong")

    async def health(self, request: Request) -> Response:
        adm = self.admission
        return JSONResponse(
            {
                "status": "ok",
                "version": wire.WIRE_VERSION,
                "workers": adm.workers,
                "max_queue": adm.max_queue,
                "in_flight": adm.running,
                "waiting": adm.waiting,
                "served": dict(self.counts.served),
                "refused": {str(k): v for k, v in self.counts.refused.items()},
                "isolation": list(self.sandbox.isolation),
                "languages": list(self.sandbox.languages),
                "default_limits": wire.encode_limits(self.sandbox.limits),
                "max_limits": wire.encode_limits(self.settings.max_limits),
                "max_request_bytes": self.settings.max_request_bytes,
                "max_request_s": self.settings.max_request_s,
                "token_required": self._token is not None,
            }
        )


# -- /run_code: SandboxFusion's request onto the sandbox, and back -----------------------------


def run_fusion_program(
    sandbox: Sandbox,
    language: str,
    code: str,
    stdin: str,
    files: dict[str, str],
    limits: Limits,
    compile_timeout_s: float,
) -> ExecResult:
    """Run one ``/run_code`` program in ``language`` (compiled first where it is compiled).

    Raises ``LanguageUnavailableError`` for a language SandboxFusion knows but this machine
    has no toolchain for (the service answers 422, as SandboxFusion does).
    """
    return sandbox.run(
        code,
        stdin=stdin,
        files=files,
        limits=limits,
        language=language,
        compile_timeout_s=compile_timeout_s,
    )


@dataclass(frozen=True)
class _FusionRun:
    """A ``/run_code`` request made into a sandbox run."""

    code: str
    stdin: str
    files: dict[str, str]
    limits: Limits
    fetch: _Fetch | None


@dataclass(frozen=True)
class _Fetch:
    """How the fetched files come back: after ``boundary`` at the end of stdout."""

    boundary: str
    names: tuple[str, ...]


def _prepare_fusion(req: fusion.RunCodeRequest, default: Limits, ceiling: Limits) -> _FusionRun:
    """Make ``req`` a sandbox run: limits (checked against ``ceiling``), text files, fetch."""
    memory = req.memory_limit_MB if req.memory_limit_MB > 0 else default.memory_mb
    for name, value, most in (
        ("run_timeout", req.run_timeout, ceiling.timeout_s),
        ("compile_timeout", req.compile_timeout, ceiling.timeout_s),
        ("memory_limit_MB", memory, ceiling.memory_mb),
    ):
        if value > most:
            raise wire.WireError(f"request.{name}: {value} is over this service's maximum {most}")
    try:
        limits = dataclasses.replace(
            default, timeout_s=req.run_timeout, cpu_s=None, memory_mb=memory
        )
    except ValueError as exc:
        raise wire.WireError(f"request.run_timeout or memory_limit_MB: {exc}") from None
    check_limits(limits, ceiling, "request")
    files: dict[str, str] = {}
    for name, content in fusion.decode_files(req.files, "request.files").items():
        if "IGNORE_THIS_FILE" in name:  # SandboxFusion's runners skip such entries
            continue
        try:
            files[name] = content.decode("utf-8")
        except UnicodeDecodeError:
            raise wire.WireError(
                f"request.files[{name!r}]: not UTF-8 text (this sandbox's files are text)"
            ) from None
    try:
        files = check_files(files)
        check_files(dict.fromkeys(req.fetch_files, ""))
    except (TypeError, ValueError) as exc:
        raise wire.WireError(f"request.files: {exc}") from None
    stdin = req.stdin or ""
    if req.fetch_files and req.language != "python":
        # The files are collected by a Python wrapper around the program (``_fetch_wrapper``).
        raise wire.WireError("request.fetch_files: this service fetches files of python runs only")
    if not req.fetch_files:
        return _FusionRun(req.code, stdin, files, limits, None)
    fetch = _Fetch(f"\x00grpo-fetch-{secrets.token_hex(16)}\x00", req.fetch_files)
    main = f"_run_code_{secrets.token_hex(4)}.py"
    files[main] = req.code
    return _FusionRun(_fetch_wrapper(main, fetch), stdin, files, limits, fetch)


def _fetch_wrapper(main: str, fetch: _Fetch) -> str:
    """Return a program that runs ``main`` as ``python main`` would, then prints the files.

    The program runs in a process of its own, so that nothing it does (``os._exit``, a signal)
    skips the fetch, and its stdout stays its own up to the boundary. It can print a boundary
    too (it can read this program), but what it could forge is only the split between its own
    stdout and its own files.
    """
    return (
        "import base64, json, os, subprocess, sys\n"
        f"rc = subprocess.call([sys.executable, '-I', '-S', {main!r}])\n"
        "files = {}\n"
        f"for name in {list(fetch.names)!r}:\n"
        "    try:\n"
        "        with open(name, 'rb') as f:\n"
        "            files[name] = base64.b64encode(f.read()).decode('ascii')\n"
        "    except OSError:\n"
        "        pass\n"
        "payload = json.dumps({'return_code': rc, 'files': files})\n"
        f"os.write(1, ('\\n' + {fetch.boundary!r} + payload + '\\n').encode())\n"
        "os._exit(rc if 0 <= rc < 256 else 1)\n"
    )


def _split_fetched(stdout: str, fetch: _Fetch) -> tuple[str, dict[str, str], int | None]:
    """Split stdout into the program's own, the fetched files and its return code (or None)."""
    at = stdout.rfind("\n" + fetch.boundary)
    if at < 0:
        return stdout, {}, None
    try:
        payload = json.loads(stdout[at + 1 + len(fetch.boundary) :])
        files = payload["files"]
        rc = payload["return_code"]
        if not (isinstance(files, dict) and isinstance(rc, int)):
            raise TypeError
        for name, content in files.items():
            if name not in fetch.names or not isinstance(content, str):
                raise TypeError
            base64.b64decode(content, validate=True)
    except (ValueError, TypeError, KeyError, binascii.Error):
        return stdout, {}, None
    return stdout[:at], files, rc


def _fusion_response(result: ExecResult, fetch: _Fetch | None) -> fusion.RunCodeResponse:
    """Report ``result`` as SandboxFusion reports a run (its ``parse_run_status``)."""
    files: dict[str, str] = {}
    stdout, return_code = result.stdout, result.exit_code
    if fetch is not None:
        stdout, files, fetched_rc = _split_fetched(result.stdout, fetch)
        if fetched_rc is not None and result.status in (Status.OK, Status.RUNTIME_ERROR):
            return_code = fetched_rc
    if result.status is Status.SANDBOX_ERROR:
        # As SandboxFusion reports a runner's failure: no time, no output, the reason twice.
        run = fusion.CommandRunResult(fusion.CommandStatus.ERROR, None, None, None, result.detail)
        return fusion.RunCodeResponse(fusion.RunStatus.SANDBOX_ERROR, result.detail, None, run)
    compiled = _fusion_compile_result(result.compile)
    if result.status is Status.COMPILE_ERROR:  # SandboxFusion: no run_result after a failed compile
        return fusion.RunCodeResponse(fusion.RunStatus.FAILED, "", compiled, None, None, files)
    if result.status is Status.TIMEOUT:
        status, return_code = fusion.CommandStatus.TIME_LIMIT_EXCEEDED, None
    else:  # it ended: exited (an error exit for MEMORY), or was killed (-signal)
        status = fusion.CommandStatus.FINISHED
        if return_code is None:
            return_code = 1
    run = fusion.CommandRunResult(status, result.wall_s, return_code, stdout, result.stderr)
    ok = status is fusion.CommandStatus.FINISHED and return_code == 0
    overall = fusion.RunStatus.SUCCESS if ok else fusion.RunStatus.FAILED
    return fusion.RunCodeResponse(overall, "", compiled, run, None, files)


def _refuse_language(name: str) -> NoReturn:
    """Raise ``LanguageUnavailableError`` for a language SandboxFusion knows and we do not run.

    One of ours without its toolchain here says which program is missing.
    """
    if name in {lang.value for lang in Language}:
        require_language(name)
    raise LanguageUnavailableError(f"language {name!r} is not one this sandbox runs")


def _fusion_compile_result(result: CompileResult | None) -> fusion.CommandRunResult | None:
    """Report a compile step as SandboxFusion does: the compiler's exit code, or over time.

    None for languages that are not compiled.
    """
    if result is None:
        return None
    if result.status is Status.TIMEOUT:
        status, code = fusion.CommandStatus.TIME_LIMIT_EXCEEDED, None
    elif result.status is Status.SANDBOX_ERROR:
        status, code = fusion.CommandStatus.ERROR, None
    else:  # ok, the compiler's refusal, or a compile bomb stopped at a memory/output limit
        status = fusion.CommandStatus.FINISHED
        code = result.exit_code if result.exit_code is not None else 1
    return fusion.CommandRunResult(status, result.wall_s, code, result.stdout, result.stderr)


def build_app(settings: ServiceSettings, sandbox: Sandbox) -> Starlette:
    """Return the service's app over ``sandbox`` (owned by the caller, who closes it)."""
    service = _Service(settings, sandbox)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.admission.close)

    app = Starlette(
        routes=[
            Route(wire.RUN_TESTS_PATH, service.run_tests, methods=["POST"]),
            Route(wire.RUN_PATH, service.run, methods=["POST"]),
            Route(wire.RUN_CODE_PATH, service.run_code, methods=["POST"]),
            Route(wire.HEALTH_PATH, service.health, methods=["GET"]),
            Route(PING_PATH, service.ping, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.service = service
    return app


__all__ = [
    "DEFAULT_MAX_LIMITS",
    "PING_PATH",
    "ServiceSettings",
    "build_app",
    "check_limits",
    "is_loopback",
    "run_fusion_program",
]
