"""The parent side: a pool of slot servers and the public ``Sandbox`` API.

Each worker slot has one slot server S (``_slot_server.py``, handle: ``_SlotHandle``), started from
``/usr/bin/python3 -I -S`` with an empty environment, so the untrusted children below it inherit
no secret, no GPU handle and no import state of this process. The parent only ever exchanges
length-prefixed JSON frames with it and rebuilds typed results field by field (no pickle).

Why one module over 500 lines: the slot protocol (request ids, replies, discarding a slot whose
call did not complete) and the public API that drives it are read together to check that no
reply can ever be attached to another job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.util
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from sandbox import _codec, _compiled, _slot, languages
from sandbox.languages import Language, Toolchain
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
    check_files,
    check_seconds,
)

_SLOT_SERVER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_slot_server.py")
#: A system interpreter readable by every uid (a pyenv/venv interpreter under /root is not).
SYSTEM_PYTHON = "/usr/bin/python3"
#: How long past a job's own time budget the parent waits for a slot server before restarting it.
_SLACK_S = 10.0
_START_TIMEOUT_S = 30.0
#: The longest single select() (longer waits loop).
_MAX_WAIT_S = 3600.0
_T = TypeVar("_T")
_R = TypeVar("_R")


def _check_size(texts: Sequence[str], what: str, reserve: int = 0) -> None:
    """Refuse a request over ``MAX_REQUEST_BYTES`` before it is sent (ValueError naming it).

    ``reserve``: bytes the request will carry besides ``texts`` (a compiled program).
    """
    size = _codec.texts_size(texts) + reserve
    if size > MAX_REQUEST_BYTES:
        raise ValueError(
            f"{what} take {size} bytes (UTF-8, 4 more per text), over the limit of "
            f"{MAX_REQUEST_BYTES} bytes (64 MiB, sandbox.MAX_REQUEST_BYTES)"
        )


def _check_files_fit(files: dict[str, str], limits: Limits) -> None:
    """Refuse input files that cannot fit in the run's private /tmp (2 x max_file_mb)."""
    tmp_bytes = max(16, 2 * limits.max_file_mb) << 20
    size = sum(_codec.text_size(content) for content in files.values())
    if size > tmp_bytes:
        raise ValueError(
            f"the input files take {size} bytes, more than the run's /tmp holds "
            f"({tmp_bytes >> 20} MiB = 2 x Limits.max_file_mb, at least 16): raise max_file_mb"
        )


class _SlotError(RuntimeError):
    """The slot server died, hung or answered garbage; the slot has been restarted."""


def _pick_python() -> str:
    if os.access(SYSTEM_PYTHON, os.X_OK):
        return SYSTEM_PYTHON
    return sys.executable


def _pyseccomp_path() -> str | None:
    spec = importlib.util.find_spec("pyseccomp")
    return spec.origin if spec is not None and spec.origin else None


def _limits_payload(limits: Limits) -> dict[str, object]:
    return {
        "timeout_s": limits.timeout_s,
        "cpu_s": limits.effective_cpu_s,
        "memory_mb": limits.memory_mb,
        "output_bytes": limits.output_bytes,
        "max_processes": limits.max_processes,
        "max_file_mb": limits.max_file_mb,
        "network": limits.network,
    }


def clean_text(text: str) -> str:
    r"""Text that came out of untrusted code, made safe for any consumer (the boundary's filter).

    Lone surrogates (``chr(0xD800)`` in an exception message, a return value or a test's
    detail) survive JSON and Python strings but make every UTF-8 writer raise
    ``UnicodeEncodeError`` (a JSONL sample store, a log file). They become ``\udXXX``
    escapes here, once, so that nothing downstream needs to care.

    >>> clean_text("ok é")
    'ok é'
    >>> clean_text("a" + chr(0xD800) + "b")
    'a\\ud800b'
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _str(reply: dict[str, object], key: str) -> str:
    value = reply.get(key, "")
    if not isinstance(value, str):
        raise _SlotError(f"malformed reply field {key!r}")
    return clean_text(value)


def _float(reply: dict[str, object], key: str) -> float:
    value = reply.get(key, 0.0)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _SlotError(f"malformed reply field {key!r}")
    return float(value)


def _layers(reply: dict[str, object]) -> tuple[str, ...]:
    value = reply.get("isolation", [])
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise _SlotError("malformed isolation list")
    return tuple(x for x in value if x in ALL_LAYERS)


class _SlotHandle:
    """One slot server process and its framed pipe protocol."""

    def __init__(
        self, python: str, debug: bool, limits: Limits, expose_dirs: Sequence[str] = ()
    ) -> None:
        config = {
            "pyseccomp": _pyseccomp_path(),
            "debug": debug,
            "default_limits": _limits_payload(limits),  # to prepare the first child ahead
            "expose_dirs": list(expose_dirs),  # toolchains below hidden folders (rustc)
        }
        self.proc = subprocess.Popen(
            [python, "-I", "-S", _SLOT_SERVER_SCRIPT, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if debug else subprocess.DEVNULL,
            env={},  # the slot server and everything below it start with NO environment
            cwd="/",
            close_fds=True,
            start_new_session=True,  # group kills from anywhere below cannot reach us
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in = self.proc.stdin.fileno()
        self._out = self.proc.stdout.fileno()
        self._reader = _codec.FrameReader(max_size=1 << 30)
        self.layers: tuple[str, ...] = ()
        self.broken = False
        self._request_id = 0
        self.uid = -1
        self.template_pid = -1
        self.probe_status = self.probe_detail = ""

    def wait_ready(self) -> _SlotHandle:
        """Wait for the slot server's start-up report (layers detected by its probe run)."""
        hello = self._receive(time.monotonic() + _START_TIMEOUT_S)
        self.layers = _layers(hello)
        uid = hello.get("uid", -1)
        self.uid = uid if isinstance(uid, int) and not isinstance(uid, bool) else -1
        template = hello.get("template_pid", -1)
        self.template_pid = template if isinstance(template, int) else -1
        self.probe_status = _str(hello, "probe_status")
        self.probe_detail = _str(hello, "probe_detail")
        return self

    def _receive(self, deadline: float, request_id: int | None = None) -> dict[str, object]:
        frames: list[bytes] = []
        while not frames:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _SlotError("the slot server did not answer in time")
            # select() rejects timeouts beyond ~2^63 ns (OverflowError): wait in bounded steps.
            ready, _, _ = select.select([self._out], [], [], min(remaining, _MAX_WAIT_S))
            if not ready:
                continue
            data = os.read(self._out, _codec.READ_CHUNK)
            if not data:
                raise _SlotError(f"the slot server exited (status {self.proc.poll()})")
            try:
                frames = self._reader.feed(data)
            except _codec.CodecError as exc:
                raise _SlotError(str(exc)) from None
        if len(frames) != 1:
            raise _SlotError("unexpected extra frames from the slot server")
        reply = _codec.loads(frames[0])
        if not isinstance(reply, dict):
            raise _SlotError("malformed reply")
        if request_id is not None and reply.get("id") != request_id:
            # Never attach one job's reply to another: the slot is discarded.
            raise _SlotError(f"reply for request {reply.get('id')!r}, expected {request_id}")
        if "error" in reply:
            raise _SlotError(f"slot server error: {reply['error']}")
        return reply

    def request(self, message: dict[str, object], budget_s: float) -> dict[str, object]:
        """Send one request and wait for its reply (the slot server enforces the real limits).

        Every request carries a fresh id that the reply must echo. A call that does not end
        with its own reply (an error, or any exception in this thread: KeyboardInterrupt, a
        signal handler raising, a timeout) leaves the slot ``broken``: the caller kills it and
        never sends it another request.
        """
        self.broken = True
        self._request_id += 1
        request_id = self._request_id
        try:
            _codec.write_frame(self._in, _codec.dumps({**message, "id": request_id}))
        except OSError as exc:
            raise _SlotError(f"the slot server is gone: {exc}") from None
        reply = self._receive(time.monotonic() + budget_s + _SLACK_S, request_id)
        self.broken = False
        return reply

    def stop(self, terminate: bool) -> None:
        """Stop the slot server and remove what it left; its pipes stay open (``close``).

        Closing its stdin makes it clean up and exit; ``terminate`` (a call may be in flight)
        sends SIGTERM, on which it cleans up at once. Whatever it could not remove (it was
        killed) is removed here. The pipes are left to the thread that may be reading them:
        closing an fd another thread waits on could hand its number to an unrelated file.
        """
        try:
            if self.proc.stdin is not None and not terminate:
                self.proc.stdin.close()
            if terminate or self.broken:
                self.proc.terminate()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        if self.uid > 0:
            _remove_slot_leftovers(self.uid)

    def close(self) -> None:
        """Stop the slot server (``stop``) and close its pipes."""
        self.stop(terminate=False)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _remove_slot_leftovers(uid: int) -> None:
    """Remove the cgroups and uid lock of a slot whose server is gone (killed, or crashed).

    Only while this process holds the uid's lock: a slot server that exited normally removed
    both (no lock file), and a new slot that took the uid meanwhile holds the lock, so its
    cgroups are never touched.
    """
    for lock_dir in _slot.LOCK_DIRS:
        path = f"{lock_dir}/{uid}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                continue
            for cgroup in _slot.cgroup_dirs(uid):
                _slot.remove_cgroup(cgroup)
            os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(lock_dir)
        except OSError:
            pass
        finally:
            os.close(fd)


@dataclass(frozen=True)
class _Prepared:
    """A validated run request."""

    message: dict[str, object]
    limits: Limits
    budget_s: float


class Sandbox:
    """Run untrusted Python programs in isolated children, prepared ahead by each slot server.

    Use as a context manager (or call ``close()``); every method is thread-safe, and
    ``run_many``/``run_tests_many`` spread jobs over ``workers`` slot servers.

    Args:
        limits: default limits for runs that do not pass their own.
        workers: number of slot servers (parallel runs); defaults to ``os.cpu_count()``.
        strict: refuse to start (``SandboxUnavailableError``) unless every layer in
            ``ALL_LAYERS`` is available (``net_ns`` excepted when ``limits.network``), and refuse
            any run in which one of them could not be applied.
        required_layers: layers to require like ``strict`` does, instead of all of them.
        python: the interpreter for the slot servers; by default ``/usr/bin/python3``.
        debug: let the slot servers write their own errors to this process's stderr.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        workers: int | None = None,
        *,
        strict: bool = False,
        required_layers: Iterable[str] | None = None,
        python: str | None = None,
        debug: bool = False,
    ) -> None:
        self.limits = limits if limits is not None else Limits()
        if not isinstance(self.limits, Limits):
            raise TypeError(f"limits must be a sandbox.Limits, got {type(limits).__name__}")
        if workers is not None and (
            isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 1024
        ):
            raise ValueError(f"workers must be an int in [1, 1024] (or None), got {workers!r}")
        self.workers = workers if workers is not None else (os.cpu_count() or 1)
        required = set(required_layers or ())
        if strict:
            required |= set(ALL_LAYERS)
            if self.limits.network:
                required.discard("net_ns")
        unknown = required - set(ALL_LAYERS)
        if unknown:
            raise ValueError(f"unknown isolation layers {sorted(unknown)}; known: {ALL_LAYERS}")
        self.required_layers = tuple(layer for layer in ALL_LAYERS if layer in required)
        self._python = python or _pick_python()
        self._debug = debug
        self.languages: tuple[Language, ...] = languages.available_languages()
        """The languages whose toolchains are installed here (``sandbox.Language``)."""
        toolchains = [languages.require_language(lang) for lang in self.languages]
        languages.prepare_cache_dirs(toolchains)  # they must exist to be exposed
        self._expose_dirs = sorted(
            {d for tc in toolchains for d in tc.expose_dirs if os.path.isdir(d)}
        )
        self._lock = threading.Lock()
        self._closed = False
        self.owner_pid = os.getpid()
        """The process that made this Sandbox, the only one that may use it."""
        self._idle: queue.Queue[_SlotHandle] = queue.Queue()
        self._all: list[_SlotHandle] = []
        self._busy: set[_SlotHandle] = set()
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sandbox")
        try:
            # Start every slot server first, then wait: they start up in parallel.
            for _ in range(self.workers):
                self._all.append(_SlotHandle(self._python, debug, self.limits, self._expose_dirs))
            for slot in self._all:
                self._idle.put(slot.wait_ready())
        except (_SlotError, OSError) as exc:
            self.close()
            raise SandboxUnavailableError(f"a slot server failed to start: {exc}") from exc
        except BaseException:
            self.close()
            raise
        first = self._all[0]
        if first.probe_status != "ok":
            self.close()
            raise SandboxUnavailableError(
                f"the sandbox cannot run programs here: {first.probe_detail or first.probe_status}"
            )
        self.isolation: tuple[str, ...] = first.layers
        """The layers every run gets on this machine (detected at start-up)."""
        missing = [layer for layer in self.required_layers if layer not in self.isolation]
        if missing:
            self.close()
            raise SandboxUnavailableError(
                f"required isolation layers unavailable on this machine: {', '.join(missing)} "
                f"(available: {', '.join(self.isolation)}); run as root on Linux >= 5.13 with "
                "namespaces, cgroup v1 and Landlock, or relax strict/required_layers"
            )

    @property
    def uids(self) -> tuple[int, ...]:
        """The unprivileged uids the runs of this Sandbox use (for audits; empty if not root)."""
        return tuple(slot.uid for slot in self._all if slot.uid > 0)

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every slot server (and with them anything they started).

        A call running in another thread meanwhile raises ``SandboxClosedError`` there; when
        ``close`` returns, no process of the sandbox is left. In a process forked from the one
        that made the Sandbox, nothing is stopped: the slot servers are the parent's.
        """
        if os.getpid() != self.owner_pid:
            self._closed = True  # no lock: another thread may have held it at the fork
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            busy = set(self._busy)
        for slot in self._all:
            # A slot in use is stopped under its call (SIGTERM: its thread gets EOF and
            # closes the pipes); an idle one is stopped and closed here.
            if slot in busy:
                slot.stop(terminate=True)
            else:
                slot.close()
        self._executor.shutdown(wait=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def _check_usable(self) -> None:
        """Refuse a call after ``close()`` or from a forked child (see the error types)."""
        if os.getpid() != self.owner_pid:
            raise SandboxForkedError(
                f"this Sandbox belongs to process {self.owner_pid}, and process {os.getpid()} "
                "is a fork of it: its slot servers, pipes and request ids are the parent's, so "
                "results could be attached to the other process's jobs. Make a new Sandbox in "
                "the child."
            )
        if self._closed:
            raise SandboxClosedError("the Sandbox is closed")

    # -- slots ---------------------------------------------------------------------------------
    def _call(self, message: dict[str, object], budget_s: float) -> dict[str, object]:
        self._check_usable()
        slot = self._idle.get()
        with self._lock:
            if self._closed:
                self._idle.put(slot)
                raise SandboxClosedError("the Sandbox is closed")
            self._busy.add(slot)
        try:
            if slot.broken:  # a call on it did not complete: restart it before any use
                slot = self._replace(slot)
            return slot.request(message, budget_s)
        except _SlotError:
            if self._closed:
                raise SandboxClosedError(
                    "the Sandbox was closed while this call was running"
                ) from None
            # Replace the broken slot server; the caller turns this into a SANDBOX_ERROR result.
            # If no replacement starts, the dead slot goes back and the next call retries.
            slot = self._replace(slot)
            raise
        finally:
            if slot.broken or self._closed:
                # Interrupted (KeyboardInterrupt, a signal handler raising, ...): the slot may
                # still owe a reply. Stop it now; the next call that takes it starts a new one.
                # Closed meanwhile: ``close`` stopped it, its pipes are closed here.
                slot.close()
            with self._lock:
                self._busy.discard(slot)
            self._idle.put(slot)

    def _replace(self, slot: _SlotHandle) -> _SlotHandle:
        """Stop ``slot`` and start a fresh slot server in its place (``_SlotError`` if none)."""
        slot.close()
        if self._closed:
            raise SandboxClosedError("the Sandbox was closed while this call was running")
        try:
            replacement = _SlotHandle(
                self._python, self._debug, self.limits, self._expose_dirs
            ).wait_ready()
        except (_SlotError, OSError):
            raise _SlotError("the slot server died and could not be restarted") from None
        with self._lock:
            if not self._closed:
                self._all[self._all.index(slot)] = replacement
                self._busy.discard(slot)
                self._busy.add(replacement)
                return replacement
        replacement.close()  # closed while it started: it must not outlive close()
        raise SandboxClosedError("the Sandbox was closed while this call was running")

    # -- run -----------------------------------------------------------------------------------
    def _prepare(
        self, code: str, stdin: str, files: dict[str, str] | None, limits: Limits | None
    ) -> _Prepared:
        if not isinstance(code, str) or not isinstance(stdin, str):
            raise TypeError("code and stdin must be str")
        lim = limits if limits is not None else self.limits
        if not isinstance(lim, Limits):
            raise TypeError(f"limits must be a sandbox.Limits, got {type(lim).__name__}")
        checked = check_files(files)
        texts = [code, stdin]
        for name, content in checked.items():
            texts += (name, content)
        _check_size(texts, "code, stdin and files")
        _check_files_fit(checked, lim)
        message: dict[str, object] = {
            "op": "run",
            "code": code,
            "stdin": stdin,
            "files": checked,
            "limits": _limits_payload(lim),
            "required": list(self.required_layers),
        }
        return _Prepared(message, lim, lim.timeout_s)

    def _execute(self, prepared: _Prepared) -> ExecResult:
        start = time.monotonic()
        try:
            reply = self._call(prepared.message, prepared.budget_s)
            return _exec_result(reply)
        except _SlotError as exc:
            return ExecResult(
                status=Status.SANDBOX_ERROR,
                stdout="",
                stderr="",
                exit_code=None,
                wall_s=time.monotonic() - start,
                isolation=(),
                detail=clean_text(str(exc)),
            )

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
        """Run a program with ``stdin`` and extra ``files`` in its work dir.

        ``language``: one of ``sandbox.Language`` (``ValueError`` for others,
        ``LanguageUnavailableError`` when its toolchain is missing here). A compiled language
        is compiled first, in the sandbox, within ``compile_timeout_s`` (default: the
        toolchain's); a compile that fails ends as ``COMPILE_ERROR`` (``ExecResult.compile``).
        Never raises for anything the program does; bad arguments raise TypeError/ValueError.
        """
        self._check_usable()
        return self._execute_any(
            self._prepare_any(code, stdin, files, limits, language, compile_timeout_s)
        )

    def run_many(self, jobs: Sequence[str | Job]) -> list[ExecResult]:
        """Run many programs in parallel over the workers; results are in input order."""
        self._check_usable()
        prepared = [
            self._prepare(job, "", None, None)
            if isinstance(job, str)
            else self._prepare_any(
                job.code, job.stdin, job.files, job.limits, job.language, job.compile_timeout_s
            )
            for job in jobs
        ]
        return self._map(self._execute_any, prepared)

    # -- other languages -----------------------------------------------------------------------
    def _toolchain(self, language: object, compile_timeout_s: float | None) -> Toolchain | None:
        """Return the toolchain of a language other than Python (None for Python), validated."""
        if compile_timeout_s is not None:
            check_seconds("compile_timeout_s", compile_timeout_s)
        lang = languages.parse_language(language)
        if lang is Language.PYTHON:
            return None
        toolchain = languages.require_language(lang)
        if lang not in self.languages:  # installed after this Sandbox started
            raise languages.LanguageUnavailableError(
                f"language {lang.value!r} was not available when this Sandbox started"
            )
        return toolchain

    def _prepare_any(
        self,
        code: str,
        stdin: str,
        files: dict[str, str] | None,
        limits: Limits | None,
        language: object,
        compile_timeout_s: float | None,
    ) -> _Prepared | _compiled.LanguageRun:
        toolchain = self._toolchain(language, compile_timeout_s)
        if toolchain is None:
            return self._prepare(code, stdin, files, limits)
        if not isinstance(code, str) or not isinstance(stdin, str):
            raise TypeError("code and stdin must be str")
        lim = limits if limits is not None else self.limits
        if not isinstance(lim, Limits):
            raise TypeError(f"limits must be a sandbox.Limits, got {type(lim).__name__}")
        checked = check_files(files)
        reserved = {toolchain.source_name, languages.ARTIFACT_FILE, languages.OUT_DIR}
        clash = sorted(name for name in checked if name.split("/")[0] in reserved)
        if clash:
            raise ValueError(f"file names {clash} are reserved for the {toolchain.language} run")
        texts = [code, stdin, *checked, *checked.values()]
        # Each run also carries the compiled program and its launcher.
        _check_size(texts, "code, stdin and files", languages.RUN_RESERVE_BYTES)
        _check_files_fit(checked, lim)
        timeout = (
            compile_timeout_s if compile_timeout_s is not None else toolchain.compile_timeout_s
        )
        return _compiled.LanguageRun(toolchain, code, stdin, checked, lim, timeout)

    def _execute_any(self, prepared: _Prepared | _compiled.LanguageRun) -> ExecResult:
        if isinstance(prepared, _Prepared):
            return self._execute(prepared)
        built = self._compile(prepared)
        if isinstance(built, ExecResult):
            return built
        artifact, compile_result = built
        try:
            run = self._prepare_run(prepared, prepared.stdin, artifact)
        except ValueError as exc:  # the compiled program does not fit with the input files
            return _compiled.too_large(exc, compile_result)
        result = self._execute(run)
        return dataclasses.replace(
            _compiled.memory_status(result, prepared.toolchain), compile=compile_result
        )

    def _compile(self, run: _compiled.LanguageRun) -> tuple[str, CompileResult | None] | ExecResult:
        """Compile ``run``'s program in the sandbox: its artifact, or the failed result.

        Interpreted languages get their source as the "artifact" (no compile run).
        """
        toolchain = run.toolchain
        if not toolchain.compiled:
            return run.code, None
        languages.ensure_precompiled_header(toolchain)  # C++, once per machine
        lim = run.limits
        compile_limits = Limits(
            timeout_s=run.compile_timeout_s,
            memory_mb=max(lim.memory_mb, toolchain.compile_memory_mb),
            output_bytes=languages.ARTIFACT_MAX_BYTES + 1024,
            max_processes=max(lim.max_processes, 64),
            max_file_mb=max(lim.max_file_mb, 256),
        )
        prepared = self._prepare(
            languages.compile_launcher(toolchain), "", {toolchain.source_name: run.code},
            compile_limits,
        )  # fmt: skip
        prepared.message["limits"] = {
            **_limits_payload(compile_limits),
            "address_space_mb": compile_limits.memory_mb + toolchain.compile_address_space_mb,
        }
        res = self._execute(prepared)
        artifact = languages.artifact_of(res.stdout) if res.status is Status.OK else None
        if res.status is Status.OK and artifact is not None:
            ok = CompileResult(Status.OK, "", res.stderr, res.exit_code, res.wall_s)
            return artifact, ok
        status, detail = _compiled.compile_failure(res, artifact is None, run.compile_timeout_s)
        compile_result = CompileResult(status, "", res.stderr, res.exit_code, res.wall_s)
        return ExecResult(
            status=Status.COMPILE_ERROR,
            stdout="",
            stderr=res.stderr,
            exit_code=res.exit_code,
            wall_s=res.wall_s,
            isolation=res.isolation,
            truncated=res.truncated,
            detail=detail,
            compile=compile_result,
        )

    def _prepare_run(self, run: _compiled.LanguageRun, stdin: str, artifact: str) -> _Prepared:
        """Prepare the sandbox run of ``run``'s program (its launcher, artifact, files)."""
        toolchain = run.toolchain
        name = languages.ARTIFACT_FILE if toolchain.compiled else toolchain.source_name
        prepared = self._prepare(
            languages.run_launcher(toolchain, run.limits.memory_mb), stdin,
            {**run.files, name: artifact}, run.limits,
        )  # fmt: skip
        if toolchain.address_space_mb:
            prepared.message["limits"] = {
                **_limits_payload(run.limits),
                "address_space_mb": run.limits.memory_mb + toolchain.address_space_mb,
            }
        return prepared

    # -- tests ---------------------------------------------------------------------------------
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
        """Judge ``program`` on ``tests``; the verdicts are decided outside the program.

        ``CallTest``: the program runs once (module level), then serves calls from TRUSTED test
        code that runs in a separate verdict process, where ``candidate`` and ``entry_point`` are
        proxies returning plain values. ``IOTest``: the program runs once per test with that stdin
        and this process compares its stdout. See README.md for the full contract.
        ``language`` other than Python: IOTests only; the program is compiled once (compiled
        languages), and a failed compile makes every test ``COMPILE_ERROR``.
        """
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
        return self._run_test_job(self._check_test_job(job))

    def run_tests_many(self, jobs: Sequence[TestJob]) -> list[TestReport]:
        """``run_tests`` for many jobs, in parallel over the workers; reports in input order."""
        self._check_usable()
        checked = [self._check_test_job(job) for job in jobs]
        return self._map(self._run_test_job, checked)

    def _map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        """Map ``fn`` over ``items`` on the workers, in input order.

        ``SandboxClosedError`` if the Sandbox is closed meanwhile.
        """
        try:
            return list(self._executor.map(fn, items))
        except RuntimeError as exc:  # the executor refuses work once shut down
            if self._closed and not isinstance(exc, SandboxClosedError):
                raise SandboxClosedError("the Sandbox was closed during this call") from exc
            raise

    def _check_test_job(self, job: TestJob) -> TestJob:
        if not isinstance(job.program, str) or not isinstance(job.setup, str):
            raise TypeError("program and setup must be str")
        tests = tuple(job.tests)
        if tests and not (
            all(isinstance(t, CallTest) for t in tests) or all(isinstance(t, IOTest) for t in tests)
        ):
            raise TypeError("tests must be all CallTest or all IOTest")
        if (
            tests
            and isinstance(tests[0], CallTest)
            and not (job.entry_point and job.entry_point.isidentifier())
        ):
            raise ValueError("CallTest jobs need entry_point, the name of the function to test")
        toolchain = self._toolchain(job.language, job.compile_timeout_s)
        if toolchain is not None and tests and not isinstance(tests[0], IOTest):
            raise ValueError(
                f"language {job.language!r} takes IOTests only (CallTests need Python)"
            )
        if job.per_test_timeout_s is not None:
            check_seconds("per_test_timeout_s", job.per_test_timeout_s)
        if job.limits is not None and not isinstance(job.limits, Limits):
            raise TypeError(f"limits must be a sandbox.Limits, got {type(job.limits).__name__}")
        if tests and isinstance(tests[0], IOTest):
            for test in tests:  # each IOTest is one run of the program with its stdin
                if not isinstance(test, IOTest) or not isinstance(test.stdin, str):
                    raise TypeError("IOTest.stdin must be str")
                reserve = languages.RUN_RESERVE_BYTES if toolchain is not None else 0
                _check_size([job.program, test.stdin], "the program and a test's stdin", reserve)
        elif tests:
            sources = [t.source for t in tests if isinstance(t, CallTest)]
            if not all(isinstance(source, str) for source in sources):
                raise TypeError("CallTest.source must be str")
            _check_size([job.program, job.setup, *sources], "the program, setup and tests")
        return job

    def _run_test_job(self, job: TestJob) -> TestReport:
        if not job.tests:
            return TestReport(results=(), status=Status.OK, wall_s=0.0, isolation=self.isolation)
        if isinstance(job.tests[0], IOTest):
            return self._run_io_tests(job)
        return self._run_call_tests(job)

    def _run_call_tests(self, job: TestJob) -> TestReport:
        lim = job.limits if job.limits is not None else self.limits
        tests = [t for t in job.tests if isinstance(t, CallTest)]
        per_test = job.per_test_timeout_s or lim.timeout_s
        message: dict[str, object] = {
            "op": "tests",
            "code": job.program,
            "entry_point": job.entry_point,
            "setup": job.setup,
            "tests": [t.source for t in tests],
            "per_test_timeout_s": per_test,
            "stop_on_first_failure": job.stop_on_first_failure,
            "stop_on_program_failure": job.stop_on_program_failure,
            "limits": _limits_payload(lim),
            "required": list(self.required_layers),
        }
        names = [t.name or f"test_{i}" for i, t in enumerate(tests)]
        budget = (lim.timeout_s + per_test + 1.0) * (len(tests) + 1)
        start = time.monotonic()
        try:
            reply = self._call(message, budget)
            return _test_report(reply, names)
        except _SlotError as exc:
            return TestReport(
                results=tuple(
                    TestResult(name, TestStatus.SANDBOX_ERROR, clean_text(str(exc)[:500]))
                    for name in names
                ),
                status=Status.SANDBOX_ERROR,
                wall_s=time.monotonic() - start,
                isolation=(),
            )

    def _run_io_tests(self, job: TestJob) -> TestReport:
        tests = [t for t in job.tests if isinstance(t, IOTest)]
        lim = job.limits if job.limits is not None else self.limits
        if job.per_test_timeout_s is not None:
            lim = dataclasses.replace(lim, timeout_s=job.per_test_timeout_s, cpu_s=None)
        start = time.monotonic()
        toolchain = self._toolchain(job.language, job.compile_timeout_s)
        language_run: _compiled.LanguageRun | None = None
        artifact = ""
        compile_result: CompileResult | None = None
        if toolchain is not None:
            timeout = job.compile_timeout_s or toolchain.compile_timeout_s
            language_run = _compiled.LanguageRun(toolchain, job.program, "", {}, lim, timeout)
            built = self._compile(language_run)  # once: every test runs what it built
            if isinstance(built, ExecResult):
                return _compiled.compile_error_report(tests, built, time.monotonic() - start)
            artifact, compile_result = built
        results: list[TestResult] = []
        program_status = Status.OK
        isolation: tuple[str, ...] = ()
        stdout: list[str] = []
        stderr: list[str] = []
        stopped = ""
        for index, test in enumerate(tests):
            name = test.name or f"test_{index}"
            if stopped:
                results.append(TestResult(name, TestStatus.FAILED, stopped))
                continue
            if language_run is None or toolchain is None:
                res = self._execute(self._prepare(job.program, test.stdin, None, lim))
            else:
                try:
                    run = self._prepare_run(language_run, test.stdin, artifact)
                except ValueError as exc:
                    res = _compiled.too_large(exc, compile_result)
                else:
                    res = _compiled.memory_status(self._execute(run), toolchain)
            isolation = res.isolation or isolation
            if sum(map(len, stdout)) < 64 << 10:
                stdout.append(res.stdout[: 64 << 10])
                stderr.append(res.stderr[: 64 << 10])
            if res.status is not Status.OK and program_status is Status.OK:
                program_status = res.status
            results.append(_judge_io(name, test, res))
            if job.stop_on_program_failure and res.status is not Status.OK:
                stopped = f"not run: the program failed in test {index} (stop_on_program_failure)"
            elif job.stop_on_first_failure and not results[-1].passed:
                stopped = "not run: an earlier test failed (stop_on_first_failure)"
        return TestReport(
            results=tuple(results),
            status=program_status,
            wall_s=time.monotonic() - start,
            isolation=isolation,
            stdout="".join(stdout)[: 64 << 10],
            stderr="".join(stderr)[: 64 << 10],
            compile=compile_result,
        )


_RUN_TO_TEST = {
    Status.COMPILE_ERROR: TestStatus.COMPILE_ERROR,
    Status.TIMEOUT: TestStatus.TIMEOUT,
    Status.MEMORY: TestStatus.MEMORY,
    Status.OUTPUT_LIMIT: TestStatus.OUTPUT_LIMIT,
    Status.RUNTIME_ERROR: TestStatus.RUNTIME_ERROR,
    Status.KILLED: TestStatus.RUNTIME_ERROR,
    Status.SANDBOX_ERROR: TestStatus.SANDBOX_ERROR,
}


#: What ``normalize_output`` strips at the end of a line: ASCII whitespace only, as judges do
#: (Codeforces' testlib, AtCoder). ``str.rstrip()`` would also strip ``\x85``, ``\u3000``,
#: ``\x1c``-``\x1f`` and other Unicode spaces, which are output characters like any other.
TRAILING_WHITESPACE = " \t\r\x0b\x0c"


def normalize_output(text: str) -> list[str]:
    r"""Lines with trailing ASCII whitespace stripped, without trailing blank lines.

    >>> normalize_output("4 \t\r\n\n5\n\n")
    ['4', '', '5']
    >>> normalize_output("YES\u3000\n") == ["YES\u3000"]
    True
    """
    lines = [line.rstrip(TRAILING_WHITESPACE) for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _judge_io(name: str, test: IOTest, res: ExecResult) -> TestResult:
    if res.status is not Status.OK:
        detail = res.detail or res.status.value
        return TestResult(name, _RUN_TO_TEST[res.status], detail[:500])
    got, want = normalize_output(res.stdout), normalize_output(test.expected_stdout)
    if got == want:
        return TestResult(name, TestStatus.PASSED)
    for line_no, (g, w) in enumerate(zip(got, want), start=1):
        if g != w:
            return TestResult(
                name, TestStatus.FAILED, f"line {line_no}: got {g[:80]!r}, want {w[:80]!r}"
            )
    return TestResult(name, TestStatus.FAILED, f"got {len(got)} lines, want {len(want)} lines")


def _exec_result(reply: dict[str, object]) -> ExecResult:
    try:
        status = Status(_str(reply, "status"))
    except ValueError:
        raise _SlotError("malformed status") from None
    code = reply.get("exit_code")
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
        raise _SlotError("malformed exit code")
    return ExecResult(
        status=status,
        stdout=_str(reply, "stdout"),
        stderr=_str(reply, "stderr"),
        exit_code=code,
        wall_s=_float(reply, "wall_s"),
        isolation=_layers(reply),
        truncated=reply.get("truncated") is True,
        detail=_str(reply, "detail"),
    )


def _test_report(reply: dict[str, object], names: list[str]) -> TestReport:
    raw = reply.get("results")
    if not isinstance(raw, list) or len(raw) != len(names):
        raise _SlotError("malformed test results")
    results: list[TestResult] = []
    for index, item in enumerate(raw):
        if not (isinstance(item, list) and len(item) == 3 and item[0] == index):
            raise _SlotError("malformed test result")
        try:
            verdict = TestStatus(str(item[1]))
        except ValueError:
            raise _SlotError(f"unknown test status {item[1]!r}") from None
        results.append(TestResult(names[index], verdict, clean_text(str(item[2]))))
    try:
        status = Status(_str(reply, "status"))
    except ValueError:
        raise _SlotError("malformed status") from None
    return TestReport(
        results=tuple(results),
        status=status,
        wall_s=_float(reply, "wall_s"),
        isolation=_layers(reply),
        stdout=_str(reply, "stdout"),
        stderr=_str(reply, "stderr"),
    )
