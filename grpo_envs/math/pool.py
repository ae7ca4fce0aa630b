"""The math verifier's worker pool: ``grpo_envs.executor.WorkerPool`` serving sympy comparisons.

The killable-worker machinery (why subprocesses, not SIGALRM or a ``multiprocessing`` pool) lives
in ``grpo_envs.executor``, the one time-bounded executor of grpo_envs; this module only names the
target (``grpo_envs.math._worker:serve``), keeps one process-wide pool, and types the replies.

Workers import sympy once (about a second), then serve many requests; they also cap their own
address space (``GRPO_MATH_WORKER_MEM_MB``, default 2048) so ``10^{10^{10}}`` ends in a
MemoryError inside the worker instead of swapping the machine.
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass

from grpo_envs import executor
from grpo_envs.executor import ReplyStatus
from grpo_envs.math.answer_tree import Node

__all__ = ["ReplyStatus", "WorkerPool", "WorkerReply", "default_workers", "get_pool"]

#: How long a freshly started worker may take to import sympy. Not charged to any item's timeout.
STARTUP_TIMEOUT_S = executor.STARTUP_TIMEOUT_S


@dataclass(frozen=True)
class WorkerReply:
    """The answer of one comparison in a worker.

    ``equal`` is meaningful only when status is OK. ``compared`` is False when sympy failed on
    the pair (raised, ran out of memory, recursed too deeply): status is then OK, since the worker
    did its job, and ``detail`` says why the answers could not be compared. ERROR is left for
    failures of the worker itself (it would not start, it died).
    """

    status: ReplyStatus
    equal: bool = False
    detail: str = ""
    compared: bool = True


class WorkerPool(executor.WorkerPool):
    """Up to ``size`` sympy workers, started on demand and shared by all threads."""

    def __init__(self, size: int, mem_limit_mb: int | None = None) -> None:
        mem = mem_limit_mb or int(os.environ.get("GRPO_MATH_WORKER_MEM_MB", "2048"))
        super().__init__("grpo_envs.math._worker:serve", size, mem_limit_mb=mem, light=True)

    def compare(self, gold: Node, pred: Node, timeout_s: float) -> WorkerReply:
        """Compare two parsed answers in a worker, within ``timeout_s`` seconds of worker time."""
        reply = self.call((gold, pred), timeout_s)
        if reply.status is ReplyStatus.OK and isinstance(reply.value, str):
            return WorkerReply(ReplyStatus.OK, False, reply.value, compared=False)
        equal = bool(reply.value) if reply.status is ReplyStatus.OK else False
        detail = reply.detail.replace("worker failed", "math worker failed")
        if detail == "the worker ran out of memory":
            detail = "sympy ran out of memory"
        return WorkerReply(reply.status, equal, detail)


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def default_workers() -> int:
    """Worker count: ``GRPO_MATH_WORKERS`` if set, else the CPUs this process may use."""
    env = os.environ.get("GRPO_MATH_WORKERS")
    if env:
        return max(1, int(env))
    return executor.usable_cpus()


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
