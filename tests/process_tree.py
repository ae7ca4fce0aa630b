"""Process-tree checks for tests of commands that start processes (``grpo sandbox serve``).

Read from ``/proc``: every process below a pid, and whether a pid still runs (a zombie does not).
"""

from __future__ import annotations

import os
from pathlib import Path


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (children, their children, ...)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (exists and is not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
