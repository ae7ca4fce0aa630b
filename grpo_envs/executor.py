"""The one time-bounded executor of grpo_envs: killable worker processes, usable from anywhere.

Two users share it: the math verifier (sympy comparisons, ``grpo_envs.math.pool``) and the
``TimeLimit`` wrapper that ``make()`` puts around environments whose reward functions cannot
bound their own time (``grpo_envs.wrappers``). The code environments need no process of their
own (the sandbox bounds the untrusted program); they only fan jobs out with ``fan_out``.

Why not SIGALRM: signals reach only the main thread, so under Ray actors, thread pools or async
servers the timeout silently does not fire. Why not a ``multiprocessing`` pool: its workers cannot
be killed one at a time on a timeout, daemonic processes (the workers of a DataLoader or of another
Pool) may not start children, and the 'spawn'/'forkserver' contexts re-import the caller's
``__main__``. So each worker is a plain ``subprocess`` running ``_worker.py`` with two pipes, and a
worker that runs past its time is SIGKILLed and replaced. ``Connection.poll(timeout)`` works from
any thread.

A worker serves one *target*: ``"module:factory"``, where ``factory()`` runs once in the worker
(imports, warm-up) and returns the handler ``handler(request) -> value`` called per request.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TypeVar

_WORKER_SCRIPT = str(Path(__file__).with_name("_worker.py"))
#: How long a freshly started worker may take to import and warm up. Not charged to any request.
STARTUP_TIMEOUT_S = 120.0

T = TypeVar("T")
R = TypeVar("R")


class ReplyStatus(StrEnum):
    """How a request ended."""

    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass(frozen=True)
class Reply:
    """The result of one request: ``value`` is meaningful only when ``status`` is OK."""

    status: ReplyStatus
    value: object = None
    detail: str = ""


def usable_cpus() -> int:
    """CPUs this process may run on (the affinity mask, which containers and taskset narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def fan_out(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]`` from up to ``workers`` threads, in input order.

    For calls that wait on other processes (a worker's pipe, the sandbox): threads only wait, so
    one slow item holds one thread, never the others.
    """
    if not items:
        return []
    if workers <= 1 or len(items) == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


class _Worker:
    """One worker subprocess and its two pipe ends."""

    def __init__(self, target: str, mem_limit_mb: int, light: bool) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        debug = any(os.environ.get(v) for v in ("GRPO_WORKER_DEBUG", "GRPO_MATH_WORKER_DEBUG"))
        env = dict(os.environ)
        # The parent's import path (pytest's rootdir, a notebook's cwd): a target that rebuilds an
        # environment must import the same modules the parent did.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            self.proc = subprocess.Popen(
                [
                    os.environ.get("GRPO_MATH_PYTHON") or sys.executable,
                    # -P: the script's folder does not go first on sys.path, where
                    # grpo_envs/types.py would stand in for the standard library's `types` in an
                    # interpreter whose start-up has not imported it (no site hooks); the worker
                    # puts the repository root there itself.
                    "-P",
                    _WORKER_SCRIPT,
                    str(to_child_r),
                    str(from_child_w),
                    str(mem_limit_mb),
                    target,
                    "light" if light else "full",
                ],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None if debug else subprocess.DEVNULL,
                env=env,
                # Own session: a Ctrl-C aimed at the caller must not kill a worker mid-request.
                start_new_session=True,
            )
        except BaseException:
            os.close(to_child_w)
            os.close(from_child_r)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.recv_conn = Connection(from_child_r, writable=False)
        self.ready = False
        self.startup_error = ""

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait for the worker's 'ready' message (sent once its factory has run)."""
        if self.ready:
            return True
        try:
            if self.recv_conn.poll(timeout_s):
                message = self.recv_conn.recv()
                if message == "ready":
                    self.ready = True
                else:
                    self.startup_error = str(message)[:300]
        except (EOFError, OSError):
            return False
        return self.ready

    def kill(self) -> None:
        """SIGKILL the process and close the pipes (idempotent)."""
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for conn in (self.send_conn, self.recv_conn):
            with contextlib.suppress(OSError):
                conn.close()


class WorkerPool:
    """Up to ``size`` worker processes serving ``target``, started on demand, shared by threads.

    ``call`` blocks until a worker is free, so with more concurrent callers than workers a call
    may wait for others (each of which ends within its own timeout) before its own clock starts.

    Args:
        target: ``"module:factory"`` run in each worker (see the module docstring).
        size: the most workers alive at once.
        mem_limit_mb: address-space cap of each worker after its warm-up (so that
            ``10^{10^{10}}`` ends in a MemoryError inside the worker instead of swapping).
        light: import the target's module without running ``grpo_envs/__init__.py`` (for targets
            that need only a few leaf modules, e.g. the sympy comparator).
    """

    def __init__(
        self, target: str, size: int, *, mem_limit_mb: int = 2048, light: bool = False
    ) -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, got size={size}")
        self.target, self.size, self.mem_limit_mb, self.light = target, size, mem_limit_mb, light
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._live = 0  # started and not yet killed, idle or busy
        self._closed = False
        self.pid = os.getpid()

    def grow(self, size: int) -> None:
        """Allow at least ``size`` workers."""
        with self._cond:
            if size > self.size:
                self.size = size
                self._cond.notify_all()

    def warm_up(self, count: int | None = None) -> None:
        """Start workers now and wait until they are ready (so benchmarks don't time imports)."""
        workers = [self._acquire() for _ in range(min(count or self.size, self.size))]
        for w in workers:
            ok = w.wait_ready(STARTUP_TIMEOUT_S)
            self._release(w, alive=ok)
            if not ok:
                w.kill()

    def call(self, request: object, timeout_s: float) -> Reply:
        """Serve ``request`` in a worker within ``timeout_s`` seconds of worker time.

        Never raises for the worker's failures: they come back as ``TIMEOUT``/``ERROR`` replies.
        """
        worker = self._acquire()
        try:
            if not worker.wait_ready(STARTUP_TIMEOUT_S):
                why = worker.startup_error or "worker failed to start"
                worker.kill()
                self._replace(worker)
                return Reply(ReplyStatus.ERROR, detail=why)
            worker.send_conn.send(request)
            if not worker.recv_conn.poll(timeout_s):
                worker.kill()
                self._replace(worker)
                return Reply(ReplyStatus.TIMEOUT, detail=f"no result within {timeout_s:g}s")
            status, value, detail = worker.recv_conn.recv()
        except Exception as exc:  # the worker died (segfault, OOM kill) or sent garbage
            worker.kill()
            self._replace(worker)
            return Reply(ReplyStatus.ERROR, detail=f"worker failed: {exc!r}"[:300])
        except BaseException:
            # KeyboardInterrupt mid-request: the worker may still answer later, and that stale
            # reply must never reach the next caller, so it goes.
            worker.kill()
            self._replace(worker)
            raise
        self._release(worker, alive=True)
        return Reply(ReplyStatus(status), value, str(detail))

    def map(self, requests: Sequence[object], timeout_s: float) -> list[Reply]:
        """``call`` for each request, ``size`` at a time, in input order."""
        self.grow(min(self.size, len(requests)))
        return fan_out(lambda r: self.call(r, timeout_s), requests, self.size)

    def close(self) -> None:
        """Kill every idle worker; busy ones are killed when their request returns."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._cond.notify_all()
        for w in idle:
            w.kill()

    # -- internals --

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the worker pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._live < self.size:
                    self._live += 1
                    break
                self._cond.wait()
        try:
            return _Worker(self.target, self.mem_limit_mb, self.light)
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker, *, alive: bool) -> None:
        with self._cond:
            if alive and not self._closed:
                self._idle.append(worker)
            else:
                self._live -= 1
                if alive:
                    worker.kill()
            self._cond.notify()

    def _replace(self, dead: _Worker) -> None:
        """Start a successor right away so it warms up while the caller moves on."""
        self._release(dead, alive=False)
        with self._cond:
            if self._closed or self._live >= self.size:
                return
            self._live += 1
        try:
            fresh = _Worker(self.target, self.mem_limit_mb, self.light)
        except OSError:
            with self._cond:
                self._live -= 1
            return
        self._release(fresh, alive=True)
