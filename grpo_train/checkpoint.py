"""Atomic, resumable checkpoints.

A checkpoint is a folder ``RUN_DIR/checkpoints/step-000010/`` holding:

- ``model/``: the policy in Hugging Face format (safetensors + tokenizer), loadable by
  transformers and vLLM as is;
- ``trainer_state.pt``: optimizer, LR scheduler, RNG states (python, numpy, torch), the step and
  the prompt sampler's position;
- ``config.yaml``: the resolved configuration.

It is written into a temporary folder beside its final place and renamed into place, so a crash
while saving never leaves a half-written checkpoint that ``--resume`` would pick up. Only the last
``keep_last`` checkpoints are kept.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from grpo_train.config import TrainConfig

_PREFIX = "step-"
STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"


@dataclass(frozen=True)
class SamplerState:
    """Position of the prompt sampler: prompts drawn so far, and per environment."""

    draws: int = 0
    positions: tuple[int, ...] = ()


@dataclass(frozen=True)
class ResumeState:
    """What ``load_checkpoint`` restores besides the tensors it loads in place."""

    step: int
    sampler: SamplerState
    path: Path


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Return the folder holding a run's checkpoints."""
    return Path(run_dir) / "checkpoints"


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    """Return the folder of the checkpoint of ``step``."""
    return checkpoint_dir(run_dir) / f"{_PREFIX}{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Return the newest complete checkpoint of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def _rng_state() -> dict[str, object]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # type: ignore[misc]
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(np.asarray(keys).copy()), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_state(state: dict[str, object]) -> None:
    random.setstate(state["python"])  # type: ignore[arg-type]
    numpy_state = cast(tuple[str, torch.Tensor, int, int, float], state["numpy"])
    kind, keys, pos, has_gauss, gauss = numpy_state
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])  # type: ignore[arg-type]
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])  # type: ignore[arg-type]


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sampler: SamplerState,
    config: TrainConfig,
    keep_last: int,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write a checkpoint of ``step`` atomically and delete all but the newest ``keep_last``.

    A LoRA (peft) model writes only its adapter into ``model/``. ``state_dict``: the gathered
    full weights of a sharded (FSDP / ZeRO-3) model (``distributed.full_state_dict``).
    """
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(run_dir, step)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        full = None if state_dict is None else dict(state_dict)
        model.save_pretrained(tmp / MODEL_DIR, safe_serialization=True, state_dict=full)
        tokenizer.save_pretrained(tmp / MODEL_DIR)
        state = {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": _rng_state(),
            "sampler": {"draws": sampler.draws, "positions": list(sampler.positions)},
        }
        torch.save(state, tmp / STATE_FILE)
        config.save(tmp / "config.yaml")
        if final.exists():  # re-saving a step (e.g. after a resume): swap, then delete the old one
            old = final.with_name(f".old-{final.name}")
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    for stale in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def load_checkpoint(
    path: str | Path,
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> ResumeState:
    """Restore optimizer, scheduler and RNG states from ``path`` (the model is in ``path/model``).

    Call it after the model, optimizer and scheduler are built and before anything draws random
    numbers, so that the resumed run continues exactly where the saved one stopped.
    """
    path = Path(path)
    file = path / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(
            f"{path} is not a checkpoint (no {STATE_FILE}); pass a step-NNNNNN folder"
        )
    state = torch.load(file, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    sampler = SamplerState(
        int(state["sampler"]["draws"]), tuple(int(p) for p in state["sampler"]["positions"])
    )
    return ResumeState(step=int(state["step"]), sampler=sampler, path=path)
