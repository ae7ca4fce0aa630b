"""Deprecations raised through grpo-kit's own calls are attributed to the project line that made
the call, so that pyproject's ``filterwarnings`` turns them into test failures.

Python names a warning after the module of the frame its ``stacklevel`` points at, and pytest's
``filterwarnings`` matches that module. A library's deprecation rarely points at its caller:
transformers' renamed forward keywords (``deprecate_kwarg``, stacklevel 2) point at torch's
``Module.__call__``, which ran the forward; its renamed properties (``is_gradient_checkpointing``,
stacklevel 1) at transformers itself. ``error::FutureWarning:grpo_train`` alone would miss both.

``install()`` wraps ``warnings.warn``: a deprecation raised inside a library is attributed to the
first project frame outside it when every frame in between belongs to that library or to call
plumbing (torch's ``Module.__call__``, ``functools``, ``contextlib``), i.e. when the project
made the deprecated call. One that a third library makes (peft reading a renamed transformers
property inside ``get_peft_model``) keeps its attribution: that call is not the project's to
change, and failing on it would fail the suite for another project's code.
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType
from typing import Any

PROJECT = frozenset({"grpo_train", "grpo_envs", "sandbox"})
PLUMBING = frozenset({"torch.nn.modules.module", "functools", "contextlib"})
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)

_real_warn = warnings.warn


def _package(module: str) -> str:
    return module.split(".", 1)[0]


def project_caller_depth(frame: FrameType | None) -> int | None:
    """Depth from ``frame`` (the one that called ``warnings.warn``) of the project frame that made
    the deprecated call; None when the project did not make it or raised the warning itself."""
    origin: str | None = None
    depth = 0
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if origin is None:
            origin = _package(module)
            if origin in PROJECT:
                return None  # the project's own warning: as raised
        elif _package(module) in PROJECT:
            return depth
        elif _package(module) != origin and module not in PLUMBING:
            return None  # another library's call
        frame = frame.f_back
        depth += 1
    return None


def _warn(
    message: Any, category: Any = None, stacklevel: int = 1, source: Any = None, **kwargs: Any
) -> None:
    kind = category if category is not None else type(message)
    if isinstance(kind, type) and issubclass(kind, DEPRECATIONS):
        depth = project_caller_depth(sys._getframe(1))
        if depth is not None:
            stacklevel = depth + 1  # counted from the frame that called warn
    # +1: this wrapper's own frame
    _real_warn(message, category, stacklevel + 1, source, **kwargs)


def install() -> None:
    """Route ``warnings.warn`` through the attribution above (idempotent)."""
    warnings.warn = _warn  # type: ignore[assignment]
