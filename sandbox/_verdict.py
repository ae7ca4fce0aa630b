"""The verdict side of ``run_tests``: trusted test code against proxies of the candidate.

Runs inside the long-lived verdict server (see ``_verdict_server``), never in the untrusted
process. Standard library + ``_codec`` only: the fork server loads this file by path.
"""

from __future__ import annotations

import builtins
import select
import socket
import sys
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING or "_sandbox_codec" not in sys.modules:
    from sandbox import _codec
else:  # inside the fork server, which loaded the codec by file path
    _codec = sys.modules["_sandbox_codec"]


class _CandidateDied(BaseException):
    """The candidate process died or broke the protocol (BaseException: tests cannot swallow it)."""


class _CandidateTimeout(BaseException):
    """A call did not return before the test's deadline."""


class Proxy:
    """Stands in for the candidate function inside the trusted verdict process."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock = sock
        sock.setblocking(False)  # once: every wait is a select() with the test's deadline
        self.__name__ = name
        self.reader = _codec.FrameReader()
        self.pending: list[bytes] = []
        self.seq = 0
        self.deadline = 0.0
        self.dead = False
        self.timed_out = False
        self.detail = ""
        self.unsupported = False

    def _send(self, data: bytes) -> None:
        """Send all of ``data`` before the deadline (the socket is non-blocking)."""
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view) :]
                continue
            except BlockingIOError:
                pass
            except OSError:
                self.dead = True
                self.detail = self.detail or "the candidate process exited"
                raise _CandidateDied() from None
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.dead = self.timed_out = True
                raise _CandidateTimeout()
            select.select([], [self.sock], [], remaining)

    def recv(self) -> object:
        """Receive one message before the deadline; mark the candidate dead/timed out on failure."""
        while not self.pending:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.dead = self.timed_out = True
                raise _CandidateTimeout()
            ready, _, _ = select.select([self.sock], [], [], remaining)
            if not ready:
                continue
            try:
                data = self.sock.recv(_codec.READ_CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self.dead = True
                self.detail = self.detail or "the candidate process exited"
                raise _CandidateDied()
            try:
                self.pending.extend(self.reader.feed(data))
            except _codec.CodecError as exc:
                self.dead = True
                self.detail = f"protocol violation: {exc}"
                raise _CandidateDied() from None
        raw = self.pending.pop(0)
        try:
            return _codec.loads(raw)
        except _codec.CodecError as exc:
            self.dead = True
            self.detail = f"protocol violation: {exc}"
            raise _CandidateDied() from None

    def __call__(self, *args: object, **kwargs: object) -> object:
        """Call the candidate with plain values; return its plain result or raise its error."""
        if self.dead:
            raise _CandidateTimeout() if self.timed_out else _CandidateDied()
        try:
            payload = _codec.dumps(
                ["call", self.seq, _codec.encode_value(list(args)), _codec.encode_value(kwargs)]
            )
        except _codec.CodecError as exc:
            self.unsupported = True
            raise TypeError(f"sandbox cannot send this argument to the candidate: {exc}") from None
        self._send(_codec.frame(payload))
        reply = self.recv()
        seq, self.seq = self.seq, self.seq + 1
        if not (isinstance(reply, list) and len(reply) >= 3 and reply[1] == seq):
            self.dead = True
            self.detail = "protocol violation: unexpected reply"
            raise _CandidateDied()
        if reply[0] == "ret" and len(reply) == 3:
            try:
                return _codec.decode_value(reply[2])
            except _codec.CodecError as exc:
                self.dead = True
                self.detail = f"protocol violation: {exc}"
                raise _CandidateDied() from None
        if reply[0] == "exc" and len(reply) == 4:
            raise _candidate_exception(str(reply[2]), str(reply[3]))
        self.dead = True
        self.detail = "protocol violation: unexpected reply"
        raise _CandidateDied()


def _candidate_exception(type_name: str, message: str) -> BaseException:
    cls = getattr(builtins, type_name, None)
    exc: BaseException
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(message)
        except Exception:
            exc = _codec.CandidateError(f"{type_name}: {message}")
    else:
        exc = _codec.CandidateError(f"{type_name}: {message}")
    exc._sandbox_candidate = True  # type: ignore[attr-defined]
    return exc


_COMPILED: dict[tuple[str, str], types.CodeType] = {}


def _compile_trusted(source: str, name: str) -> types.CodeType:
    """Compile trusted code with asserts kept (``optimize=0``), cached across jobs.

    GRPO scores many completions of the same problem, so the same setup and tests recur.
    """
    key = (name, source)
    code = _COMPILED.get(key)
    if code is None:
        code = compile(source, name, "exec", optimize=0)
        if len(_COMPILED) >= 512:
            _COMPILED.clear()
        _COMPILED[key] = code
    return code


def run_job(
    req: dict[str, object],
    first: int,
    chan: socket.socket,
    report: Callable[[list[object]], None],
) -> None:
    """Run the trusted setup and test code against the proxy; report one message per test."""
    sources = [str(s) for s in req.get("tests", [])]  # type: ignore[attr-defined]
    timeout_s = float(req["limits"]["timeout_s"])  # type: ignore[index]
    per_test = float(req.get("per_test_timeout_s") or timeout_s)  # type: ignore[arg-type]
    entry = str(req.get("entry_point") or "")

    proxy = Proxy(chan, entry)
    namespace: dict[str, object] = {"__name__": "__verdict__", "__builtins__": builtins}
    try:
        exec(_compile_trusted(str(req.get("setup", "")), "<setup>"), namespace)
    except BaseException as exc:
        report(["setup_error", f"{type(exc).__name__}: {exc}"[:500]])
        return
    proxy.deadline = time.monotonic() + timeout_s
    try:
        hello = proxy.recv()
    except _CandidateTimeout:
        report(["not_ready", "timeout", "the program did not finish loading in time"])
        return
    except _CandidateDied:
        report(["not_ready", "died", proxy.detail])
        return
    if hello != ["ready"]:
        detail = "protocol violation"
        if isinstance(hello, list) and len(hello) == 3 and hello[0] == "error":
            detail = f"{hello[1]}: {hello[2]}"[:500]
        report(["not_ready", "error", detail])
        return
    report(["ready"])
    namespace["candidate"] = proxy
    if entry:
        namespace[entry] = proxy
    for index in range(first, len(sources)):
        proxy.deadline = time.monotonic() + per_test
        status, detail = "passed", ""
        try:
            code = _compile_trusted(sources[index], f"<test {index}>")
        except SyntaxError as exc:
            report(["result", index, "sandbox_error", f"invalid test source: {exc}"[:500]])
            continue
        try:
            exec(code, namespace)
        except _CandidateTimeout:
            pass
        except _CandidateDied:
            pass
        except BaseException as exc:
            text = f"{type(exc).__name__}: {exc}"[:500]
            if getattr(exc, "_sandbox_candidate", False):
                status = "memory" if isinstance(exc, MemoryError) else "runtime_error"
                detail = text
            elif proxy.unsupported:
                status, detail = "sandbox_error", text
            else:  # an assertion (or the test's own code) failed on the candidate's values
                status, detail = "failed", text
        # The proxy's flags override whatever the test code did with the exception.
        if proxy.timed_out:
            status, detail = "timeout", f"no answer within {per_test:g} s"
        elif proxy.dead:
            status, detail = "died", proxy.detail or "the candidate process exited"
        report(["result", index, status, detail])
        if proxy.dead or proxy.unsupported:
            return
        if bool(req.get("stop_on_first_failure")) and status != "passed":
            return
