"""The sympy side of ``grpo_envs.math.pool``: the target each math worker process serves.

``serve()`` runs once in a ``grpo_envs.executor`` worker (imports sympy and warms up its parser
and caches, so the first real request is not charged for them) and returns the handler that
compares one ``(gold, pred)`` pair of parsed answers.
"""

from __future__ import annotations

from collections.abc import Callable


def serve() -> Callable[[object], bool]:
    """Warm up sympy and return the comparison handler."""
    from grpo_envs.math.equivalence import SymbolicComparator, compare
    from grpo_envs.math.normalize import Node, parse_answer

    comparator = SymbolicComparator()
    compare(parse_answer(r"\frac{\sqrt{2}}{2}"), parse_answer(r"1/\sqrt{2}"), comparator)

    def handle(request: object) -> bool:
        pair: tuple[Node, Node] = request  # type: ignore[assignment]
        return compare(pair[0], pair[1], comparator)

    return handle
