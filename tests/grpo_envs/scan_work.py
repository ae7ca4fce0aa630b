"""Deterministic work counts for "this scan is linear" tests (no wall clock: the machine is noisy).

``python_lines(fn, arg)`` counts the Python lines executed by ``fn(arg)`` (all frames, through
``sys.settrace``); the same code on the same input always gives the same count. A scan that
retries, rescans or backtracks in Python shows up as a count that grows faster than its input.
Time spent inside C (a regex engine) is not counted; ``benchmarks/`` measures speed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


class WorkBudgetExceeded(AssertionError):
    """The traced call ran more lines than its budget: far from linear."""


def python_lines(fn: Callable[[Any], object], arg: object, budget: int = 5_000_000) -> int:
    """Return the number of Python lines ``fn(arg)`` executes (raises past ``budget``)."""
    count = 0

    def tracer(frame: FrameType, event: str, _arg: object) -> Callable[..., object] | None:
        nonlocal count
        if event == "line":
            count += 1
            if count > budget:
                raise WorkBudgetExceeded(f"more than {budget} lines")
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn(arg)
    finally:
        sys.settrace(previous)
    return count


def assert_linear(fn: Callable[[Any], object], make: Callable[[int], object], n: int) -> None:
    """Assert that doubling the input size ``n`` at most about doubles ``fn``'s work."""
    fn(make(n))  # first-call costs (regex compilation, caches) are not the scan's
    small, large = python_lines(fn, make(n)), python_lines(fn, make(2 * n))
    assert large <= 2.2 * small + 500, (small, large)
