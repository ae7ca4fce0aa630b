"""Where a run ran out of accelerator memory, and the settings its one line proposes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import grpo_train
from grpo_train.config import TrainConfig
from grpo_train.run.memory_advice import Phase, memory_changes, out_of_memory_line, phase_of
from grpo_train.setup.settings import memory_settings

PACKAGE = Path(grpo_train.__file__).resolve().parent
#: torch 2.x's CUDA out-of-memory text, as the caching allocator words it.
TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of "
    "which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in "
    "use. Of the allocated memory 76.40 GiB is allocated by PyTorch, and 1.12 GiB is reserved by "
    "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def _raised_through(*files: Path) -> torch.OutOfMemoryError:
    """torch's error raised below frames of these files, outermost first (the call stack)."""

    def allocate() -> None:
        raise torch.OutOfMemoryError(TORCH_OOM)

    call: Callable[[], None] = allocate
    for file in reversed(files):
        namespace: dict[str, object] = {"inner": call}
        exec(compile("def outer():\n    inner()\n", str(file), "exec"), namespace)
        call = namespace["outer"]  # type: ignore[assignment]
    try:
        call()
    except torch.OutOfMemoryError as err:
        return err
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("stack", "phase"),
    [
        (["trainer.py", "learner/update.py", "learner/forward.py"], Phase.UPDATE),
        (["trainer.py", "learner/weight_export.py"], Phase.WEIGHT_SYNC),
        (["trainer.py", "collect/collector.py", "rollout/hf.py"], Phase.GENERATION),
        (["trainer.py", "eval/runner.py", "rollout/vllm_engine.py"], Phase.GENERATION),
        (["trainer.py", "eval/runner.py"], Phase.EVALUATION),
        (["train_cli.py", "setup/run.py", "models/loading.py"], Phase.LOADING),
        (["train_cli.py", "setup/run.py"], Phase.LOADING),
        (["train_cli.py", "trainer.py"], Phase.UNKNOWN),
    ],
)
def test_the_phase_is_the_deepest_grpo_kit_frames(stack: list[str], phase: Phase) -> None:
    assert phase_of(_raised_through(*(PACKAGE / f for f in stack))) is phase


def test_frames_outside_the_package_do_not_count(tmp_path: Path) -> None:
    # A test tree mirrors the package's folders: its learner/ is not the learner.
    err = _raised_through(PACKAGE / "trainer.py", tmp_path / "grpo_train" / "learner" / "x.py")
    assert phase_of(err) is Phase.UNKNOWN


def _changes(phase: Phase, **flat: object) -> list[str]:
    return [str(c) for c in memory_changes(phase, memory_settings(TrainConfig.from_flat(flat)))]


def test_the_update_proposes_what_lowers_its_memory_and_not_what_is_already_low() -> None:
    assert _changes(Phase.UPDATE, engine="hf") == [
        "--micro_batch_tokens 1024 (now 2048)",
        "--gradient_checkpointing true (now false)",
        "--lora_r 16 (now 0)",
    ]
    # Colocated vLLM: its share is the trainer's loss; asleep, the update has all of it.
    assert _changes(
        Phase.UPDATE, engine="vllm", micro_batch_tokens=100, gradient_checkpointing=True, lora_r=8
    ) == ["--vllm_sleep_mode true (now false)", "--vllm_memory_fraction 0.2 (now 0.3)"]
    # Full fine-tuning with a KL reference: the reference copy can wait in host RAM.
    assert "--offload_reference true (now false)" in _changes(Phase.UPDATE, engine="hf", beta=0.04)
    # Sleep mode cannot overlap generation with the update (async_generation): not proposed.
    assert "--vllm_sleep_mode true (now false)" not in _changes(
        Phase.UPDATE, engine="vllm", async_generation=True
    )
    assert "--offload_reference true (now false)" not in _changes(
        Phase.UPDATE, engine="hf", beta=0.04, lora_r=16
    )


def test_generation_proposes_shorter_completions_or_a_larger_vllm_share() -> None:
    assert _changes(Phase.GENERATION, engine="hf") == ["--max_completion_length 512 (now 1024)"]
    assert _changes(Phase.EVALUATION, engine="vllm", max_completion_length=200) == [
        "--vllm_memory_fraction 0.4 (now 0.3)"
    ]
    # A share already near all of the device is not raised further.
    assert _changes(Phase.GENERATION, engine="vllm", vllm_memory_fraction=0.9) == [
        "--max_completion_length 512 (now 1024)"
    ]
    assert _changes(Phase.WEIGHT_SYNC, engine="vllm") == ["--vllm_sync_bucket_mb 64 (now 256)"]
    assert _changes(Phase.WEIGHT_SYNC, engine="vllm", vllm_memory_fraction=0.9) == [
        "--vllm_sync_bucket_mb 64 (now 256)"
    ]


def test_loading_proposes_what_lowers_the_weights_held() -> None:
    # The policy alone: only a 16-bit dtype; LoRA would load the same weights.
    assert _changes(Phase.LOADING, engine="hf", dtype="float32") == [
        "--dtype bfloat16 (now float32)"
    ]
    # With a KL term full fine-tuning also holds a reference copy: offloaded, or none with LoRA.
    assert _changes(Phase.LOADING, engine="hf", beta=0.04) == [
        "--offload_reference true (now false)",
        "--lora_r 16 (now 0)",
    ]
    # Beside colocated vLLM the trainer has what vLLM's share leaves.
    assert _changes(Phase.LOADING, engine="vllm", lora_r=16) == [
        "--vllm_memory_fraction 0.2 (now 0.3)"
    ]


def test_the_line_keeps_torchs_allocation_and_drops_its_allocator_advice() -> None:
    err = _raised_through(PACKAGE / "trainer.py", PACKAGE / "learner" / "update.py")
    line = out_of_memory_line(
        err, memory_settings(TrainConfig.from_flat({"engine": "hf", "lora_r": 16}))
    )
    assert line == (
        "out of GPU memory during the update (CUDA out of memory. Tried to allocate 2.00 GiB. GPU "
        "0 has a total capacity of 79.15 GiB of which 1.06 GiB is free); settings that lower "
        "it: --micro_batch_tokens 1024 (now 2048), --gradient_checkpointing true (now false)"
    )
    full = out_of_memory_line(err, memory_settings(TrainConfig.from_flat({"engine": "hf"})))
    assert full.endswith("; for a new run: --lora_r 16 (now 0)")
