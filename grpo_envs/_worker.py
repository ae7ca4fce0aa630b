"""Worker process of ``grpo_envs.executor.WorkerPool``: serves one target's requests, forever.

Run as ``python _worker.py READ_FD WRITE_FD MEM_LIMIT_MB MODULE:FACTORY light|full``. It calls
``FACTORY()`` once (imports, warm-up), caps its address space, sends ``"ready"``, then answers each
request read on READ_FD with ``(status, value, detail)`` on WRITE_FD; it exits when READ_FD closes
(the parent died or closed the pool). It is started as a script, not with ``-m``; ``light`` stubs
the parent packages so that importing e.g. ``grpo_envs.math.equivalence`` does not run
``grpo_envs/__init__.py``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from pathlib import Path


def _bootstrap(light: bool, target: str) -> None:
    here = Path(__file__).resolve().parent
    root = str(here.parent)
    if sys.path and Path(sys.path[0]).resolve() == here:
        sys.path[0] = root  # not the package directory itself
    elif root not in sys.path:
        sys.path.insert(0, root)
    if not light:
        return
    packages = target.partition(":")[0].split(".")[:-1]  # e.g. grpo_envs, grpo_envs.math
    for depth in range(1, len(packages) + 1):
        name = ".".join(packages[:depth])
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [str(here.joinpath(*packages[1:depth]))]
            sys.modules[name] = stub


def _limit_memory(mem_limit_mb: int) -> None:
    import resource

    limit = mem_limit_mb * 1024 * 1024
    # ValueError/OSError: a lower hard limit is already in place; keep it.
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str]) -> int:
    """Serve requests until the request pipe closes."""
    from multiprocessing.connection import Connection

    read_fd, write_fd, mem_mb, target = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    requests = Connection(read_fd, writable=False)
    replies = Connection(write_fd, readable=False)
    sys.setrecursionlimit(5000)
    try:
        module_name, _, attr = target.partition(":")
        handler = getattr(importlib.import_module(module_name), attr)()
    except Exception as exc:
        replies.send(f"target {target} failed to start: {type(exc).__name__}: {exc}")
        return 1
    _limit_memory(mem_mb)
    replies.send("ready")
    while True:
        try:
            request = requests.recv()
        except (EOFError, OSError):
            return 0
        try:
            reply = ("ok", handler(request), "")
        except MemoryError:
            reply = ("error", None, "the worker ran out of memory")
        except RecursionError:
            reply = ("error", None, "input nested too deeply")
        except Exception as exc:  # any failure of the handler is a typed error, not a crash
            reply = ("error", None, f"{type(exc).__name__}: {str(exc)[:200]}")
        try:
            replies.send(reply)
        except (BrokenPipeError, OSError):
            return 0
        except Exception as exc:  # an unpicklable value must not lose the reply
            with contextlib.suppress(BrokenPipeError, OSError):
                replies.send(("error", None, f"result not sendable: {exc}"[:300]))


if __name__ == "__main__":
    _bootstrap(len(sys.argv) > 5 and sys.argv[5] == "light", sys.argv[4])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
