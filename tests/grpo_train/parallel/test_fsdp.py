"""FSDP2 on two CPU ranks through the real ``grpo train``: sharded checkpoints, exact resume.

accelerate turns a launch into FSDP only for accelerator devices: with ``ACCELERATE_USE_CPU`` it
keeps ``DistributedType.MULTI_CPU`` and silently drops the FSDP plugin (``AcceleratorState``
promotes only the ``MULTI_GPU``/``MULTI_XPU``/... types to ``FSDP``, accelerate 1.15
``state.py``). torch's FSDP2 (``fully_shard``) itself runs on CPU over gloo, so the worker here
sets accelerate's state to FSDP, with the plugin that ``accelerate launch --config_file
examples/accelerate/fsdp.yaml`` configured, before the trainer starts. Everything after that is
accelerate's own FSDP2 code: ``fsdp2_prepare_model``, ``clip_grad_norm_``, ``save_state``,
``load_state``. This shim is for the test only; on GPUs the config works as is.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from collective_guard.nccl_guard import guarded_env

REPO = Path(__file__).resolve().parents[3]
FSDP_CONFIG = REPO / "examples" / "accelerate" / "fsdp.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli_args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "grpo", "train", "--model", str(model), "--env", "test/digit-v0", "--engine", "hf",
        "--max_steps", "3", "--save_every", "2", "--num_generations", "4",
        "--prompts_per_step", "4", "--max_completion_length", "6", "--eval_size", "2",
        "--learning_rate", "5e-3", "--seed", "11", "--seed_per_prompt", "true",
        "--progress", "false", "--log_every_samples", "0", "--output_dir", str(out), *extra,
    ]  # fmt: skip


def _launch(args: list[str], state_dict_type: str) -> subprocess.CompletedProcess[str]:
    """``accelerate launch`` the shipped FSDP config on 2 CPU ranks, running ``args``."""
    cmd = [
        str(Path(sys.executable).with_name("accelerate")), "launch",
        "--config_file", str(FSDP_CONFIG), "--num_processes", "2", "--mixed_precision", "no",
        "--fsdp_state_dict_type", state_dict_type, "--main_process_port", str(_free_port()),
        __file__, *args,
    ]  # fmt: skip
    env = guarded_env({**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"})
    env["TOKENIZERS_PARALLELISM"] = "false"
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)


LORA = ("--lora_r", "4", "--lora_alpha", "8", "--beta", "0.05", "--save_merged", "true")


@pytest.mark.slow
@pytest.mark.timeout(330)
@pytest.mark.parametrize(
    ("state_dict_type", "extra"),
    [("SHARDED_STATE_DICT", ()), ("FULL_STATE_DICT", ()), ("SHARDED_STATE_DICT", LORA)],
    ids=["sharded", "full", "sharded-lora-kl"],
)
def test_fsdp_checkpoint_resume_matches_uninterrupted_run(
    tmp_path: Path, tiny_model_path: Path, state_dict_type: str, extra: tuple[str, ...]
) -> None:
    """3 steps straight == 2 steps, checkpoint, resume for step 3; the HF folder loads.

    The LoRA case also covers the KL term against the adapter-free reference through the
    FSDP wrapper, an adapter-only ``model/`` and ``save_merged`` gathering the shards.
    """
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo_train.run.run_log import read_metrics

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run = _launch(_cli_args(tiny_model_path, straight, *extra), state_dict_type)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-5000:]
    step2 = straight / "checkpoints" / "step-000002"
    # The sharded training state went through accelerate: one file per rank of RNG, and the
    # optimizer either per-rank DCP shards or one gathered file, depending on the config.
    saved = sorted(p.name for p in (step2 / "accelerate").iterdir())
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= set(saved)
    assert ("optimizer_0" if state_dict_type == "SHARDED_STATE_DICT" else "optimizer.bin") in saved
    assert torch.load(step2 / "trainer_state.pt", weights_only=True)["optimizer"] is None

    shutil.copytree(step2, resumed / "checkpoints" / step2.name)
    run = _launch(
        _cli_args(tiny_model_path, resumed, *extra, "--resume", "latest"), state_dict_type
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-5000:]

    a, b = read_metrics(straight)[-1], read_metrics(resumed)[-1]
    assert a["step"] == b["step"] == 3
    for key in ("reward/mean", "loss", "grad_norm", "entropy", "eval/accuracy", "kl"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    # Full fine-tuning: the step's HF folder; LoRA: the merged folder written at the end.
    last = Path("merged") if extra else Path("checkpoints") / "step-000003" / "model"
    final = [load_file(r / last / "model.safetensors") for r in (straight, resumed)]
    initial = load_file(tiny_model_path / "model.safetensors")
    assert max(float((final[0][k] - initial[k]).abs().max()) for k in initial) > 1e-4
    for name, tensor in final[0].items():
        torch.testing.assert_close(final[1][name], tensor, rtol=0, atol=1e-6, msg=name)
    if extra:
        adapter = straight / "checkpoints" / "step-000003" / "model"
        assert (adapter / "adapter_model.safetensors").is_file()

    # The gathered HF folder is a plain transformers checkpoint with the trained weights.
    model = AutoModelForCausalLM.from_pretrained(straight / last)
    for name, tensor in model.state_dict().items():
        if name in final[0]:
            torch.testing.assert_close(tensor, final[0][name], rtol=0, atol=0, msg=name)


def _force_fsdp_on_cpu() -> None:
    """Make accelerate's state FSDP on CPU ranks (see the module docstring for why)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    Accelerator()  # initialises the process group and the (singleton) state as MULTI_CPU
    state = AcceleratorState()
    # The plugin reads the FSDP_* variables `accelerate launch` set from the config file.
    state.fsdp_plugin = FullyShardedDataParallelPlugin()
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def _main(argv: list[str]) -> int:
    """The real ``grpo`` CLI with the toy ``test/digit-v0`` registered, under forced FSDP."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    import grpo_envs
    from grpo_train.cli import main

    _force_fsdp_on_cpu()
    grpo_envs.register("test/digit-v0", "toy_env:DigitEnv")
    return main(argv)


if __name__ == "__main__" and sys.argv[1:2] == ["grpo"]:
    raise SystemExit(_main(sys.argv[2:]))
