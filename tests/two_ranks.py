"""The command that runs a script on two gloo ranks through accelerate's launcher.

`accelerate launch --cpu` starts several processes only through MPI (mpirun); its torchrun
launcher (`--multi_gpu`) with ``ACCELERATE_USE_CPU=true`` in the environment gives gloo ranks on
the CPU instead. Shared by the tests that run the real trainer on two ranks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpo_train.rollout.weight_channel import free_port


def accelerate_two_ranks(script: str) -> list[str]:
    """``accelerate launch`` of ``script`` on 2 processes of this machine, on a free port."""
    accelerate = Path(sys.executable).with_name("accelerate")
    return [
        str(accelerate), "launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), script,
    ]  # fmt: skip
