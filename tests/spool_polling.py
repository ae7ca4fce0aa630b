"""What another process would see of a weight-sync spool in /dev/shm while a sync runs.

Shared by the tests of engines whose workers run in processes of their own (a child engine, a
``grpo serve`` replica): the most bytes the spool's files held at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


@contextlib.contextmanager
def spool_peak(files: Callable[[], Iterable[Path]]) -> Iterator[list[int]]:
    """Poll ``files()`` every millisecond while open; ``peak[0]``: their largest total size."""
    stop, peak = threading.Event(), [0]

    def poll() -> None:
        while not stop.is_set():
            total = 0
            for path in files():
                with contextlib.suppress(FileNotFoundError):  # deleted since the listing
                    total += path.stat().st_size
            peak[0] = max(peak[0], total)
            time.sleep(0.001)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        yield peak
    finally:
        stop.set()
        poller.join()
