"""Atomic, resumable checkpoints.

A checkpoint is a folder ``RUN_DIR/checkpoints/step-000010/`` holding:

- ``model/``: the policy in Hugging Face format (safetensors + tokenizer), loadable by
  transformers and vLLM as is;
- ``trainer_state.pt``: optimizer, LR scheduler, RNG states (python, numpy, torch), the step and
  the prompt sampler's position;
- ``config.yaml``: the resolved configuration;
- ``accelerate/`` (FSDP and DeepSpeed runs only): ``Accelerator.save_state`` output, i.e. the
  sharded training state (optimizer shards, per-rank RNG) in the layout the launcher's config
  asks for (FSDP ``fsdp_state_dict_type``: one gathered file, or per-rank DCP shards; DeepSpeed:
  its own ``save_checkpoint`` folder). ``trainer_state.pt`` then holds no optimizer.

Why accelerate's own state for sharded runs: under FSDP each rank's optimizer holds only its
shard (DTensors), and under DeepSpeed the optimizer lives inside the engine, so rank 0's
``optimizer.state_dict()`` is a fraction of the state and cannot be loaded into a fresh
optimizer. ``save_state`` / ``load_state`` go through
``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` (FSDP2) or
``FSDP.optim_state_dict`` (FSDP1) or DeepSpeed's engine, which is what accelerate documents for
resuming "in the same environment".

It is written into a temporary folder beside its final place and renamed into place, so a crash
while saving never leaves a half-written checkpoint that ``--resume`` would pick up. Only the last
``keep_last`` checkpoints are kept.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from grpo_train.config import TrainConfig

_PREFIX = "step-"
STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"
ACCELERATE_DIR = "accelerate"


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
    accelerator: Any = None,
) -> Path:
    """Write a checkpoint of ``step`` atomically and delete all but the newest ``keep_last``.

    A LoRA (peft) model writes only its adapter into ``model/``. ``state_dict``: the gathered
    full weights of a sharded (FSDP / ZeRO-3) model (``distributed.full_state_dict``; only rank
    0's matters). ``accelerator``: the run's ``accelerate.Accelerator`` in a launched job; the call
    is then collective (every rank calls it, the main process writes the shared files) and an
    FSDP / DeepSpeed run's optimizer goes through ``accelerator.save_state`` into
    ``accelerate/``. Without it, a single process writes everything.
    """
    from grpo_train.distributed import shards_training_state

    sharded = shards_training_state(accelerator)
    main = accelerator is None or bool(accelerator.is_main_process)
    barrier: Callable[[], None] = (
        accelerator.wait_for_everyone if accelerator is not None else lambda: None
    )
    root = checkpoint_dir(run_dir)
    final = checkpoint_path(run_dir, step)
    # The same name on every rank (save_state writes per-rank files into it); rank 0 clears
    # what a crashed save may have left.
    tmp = root / f".tmp-{final.name}"
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    try:
        if sharded:  # collective: optimizer shards, model shards, per-rank RNG
            accelerator.save_state(str(tmp / ACCELERATE_DIR))
        if main:
            _write_files(
                tmp,
                step,
                model=model,
                tokenizer=tokenizer,
                optimizer=None if sharded else optimizer,
                scheduler=scheduler,
                sampler=sampler,
                config=config,
                state_dict=state_dict,
            )
        barrier()  # every rank's files are in tmp before it is renamed
        if main:
            _publish(tmp, final)
    finally:
        if main and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if main:
        for stale in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(stale, ignore_errors=True)
    barrier()
    return final


def _write_files(
    folder: Path,
    step: int,
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sampler: SamplerState,
    config: TrainConfig,
    state_dict: Mapping[str, torch.Tensor] | None,
) -> None:
    """Write the main process's part of a checkpoint: HF model, trainer state, config."""
    full = None if state_dict is None else dict(state_dict)
    model.save_pretrained(folder / MODEL_DIR, safe_serialization=True, state_dict=full)
    tokenizer.save_pretrained(folder / MODEL_DIR)
    state = {
        "step": step,
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": _rng_state(),
        "sampler": {"draws": sampler.draws, "positions": list(sampler.positions)},
    }
    torch.save(state, folder / STATE_FILE)
    config.save(folder / "config.yaml")


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished temporary folder into place (replacing a checkpoint of the same step)."""
    if final.exists():  # re-saving a step (e.g. after a resume): swap, then delete the old one
        old = final.with_name(f".old-{final.name}")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)


def load_checkpoint(
    path: str | Path,
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    accelerator: Any = None,
) -> ResumeState:
    """Restore optimizer, scheduler and RNG states from ``path`` (the model is in ``path/model``).

    Call it after the model, optimizer and scheduler are built (and, in a launched job, after
    ``accelerator.prepare``) and before anything draws random numbers, so that the resumed run
    continues exactly where the saved one stopped. A checkpoint of an FSDP / DeepSpeed run is
    restored with ``accelerator.load_state`` (collective: call on every rank, under the same
    launcher configuration that saved it).
    """
    from grpo_train.distributed import shards_training_state

    path = Path(path)
    file = path / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(
            f"{path} is not a checkpoint (no {STATE_FILE}); pass a step-NNNNNN folder"
        )
    sharded_ckpt = (path / ACCELERATE_DIR).is_dir()
    if sharded_ckpt != shards_training_state(accelerator):
        saved, now = ("a", "no") if sharded_ckpt else ("no", "a")
        raise ValueError(
            f"{path} was saved by {saved} sharded (FSDP / DeepSpeed) run and this is {now} "
            "sharded run: the optimizer state cannot be carried over. Resume under the launcher "
            "config that saved it, or start a new run from its weights "
            f"(--model {path / MODEL_DIR})"
        )
    state = torch.load(file, map_location="cpu", weights_only=True)
    scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    if sharded_ckpt:
        # Model and optimizer shards, and each rank's own RNG states (after rank 0's above).
        accelerator.load_state(str(path / ACCELERATE_DIR))
    else:
        optimizer.load_state_dict(state["optimizer"])
    sampler = SamplerState(
        int(state["sampler"]["draws"]), tuple(int(p) for p in state["sampler"]["positions"])
    )
    return ResumeState(step=int(state["step"]), sampler=sampler, path=path)
