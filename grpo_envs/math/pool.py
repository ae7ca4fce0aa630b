"""A small pool of killable worker processes for sympy work, usable from any thread or process.

Why not SIGALRM (what Math-Verify uses): signals are delivered only to the main thread, so under
Ray actors, thread pools or async servers the timeout silently does not fire (anchors.md, pain
point 5). Why not a ``multiprocessing`` pool: its workers cannot be killed one at a time on a
timeout, daemonic processes (e.g. the workers of a DataLoader or of another Pool) may not start
children, and the 'spawn'/'forkserver' contexts re-import the caller's ``__main__``. So each
worker here is a plain ``subprocess`` running ``_worker.py`` with two pipes, and a timed-out
worker is SIGKILLed and replaced. ``Connection.poll(timeout)`` works from any thread.

Workers import sympy once (about a second), then serve many requests; they also cap their own
address space (``GRPO_MATH_WORKER_MEM_MB``, default 2048) so ``10^{10^{10}}`` ends in a
MemoryError inside the worker instead of swapping the machine.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from enum import StrEnum
from multiprocessing.connection import Connection
from pathlib import Path

from grpo_envs.math.normalize import Node

_WORKER_SCRIPT = str(Path(__file__).with_name("_worker.py"))
#: How long a freshly started worker may take to import sympy. Not charged to any item's timeout.
STARTUP_TIMEOUT_S = 120.0


class ReplyStatus(StrEnum):
    """How a worker request ended."""

    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass(frozen=True)
class WorkerReply:
    """The answer of one comparison in a worker. ``equal`` is meaningful only when status is OK."""

    status: ReplyStatus
    equal: bool = False
    detail: str = ""


def _python() -> str:
    """Return the workers' interpreter: ``GRPO_MATH_PYTHON``, else ``sys.executable``."""
    return os.environ.get("GRPO_MATH_PYTHON") or sys.executable


class _Worker:
    """One worker subprocess and its two pipe ends."""

    def __init__(self, mem_limit_mb: int) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        debug = bool(os.environ.get("GRPO_MATH_WORKER_DEBUG"))
        try:
            self.proc = subprocess.Popen(
                [
                    _python(),
                    _WORKER_SCRIPT,
                    str(to_child_r),
                    str(from_child_w),
                    str(mem_limit_mb),
                ],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None if debug else subprocess.DEVNULL,
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

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait for the worker's 'ready' message (sent once sympy is imported)."""
        if self.ready:
            return True
        try:
            if self.recv_conn.poll(timeout_s) and self.recv_conn.recv() == "ready":
                self.ready = True
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
    """Up to ``size`` worker processes, started on demand and shared by all threads.

    ``compare`` blocks until a worker is free, so with more concurrent callers than workers a call
    may wait for others (each of which ends within its own timeout) before its own clock starts.
    """

    def __init__(self, size: int, mem_limit_mb: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, got size={size}")
        self.size = size
        self.mem_limit_mb = mem_limit_mb or int(os.environ.get("GRPO_MATH_WORKER_MEM_MB", "2048"))
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

    def compare(self, gold: Node, pred: Node, timeout_s: float) -> WorkerReply:
        """Compare two parsed answers in a worker, within ``timeout_s`` seconds of worker time."""
        worker = self._acquire()
        try:
            if not worker.wait_ready(STARTUP_TIMEOUT_S):
                worker.kill()
                self._replace(worker)
                return WorkerReply(ReplyStatus.ERROR, detail="math worker failed to start")
            worker.send_conn.send((gold, pred))
            if not worker.recv_conn.poll(timeout_s):
                worker.kill()
                self._replace(worker)
                return WorkerReply(ReplyStatus.TIMEOUT, detail=f"no result within {timeout_s:g}s")
            status, equal, detail = worker.recv_conn.recv()
        except Exception as exc:  # the worker died (segfault, OOM kill) or sent garbage
            worker.kill()
            self._replace(worker)
            return WorkerReply(ReplyStatus.ERROR, detail=f"math worker failed: {exc!r}"[:300])
        except BaseException:
            # KeyboardInterrupt mid-request: the worker may still answer later, and that stale
            # reply must never reach the next caller, so it goes.
            worker.kill()
            self._replace(worker)
            raise
        self._release(worker, alive=True)
        return WorkerReply(ReplyStatus(status), bool(equal), str(detail))

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
                    raise RuntimeError("the math worker pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._live < self.size:
                    self._live += 1
                    break
                self._cond.wait()
        try:
            return _Worker(self.mem_limit_mb)
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
        """Start a successor right away so it imports sympy while the caller moves on."""
        self._release(dead, alive=False)
        with self._cond:
            if self._closed or self._live >= self.size:
                return
            self._live += 1
        try:
            fresh = _Worker(self.mem_limit_mb)
        except OSError:
            with self._cond:
                self._live -= 1
            return
        self._release(fresh, alive=True)


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def default_workers() -> int:
    """Worker count: ``GRPO_MATH_WORKERS`` if set, else the CPUs this process may use."""
    env = os.environ.get("GRPO_MATH_WORKERS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def get_pool(min_size: int | None = None) -> WorkerPool:
    """Return the process-wide pool (created on first use, recreated in a forked child)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            # After a fork the parent's pipes are shared, not ours: start a fresh pool.
            _POOL = WorkerPool(max(min_size or 0, default_workers()))
        elif min_size:
            _POOL.grow(min_size)
        return _POOL


def shutdown_pool() -> None:
    """Kill the process-wide pool's workers (also run at interpreter exit)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


atexit.register(shutdown_pool)
