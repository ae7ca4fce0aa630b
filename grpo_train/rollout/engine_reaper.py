"""Ends an engine's processes when the process that owns them dies without closing them.

vLLM's engine core waits for its client's requests for ever: when the kernel's out-of-memory
killer (or ``kill -9``) takes the trainer alone, the engine core would keep running, holding its
RAM and its ``/dev/shm`` segments, and so would the weight-sync folder in ``/dev/shm``. Started
by ``EngineProcesses.reap_when_owner_dies`` once an engine is up, this small process checks the
owner twice a second; once the owner is gone it kills the engine's processes (each still the one
recorded: same pid, same start time), unlinks the shared-memory segments they mapped and removes
the folders matching the given glob patterns (the weight-sync folder, made after the start). An
owner that closes its engine ends this process first.

It is run as a script by path (``python -I -S engine_reaper.py``): standard library only, so it
starts in milliseconds and imports neither the trainer nor vLLM. It ignores SIGINT and SIGTERM,
which a terminal or a scheduler sends to the whole process group, so that it outlives an owner
that such a signal ends without closing its engine.

    python engine_reaper.py OWNER_PID OWNER_TICKS PID:TICKS... [--shm NAME...] [--remove PATTERN...]
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

#: How often the owner is checked (seconds).
EVERY_S = 0.5


def start_ticks(pid: int) -> int | None:
    """Return a running process's start time (clock ticks since boot); None if gone or a zombie.

    >>> start_ticks(os.getpid()) is not None
    True
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # ended, not yet reaped by its parent
        return None
    return int(fields[19])


def mapped_shm(pid: int) -> set[str]:
    """Return the ``/dev/shm`` files process ``pid`` maps, as names relative to ``/dev/shm``."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    names = set()
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
            names.add(parts[5].removeprefix("/dev/shm/").removesuffix(" (deleted)"))
    return names


Process = tuple[int, int]
"""A process as (pid, start ticks): a reused pid is never taken for it."""


def parse(argv: Sequence[str]) -> tuple[Process, list[Process], list[str], list[str]]:
    """Split the command line into the owner, the engine's processes, segments and folders.

    >>> parse(["10", "5", "11:6", "12:7", "--shm", "psm_a", "--remove", "/dev/shm/x-10.5-*"])
    ((10, 5), [(11, 6), (12, 7)], ['psm_a'], ['/dev/shm/x-10.5-*'])
    """
    lists: dict[str, list[str]] = {"": [], "--shm": [], "--remove": []}
    current = ""
    for word in argv[2:]:
        if word in lists:
            current = word
        else:
            lists[current].append(word)
    engine = [(int(p), int(t)) for p, t in (item.split(":") for item in lists[""])]
    return (int(argv[0]), int(argv[1])), engine, lists["--shm"], lists["--remove"]


def reap(engine: Sequence[Process], shm: Sequence[str], remove: Sequence[str]) -> None:
    """Kill the engine's processes that still run, then remove what they leave behind."""
    alive = [pid for pid, ticks in engine if start_ticks(pid) == ticks]
    segments = set(shm).union(*(mapped_shm(pid) for pid in alive))
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(start_ticks(pid) is not None for pid in alive) and time.monotonic() < deadline:
        time.sleep(0.05)
    for name in segments:
        with contextlib.suppress(OSError):
            (Path("/dev/shm") / name).unlink()
    for pattern in remove:
        for folder in glob.glob(pattern):
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: Sequence[str]) -> int:
    """Wait for the owner to die, then reap its engine."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (owner, owner_ticks), engine, shm, remove = parse(argv)
    while start_ticks(owner) == owner_ticks:
        time.sleep(EVERY_S)
    reap(engine, shm, remove)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
