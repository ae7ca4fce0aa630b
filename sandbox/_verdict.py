"""The verdict side of ``run_tests``: trusted test code against proxies of the candidate.

Runs inside the long-lived verdict server V (see ``_verdict_server``), never in the untrusted
process. Standard library + ``_codec`` only (V is a clone of the template, ``_template``).
"""

from __future__ import annotations

import builtins
import select
import socket
import time
import types
from collections.abc import Callable
from typing import TypeVar

from sandbox import _codec


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
        self.per_test = 0.0
        self.received = 0  # bytes from the candidate in this job (V trims its heap after much)
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
            self.received += len(data)
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
            # The argument list and keyword dict are wrappers, not levels of the values: any
            # value the candidate returned (up to MAX_DEPTH levels) can be passed back to it.
            payload = _codec.dumps(
                [
                    "call",
                    self.seq,
                    _codec.encode_value(list(args), -1),
                    _codec.encode_value(kwargs, -1),
                ]
            )
        except _codec.CodecError as exc:
            if isinstance(exc, _codec.TooDeepError):
                # Only the candidate's values get that deep (nothing in a dataset does): its
                # failure, never a reason to leave the item out of training.
                raise _candidate_exception("ValueError", f"argument not sendable: {exc}") from None
            self.unsupported = True
            raise TypeError(f"sandbox cannot send this argument to the candidate: {exc}") from None
        except RecursionError:
            raise _candidate_exception("ValueError", "argument nested too deeply") from None
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


#: Exceptions that trusted code treats as control flow, not as errors: ``map``, ``filter``,
#: ``zip``, ``next(it, default)``, ``all``/``any`` and ``for`` loops end quietly on
#: StopIteration (``def is_odd(x): raise StopIteration`` would pass
#: ``assert all(map(candidate, [3, 5, 7]))``). The candidate's StopIteration therefore
#: reaches the test as a RuntimeError, which is what PEP 479 ("Change StopIteration handling
#: inside generators") does to a StopIteration escaping a generator.
_CONTROL_FLOW = frozenset({"StopIteration", "StopAsyncIteration"})


def _candidate_exception(type_name: str, message: str) -> BaseException:
    """Build the exception the proxy raises in trusted code for one the candidate raised.

    Only the type's *name* and a message came over the channel (the candidate's own classes,
    hostile ``__str__``/``__eq__`` included, never leave its process). A builtin ``Exception``
    subclass of that name is rebuilt, so ``except ValueError:`` in a test works; control-flow
    exceptions become ``RuntimeError`` (above); anything else (``SystemExit``,
    ``KeyboardInterrupt``, ``GeneratorExit``, the candidate's own classes) is a
    ``CandidateError``. Every one is marked as the candidate's.
    """
    cls = getattr(builtins, type_name, None)
    exc: BaseException
    if type_name in _CONTROL_FLOW:
        exc = RuntimeError(f"the candidate raised {type_name}: {message}")
    elif isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(message)
        except Exception:
            exc = _codec.CandidateError(f"{type_name}: {message}")
    else:
        exc = _codec.CandidateError(f"{type_name}: {message}")
    exc._sandbox_candidate = True  # type: ignore[attr-defined]
    return exc


def describe(exc: BaseException, limit: int = 500) -> str:
    """``"Type: message"`` of an exception raised in trusted code, never raising itself.

    The message may be built from the candidate's values: ``assert r == 4, r`` with
    ``r = 10**5000`` cannot be turned into text (ints over 4300 digits refuse ``str``, see
    ``sys.set_int_max_str_digits``), nor can a value nested deeper than the recursion limit.
    """
    name = type(exc).__name__
    try:
        text = str(exc)
    except BaseException as why:  # whatever formatting raises is reported, never raised
        text = f"<message cannot be shown: {type(why).__name__}>"
    return f"{name}: {text}"[:limit] if text else name


_COMPILED: dict[tuple[str, str], types.CodeType] = {}
#: The name a failed ``assert`` of trusted code calls instead of raising (``_SoftAsserts``).
ASSERT_FAILED = "__sandbox_assert_failed__"


def _soft_asserts(source: str, name: str) -> types.CodeType:
    """Compile ``source`` with every ``assert test, msg`` made ``if not test: failed(msg)``.

    Why: a failing ``assert`` ends the test code, so the candidate's next call inside the same
    test (a loop of asserts, a whole ``check``) would happen only after a pass. A program that
    counts its calls would then learn its own verdict, and with any channel to a later run it
    can keep the guesses that were confirmed (measured: 8 copies of a program that never reads
    its input reached reward 1 on HumanEval/0). With the rewrite, the trusted code makes the same
    calls with the same arguments whatever the verdicts; the test fails at its end if any
    assertion failed (``ASSERT_FAILED`` records it). No verdict changes: the code runs exactly
    as before up to the first failed assertion, and after one the test fails whatever follows.
    Asserts always run (``optimize=0``).
    """
    import ast  # in V only: the template, which every child copies, does not hold it

    _Node = TypeVar("_Node", bound=ast.AST)

    def located(new: _Node, old: ast.AST) -> _Node:
        return ast.copy_location(new, old)

    def rewrite(body: list[ast.stmt]) -> None:
        # Statements only (an assert is a statement): walking every expression node with
        # ast.NodeTransformer made compiling a HumanEval setup 5x slower (2 ms, measured).
        for index, node in enumerate(body):
            if isinstance(node, ast.Assert):
                name = located(ast.Name(ASSERT_FAILED, ast.Load()), node)
                call = located(ast.Call(name, [node.msg] if node.msg else [], []), node)
                test = located(ast.UnaryOp(ast.Not(), node.test), node)
                body[index] = located(ast.If(test, [located(ast.Expr(call), node)], []), node)
                continue
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    rewrite(inner)
            for clause in (*getattr(node, "handlers", ()), *getattr(node, "cases", ())):
                rewrite(clause.body)

    tree = ast.parse(source, name)
    rewrite(tree.body)
    return compile(tree, name, "exec", optimize=0)


def _compile_trusted(source: str, name: str) -> types.CodeType:
    """Compile trusted code (``_soft_asserts``), cached across jobs.

    GRPO scores many completions of the same problem, so the same setup and tests recur.
    """
    key = (name, source)
    code = _COMPILED.get(key)
    if code is None:
        code = _soft_asserts(source, name)
        if len(_COMPILED) >= 512:
            _COMPILED.clear()
        _COMPILED[key] = code
    return code


class _Failures:
    """The failed assertions of the running test: the first one's message is its detail."""

    def __init__(self) -> None:
        self.first: AssertionError | None = None

    def __call__(self, *message: object) -> None:
        if self.first is None:
            self.first = AssertionError(*message)


def run_job(
    req: dict[str, object],
    first: int,
    chan: socket.socket,
    report: Callable[[list[object]], None],
) -> int:
    """Run the trusted setup and test code against the proxy; report one message per test.

    Every test from ``first`` on runs, in order, whatever the verdicts before it (unless
    ``stop_on_first_failure``): what the candidate is asked never depends on a verdict.
    Returns how many bytes the candidate sent.
    """
    sources = [str(s) for s in req.get("tests", [])]  # type: ignore[attr-defined]
    timeout_s = float(req["limits"]["timeout_s"])  # type: ignore[index]
    per_test = float(req.get("per_test_timeout_s") or timeout_s)  # type: ignore[arg-type]
    entry = str(req.get("entry_point") or "")

    proxy = Proxy(chan, entry)
    failures = _Failures()
    namespace: dict[str, object] = {"__name__": "__verdict__", "__builtins__": builtins}
    try:
        exec(_compile_trusted(str(req.get("setup", "")), "<setup>"), namespace)
    except BaseException as exc:
        report(["setup_error", describe(exc)])
        return proxy.received
    proxy.deadline = time.monotonic() + timeout_s
    try:
        hello = proxy.recv()
    except _CandidateTimeout:
        report(["not_ready", "timeout", "the program did not finish loading in time"])
        return proxy.received
    except _CandidateDied:
        report(["not_ready", "died", proxy.detail])
        return proxy.received
    if hello != ["ready"]:
        detail = "protocol violation"
        if isinstance(hello, list) and len(hello) == 3 and hello[0] == "error":
            detail = f"{hello[1]}: {hello[2]}"[:500]
        report(["not_ready", "error", detail])
        return proxy.received
    report(["ready"])
    namespace["candidate"] = proxy
    if entry:
        namespace[entry] = proxy
    for index in range(first, len(sources)):
        proxy.deadline, proxy.per_test = time.monotonic() + per_test, per_test
        failures.first = None
        namespace[ASSERT_FAILED] = failures  # rebound per test: test code may overwrite it
        status, detail = _run_test(sources[index], index, namespace, proxy, failures)
        report(["result", index, status, detail])
        if proxy.dead or proxy.unsupported:
            return proxy.received
        if bool(req.get("stop_on_first_failure")) and status != "passed":
            return proxy.received
    return proxy.received


def _run_test(
    source: str, index: int, namespace: dict[str, object], proxy: Proxy, failures: _Failures
) -> tuple[str, str]:
    """Run one test's trusted code; return its (status, detail). Never raises."""
    try:
        code = _compile_trusted(source, f"<test {index}>")
    except (SyntaxError, ValueError) as exc:
        return "sandbox_error", f"invalid test source: {describe(exc)}"
    status, detail = "passed", ""
    try:
        exec(code, namespace)
    except (_CandidateTimeout, _CandidateDied):
        pass
    except BaseException as exc:
        if getattr(exc, "_sandbox_candidate", False):
            status = "memory" if isinstance(exc, MemoryError) else "runtime_error"
        elif proxy.unsupported:
            status = "sandbox_error"
        else:  # the test's own code failed on the candidate's values
            status = "failed"
        detail = describe(exc)
    if failures.first is not None and status != "sandbox_error":
        status, detail = "failed", describe(failures.first)  # the first failure decides
    # The proxy's flags override whatever the test code did with the exception.
    if proxy.timed_out:
        return "timeout", f"no answer within {proxy.per_test:g} s"
    if proxy.dead:
        return "died", proxy.detail or "the candidate process exited"
    return status, detail
