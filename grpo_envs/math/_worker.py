"""The sympy side of ``grpo_envs.math.pool``: the target each math worker process serves.

``serve()`` runs once in a ``grpo_envs.executor`` worker (imports sympy and warms up its parser
and caches, so the first real request is not charged for them) and returns the handler that
compares one ``(gold, pred)`` pair of parsed answers.

The handler never raises: a pair sympy fails on (an exception, memory, recursion; the predicted
answer is the model's text) comes back as a string saying why, which ``pool`` reports as "not
compared" rather than as a failure of the worker.
"""

from __future__ import annotations

from collections.abc import Callable


def serve() -> Callable[[object], bool | str]:
    """Warm up sympy and return the comparison handler."""
    from grpo_envs.math.answer_tree import Node
    from grpo_envs.math.equivalence import SymbolicComparator, compare
    from grpo_envs.math.normalize import parse_answer

    comparator = SymbolicComparator()
    compare(parse_answer(r"\frac{\sqrt{2}}{2}"), parse_answer(r"1/\sqrt{2}"), comparator)

    def handle(request: object) -> bool | str:
        pair: tuple[Node, Node] = request  # type: ignore[assignment]
        try:
            return compare(pair[0], pair[1], comparator)
        except MemoryError:
            return "sympy ran out of memory on this answer"
        except RecursionError:
            return "the answer is nested too deeply for sympy"
        except Exception as exc:
            return f"sympy failed on this answer: {type(exc).__name__}: {str(exc)[:200]}"

    return handle
