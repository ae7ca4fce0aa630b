"""What the engine's child processes print, passed on unless the engine is ending.

When vLLM's engine processes end because of a stop request (the process group's Ctrl-C) or
because one of them was killed, they print their teardown: tracebacks of the requests they were
serving, ``Process EngineCore: Traceback ...`` from multiprocessing, shutdown notes. The trainer
already says in one line what happened; those pages would bury it, and look like a crash.

``ChildOutput`` gives the processes started inside ``capture()`` pipes as their stdout and
stderr (file descriptors 1 and 2 are inherited by spawned children) and a thread copies each
line to this process's own stdout / stderr after holding it ``HOLD_S``, so that a stop request
or the engine's death, noticed within that time, drops the teardown instead (``mute``). At
``--log_level debug`` nothing is held back.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

#: How long a line of the engine's output waits before it is shown (seconds).
HOLD_S = 0.5


class ChildOutput:
    """The pipes between the engine's processes and this process's stdout / stderr."""

    def __init__(self, muted: Callable[[], bool] = lambda: False, hold_s: float = HOLD_S) -> None:
        self._muted_by = muted
        self._muted = False
        self.hold_s = hold_s
        self._threads: list[threading.Thread] = []

    def mute(self) -> None:
        """Drop what the engine prints from now on (and what is still held)."""
        self._muted = True

    def muted(self) -> bool:
        """Tell whether the engine's output is being dropped (``mute``, or a stop request)."""
        if not self._muted and self._muted_by():
            self._muted = True
        return self._muted

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Give processes started inside the pipes as stdout / stderr; restore this process's."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        saved, pipes = [], []
        try:
            for fd in (1, 2):
                read, write = os.pipe()
                saved.append(os.dup(fd))
                pipes.append((read, write))
                os.dup2(write, fd)
                os.close(write)
        except OSError:  # no such descriptor (a daemon): leave the output as it is
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
            yield
            return
        try:
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, copy, (read, _) in zip((1, 2), saved, pipes):
                os.dup2(copy, fd)  # this process's own output goes straight out again
                thread = threading.Thread(
                    target=self._copy, args=(read, copy), name=f"engine-output-{fd}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _copy(self, read: int, out: int) -> None:
        """Copy lines from ``read`` to ``out``, each after ``hold_s``, unless muted."""
        held: deque[tuple[float, bytes]] = deque()
        lock = threading.Lock()
        finished = threading.Event()

        def release() -> None:
            while not finished.is_set() or held:
                now = time.monotonic()
                with lock:
                    ready = []
                    while held and (now - held[0][0] >= self.hold_s or finished.is_set()):
                        ready.append(held.popleft()[1])
                if ready and not self.muted():
                    with contextlib.suppress(OSError):
                        os.write(out, b"".join(ready))
                time.sleep(0.05)

        releaser = threading.Thread(target=release, name="engine-output-release", daemon=True)
        releaser.start()
        with os.fdopen(read, "rb") as pipe:
            for line in iter(pipe.readline, b""):
                with lock:
                    held.append((time.monotonic(), line))
        finished.set()
        releaser.join()
        os.close(out)

    def close(self, timeout: float = 2.0) -> None:
        """Wait a moment for the last lines (the engine's processes have ended by now)."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
