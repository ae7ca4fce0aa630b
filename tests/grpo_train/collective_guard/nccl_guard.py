"""A guard for multi-rank tests: ``sitecustomize.py`` beside it installs it in every process.

It makes a CPU-only gloo run fail where an NCCL run would: every tensor that grpo-kit hands to a
``torch.distributed`` collective must have been placed by ``grpo_train.parallel.distributed.
on_backend_device`` (which moves it to CUDA under NCCL). A tensor built on the CPU and handed to
a collective directly works on gloo and crashes on NCCL ("No backend type associated with device
type cpu"); under this guard it raises at once, naming the call site.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

_CHECKED = (
    "all_gather",
    "all_reduce",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
)
_OWN = ("grpo_train", "grpo_envs", "sandbox")
_MARK = "_placed_for_backend"
GUARD_BANNER = "collective guard installed"


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    import torch

    found: list[Any] = []
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, list | tuple) else [value]
        found.extend(item for item in items if isinstance(item, torch.Tensor))
    return found


def _guarded(name: str, collective: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(collective)
    def call(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        module = str(caller.f_globals.get("__name__", ""))
        if module.split(".")[0] in _OWN:
            for tensor in _tensors(args, kwargs):
                if not getattr(tensor, _MARK, False):
                    raise RuntimeError(
                        f"collective guard: dist.{name} at {module}:{caller.f_lineno} got a "
                        f"{tensor.device.type} tensor not placed by on_backend_device; NCCL "
                        "would reject it"
                    )
        return collective(*args, **kwargs)

    call._nccl_guard = True  # type: ignore[attr-defined]
    return call


def _marking(place: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(place)
    def call(tensor: Any) -> Any:
        placed = place(tensor)
        setattr(placed, _MARK, True)
        return placed

    call._nccl_guard = True  # type: ignore[attr-defined]
    return call


def install() -> None:
    """Wrap the collectives and the placement helper (idempotent)."""
    import torch.distributed as dist

    import grpo_train.parallel.distributed as ours

    if not getattr(ours.on_backend_device, "_nccl_guard", False):
        ours.on_backend_device = _marking(ours.on_backend_device)  # type: ignore[assignment]
    for name in _CHECKED:
        current = getattr(dist, name)
        if not getattr(current, "_nccl_guard", False):
            setattr(dist, name, _guarded(name, current))
    print(GUARD_BANNER, file=sys.stderr)


def guarded_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this folder first on PYTHONPATH, so every launched rank installs the guard.

    The folder above it (the trainer's tests, with their shared helpers) comes next: a test file
    launched as a rank's script imports ``collective_guard`` and those helpers by name, and runs
    from its own subfolder without pytest's conftest.
    """
    from pathlib import Path

    here = Path(__file__).resolve().parent
    rest = env.get("PYTHONPATH", "")
    paths = f"{here}:{here.parent}"
    return {**env, "PYTHONPATH": paths + (":" + rest if rest else "")}
