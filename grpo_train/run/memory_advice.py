"""What to change when a run runs out of accelerator memory: where, and which settings lower it.

torch's ``OutOfMemoryError`` says how many bytes it could not allocate, not which of the run's
settings decide them. ``grpo train`` ends such a run with one line built here: the phase (read
from the deepest grpo-kit frame of the traceback), then the settings that lower it, each with
its value now. Settings that may change on resume come first, as flags for the resume command;
those that define the weights (``lora_r``, ``dtype``) need a new run and are said so.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class Phase(StrEnum):
    """Where in a run the memory ran out."""

    LOADING = "model loading"
    GENERATION = "generation"
    UPDATE = "the update"
    WEIGHT_SYNC = "the weight sync"
    EVALUATION = "evaluation"
    UNKNOWN = "the run"


#: The grpo_train module folder (or module) of the deepest frame -> its phase; first match wins.
_PHASES: tuple[tuple[str, Phase], ...] = (
    ("learner/weight_export.py", Phase.WEIGHT_SYNC),
    ("eval/", Phase.EVALUATION),
    ("rollout/", Phase.GENERATION),
    ("collect/", Phase.GENERATION),
    ("episodes/", Phase.GENERATION),
    ("learner/", Phase.UPDATE),
    ("algorithm/", Phase.UPDATE),
    ("models/", Phase.LOADING),
    ("setup/", Phase.LOADING),
)


def phase_of(err: BaseException) -> Phase:
    """Return the phase of the deepest grpo-kit frame in ``err``'s traceback.

    >>> phase_of(RuntimeError("no traceback"))
    <Phase.UNKNOWN: 'the run'>
    """
    package = Path(__file__).resolve().parent.parent
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        path = Path(frame.filename).resolve()
        if not path.is_relative_to(package):
            continue
        inside = path.relative_to(package).as_posix()
        for prefix, phase in _PHASES:
            if inside.startswith(prefix):
                return phase
    return Phase.UNKNOWN


@dataclass(frozen=True)
class Change:
    """One setting that lowers the phase's memory: its flag, the value to try, its value now."""

    name: str
    value: str
    now: str
    new_run: bool = False
    """The setting defines the weights (``--resume`` refuses a change): a new run only."""

    def __str__(self) -> str:
        return f"--{self.name} {self.value} (now {self.now})"


@dataclass(frozen=True)
class MemorySettings:
    """The settings of a run that decide its GPU memory (``setup.settings.memory_settings``)."""

    micro_batch_tokens: int
    gradient_checkpointing: bool
    lora_r: int
    dtype: str
    max_completion_length: int
    colocated_vllm: bool
    """The rollout engine is vLLM beside the trainer, on its GPU."""
    vllm_memory_fraction: float
    vllm_sleep_mode: bool
    vllm_sync_bucket_mb: float
    asynchronous: bool
    """Generation overlaps the update (``async_generation`` with ``max_staleness`` > 0)."""
    reference_copy: bool
    """Full fine-tuning with a KL term: a reference copy of the model is kept (LoRA has none)."""
    offload_reference: bool


def memory_changes(phase: Phase, settings: MemorySettings) -> list[Change]:
    """List the settings that lower ``phase``'s memory, each with a value to try.

    Only settings that are not already at their lowest; those a resume takes first.
    """
    s = settings
    generating = phase in (Phase.GENERATION, Phase.EVALUATION)
    trainer_side = phase in (Phase.UPDATE, Phase.LOADING, Phase.UNKNOWN)
    changes: list[Change] = []
    if phase in (Phase.UPDATE, Phase.UNKNOWN):
        if s.micro_batch_tokens > 128:
            tokens = s.micro_batch_tokens
            changes.append(Change("micro_batch_tokens", str(tokens // 2), str(tokens)))
        if not s.gradient_checkpointing:
            changes.append(Change("gradient_checkpointing", "true", "false"))
        # (Sleep mode cannot overlap generation with the update: not with async_generation.)
        if s.colocated_vllm and not s.vllm_sleep_mode and not s.asynchronous:
            changes.append(Change("vllm_sleep_mode", "true", "false"))
    offloadable = s.reference_copy and not s.offload_reference
    if trainer_side and offloadable:
        changes.append(Change("offload_reference", "true", "false"))
    # (Not hf_max_batch_size: the hf engine halves its rows itself before it gives up.)
    if generating and s.max_completion_length > 256:
        length = s.max_completion_length
        changes.append(Change("max_completion_length", str(length // 2), str(length)))
    share = s.vllm_memory_fraction
    if s.colocated_vllm and generating and share < 0.85:
        # vLLM's share holds its weights and KV cache: generation needs more of it.
        changes.append(Change("vllm_memory_fraction", f"{share + 0.1:g}", f"{share:g}"))
    if s.colocated_vllm and trainer_side and share > 0.15:
        # The trainer has what vLLM's share leaves: a smaller share leaves it more.
        changes.append(Change("vllm_memory_fraction", f"{share - 0.1:g}", f"{share:g}"))
    if phase is Phase.WEIGHT_SYNC and s.vllm_sync_bucket_mb > 32:
        bucket = s.vllm_sync_bucket_mb
        changes.append(Change("vllm_sync_bucket_mb", f"{bucket / 4:g}", f"{bucket:g}"))
    # LoRA trains a few adapters: no gradients or optimizer state for the model's weights, and
    # no reference copy; loading it saves only the reference copy.
    if s.lora_r == 0 and (phase in (Phase.UPDATE, Phase.UNKNOWN) or s.reference_copy):
        changes.append(Change("lora_r", "16", "0", new_run=True))
    if phase is Phase.LOADING and s.dtype == "float32":
        changes.append(Change("dtype", "bfloat16", "float32", new_run=True))
    return changes


#: Where torch's out-of-memory text turns from the failed allocation to its accounting.
_TORCH_TAILS = ("Including non-PyTorch memory", "Of the allocated memory", "If reserved but")


def failed_allocation(err: BaseException) -> str:
    """Return torch's words on the allocation that failed, without its accounting and advice.

    torch's message says what it tried to allocate and what the device has, then this process's
    memory by category and allocator advice, which the run's own settings replace here.

    >>> failed_allocation(RuntimeError("CUDA out of memory. Tried to allocate 8.00 MiB. GPU 0 "
    ...     "has a total capacity of 15.77 GiB of which 2.12 MiB is free. Including non-PyTorch "
    ...     "memory, this process has 15.76 GiB memory in use."))
    'CUDA out of memory. Tried to allocate 8.00 MiB. GPU 0 has a total capacity of 15.77 GiB of \
which 2.12 MiB is free'
    """
    said = " ".join(str(err).split())
    cuts = [at for tail in _TORCH_TAILS if (at := said.find(tail)) > 0]
    return said[: min(cuts)].rstrip(" .") if cuts else said


def out_of_memory_line(err: BaseException, settings: MemorySettings) -> str:
    """Say in one line where a run ran out of accelerator memory, in torch's words, what to try."""
    phase = phase_of(err)
    changes = memory_changes(phase, settings)
    resumable = [str(c) for c in changes if not c.new_run]
    new_run = [str(c) for c in changes if c.new_run]
    parts = [f"out of GPU memory during {phase.value} ({failed_allocation(err)})"]
    if resumable:
        parts.append("settings that lower it: " + ", ".join(resumable))
    if new_run:
        parts.append("for a new run: " + ", ".join(new_run))
    return "; ".join(parts)
