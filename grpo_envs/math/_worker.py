"""Worker process for ``grpo_envs.math.pool``: compares parsed answers with sympy, forever.

Run as ``python _worker.py READ_FD WRITE_FD MEM_LIMIT_MB``. It receives ``(gold, pred)`` node
pairs on READ_FD and answers ``(status, equal, detail)`` on WRITE_FD; it exits when READ_FD closes
(the parent died or closed the pool). It is started as a script, not with ``-m``, and stubs the
parent packages so that importing ``grpo_envs.math.equivalence`` does not run
``grpo_envs/__init__.py`` (which may import heavy, unrelated modules).
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from pathlib import Path


def _bootstrap() -> None:
    here = Path(__file__).resolve().parent
    root = here.parent.parent
    sys.path[0] = str(root)  # not the package directory itself
    for name, path in (("grpo_envs", here.parent), ("grpo_envs.math", here)):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [str(path)]
            sys.modules[name] = stub


def _limit_memory(mem_limit_mb: int) -> None:
    import resource

    limit = mem_limit_mb * 1024 * 1024
    # ValueError/OSError: a lower hard limit is already in place; keep it.
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str]) -> int:
    """Serve comparison requests until the request pipe closes."""
    from multiprocessing.connection import Connection

    read_fd, write_fd, mem_mb = int(argv[0]), int(argv[1]), int(argv[2])
    requests = Connection(read_fd, writable=False)
    replies = Connection(write_fd, readable=False)
    sys.setrecursionlimit(5000)

    from grpo_envs.math.equivalence import SymbolicComparator, compare
    from grpo_envs.math.normalize import parse_answer

    comparator = SymbolicComparator()
    # Warm up latex2sympy's parser and sympy's caches before announcing readiness, so the first
    # real request is not charged for them.
    compare(parse_answer(r"\frac{\sqrt{2}}{2}"), parse_answer(r"1/\sqrt{2}"), comparator)
    _limit_memory(mem_mb)
    replies.send("ready")
    while True:
        try:
            gold, pred = requests.recv()
        except (EOFError, OSError):
            return 0
        try:
            reply = ("ok", compare(gold, pred, comparator), "")
        except MemoryError:
            reply = ("error", False, "sympy ran out of memory")
        except RecursionError:
            reply = ("error", False, "expression nested too deeply for sympy")
        except Exception as exc:  # any sympy/latex2sympy failure is a typed error, not a crash
            reply = ("error", False, f"{type(exc).__name__}: {str(exc)[:200]}")
        try:
            replies.send(reply)
        except (BrokenPipeError, OSError):
            return 0


if __name__ == "__main__":
    _bootstrap()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
