"""Device check: the training paths a GPU run depends on, each PASS / FAIL / SKIP with a reason.

Every path runs on a tiny random model (``grpo_train.models.loading.build_tiny_model``, no
network) in a subprocess of its own with a timeout, and checks a result, not only that the code ran:

* ``bf16-full-ft``: bfloat16 full fine-tuning as the trainer sets it up (weights in
  ``setup.run.parameter_dtype``, forward under ``setup.run.training_autocast``): 5 AdamW steps at
  lr 1e-6 change more than half of every weight matrix's entries.
* ``logprob-heads``: ``chunked_logprobs`` and ``fused_logprobs`` under bf16 autocast equal
  ``plain_logprobs`` (values and gradients of the hidden states, within 2e-2).
* ``lora-gc-kl``: one ``grpo_update`` with peft LoRA, gradient checkpointing and beta = 0.1:
  finite metrics, every ``lora_B`` moved, no base weight moved.
* ``qlora-export``: a 4-bit base (needs bitsandbytes and CUDA) with LoRA, saved with
  ``lora.save_merged``: the saved names are exactly the base checkpoint's.
* ``liger-head``: the update's loss and gradients with ``logprob_head: liger`` (needs
  liger_kernel) equal those with the fused head.
* ``vllm-sync``: ``VLLMEngine`` (needs vllm) after ``sync_weights`` of moved weights samples
  with logprobs equal to the trainer's recomputation (within 5e-2).
* ``checkpoint-resume``: ``checkpoint.save_checkpoint`` then ``load_checkpoint``: the weights
  and the AdamW state come back equal.
* ``long-completion``: one update on a 2,000-token completion; its peak memory
  (``torch.cuda.max_memory_allocated``, or the growth of ``ru_maxrss`` on CPU) is reported.
* ``fsdp2-save-resume``: FSDP2 on one rank (``torch.distributed`` over nccl on CUDA, gloo on
  CPU, a free port), set up as the trainer does under ``accelerate launch --config_file
  examples/accelerate/fsdp.yaml`` (``setup.run``'s process start, policy, optimizer,
  ``accelerator.prepare`` and learner); one update, ``checkpoint.save_checkpoint`` (the
  optimizer through ``save_state``), a fresh policy and optimizer, ``load_checkpoint``: the
  weights and the AdamW state equal the trained ones, and the checkpoint's HF weights and
  ``weight_export.export_state_dict`` equal the gathered shards. (accelerate makes a CPU process
  FSDP only when told, as ``tests/grpo_train/parallel/test_fsdp.py`` does; on CUDA it is as
  launched.)
* ``multi-process``: two ranks (their own processes) run the trainer's update (``grpo_update``,
  ``ClipAndStep``) under DDP on one group each: nccl with a GPU per rank where there are two
  GPUs, else gloo (on the one GPU, or the CPU; NCCL cannot put two ranks on one GPU). The ranks
  end with equal weights, the weights moved, and the all-reduced gradients equal those of one
  process on the whole batch.
* ``train-cli``: the real ``grpo`` commands with the HF engine: ``grpo train`` for 2 steps with
  ``--dtype auto`` and a checkpoint, ``--resume latest`` for step 3, then ``grpo eval`` on that
  checkpoint: each exits 0; metrics rows for steps 1-3, step 3's checkpoint descends from step
  2's; ``auto`` resolved for the device (bf16 on a GPU) with float32 master weights saved, and
  the weights moved if some step had a reward signal (the environment, registered by this
  script, rewards a completion that starts with a digit); the eval summary has a score. On CUDA
  it is the whole loop on a GPU: device placement, autocast, master weights.

* ``hf-out-of-memory``: the ``hf`` engine under a forward hook that allocates an eighth of the
  device's memory per sequence (on CUDA from the real allocator; on a CPU, whose allocator
  raises no ``OutOfMemoryError``, the hook raises torch's error itself when the rows would not
  fit): 16 sequences come back from chunks halved to 4 with the engine still usable (its CUDA
  context survived the failure); then a single sequence that does not fit gives ``grpo
  train``'s one line (``run.memory_advice``), which keeps torch's failed allocation and
  drops its accounting and allocator advice (on CUDA the real message's format).

A missing optional package or device feature gives SKIP; an exception, a crash or a timeout of a
path's subprocess gives FAIL with the last lines of its stderr. The exit status is 1 when any path
failed. This file's top level imports only the standard library, so it starts anywhere; each path
imports what it needs inside its own subprocess.

On a lent GPU machine (one run, well under 6 minutes; each path has ``--timeout`` seconds;
on a 2-core CPU the whole check takes about 2 minutes):

    PYTHONPATH=$PWD python benchmarks/gpu_check.py --device auto --timeout 120
    PYTHONPATH=$PWD python benchmarks/gpu_check.py --paths logprob-heads,lora-gc-kl

A machine with only torch, transformers, peft and accelerate needs one wheel besides them:
grpo-kit's own (``pip wheel --no-deps . -w wheels``: 0.6 MB), installed with ``pip install
--no-deps --no-index wheels/*.whl``. numpy, pyyaml, safetensors, tokenizers and tqdm
come with transformers, sympy and psutil with torch and accelerate; the paths need none of
grpo-kit's other dependencies: not datasets (with pyarrow, 55 MB, and pandas, 12 MB; the
train-cli environment hands ``grpo train`` and ``grpo eval`` its rows as a list where datasets
is missing), latex2sympy2_extended, pyseccomp, gguf, tensorboard or matplotlib
(``tests/benchmarks/test_gpu_check.py`` runs the fsdp2-save-resume, multi-process and
train-cli paths with all of these and vllm unimportable). The optional paths want
liger-kernel (0.9 MB wheel, pure Python; its Triton comes with CUDA torch), bitsandbytes and
vllm, which are large compiled wheels: without them those paths SKIP. Measured in a fresh venv
of torch 2.13, transformers 5.19, peft 0.21, accelerate 1.16: every other path of the first
eight passes with the 0.6 MB wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULT = "GPU_CHECK_RESULT"
PATHS = (
    "bf16-full-ft",
    "logprob-heads",
    "lora-gc-kl",
    "qlora-export",
    "liger-head",
    "vllm-sync",
    "checkpoint-resume",
    "long-completion",
    "fsdp2-save-resume",
    "multi-process",
    "train-cli",
    "hf-out-of-memory",
)


class Skip(Exception):
    """A path cannot run here (a package or a device feature is missing)."""


@dataclass(frozen=True)
class Outcome:
    """One path's verdict as the parent prints it."""

    path: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    seconds: float


# ------------------------------------------------------------------------------------- helpers
# (run inside a path's subprocess only)


def _need(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise Skip(f"{module} is not installed")


def _load(model_dir: Path, device: str, dtype: str = "float32") -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    return model.to(device).train()


def _batch(prompts: list[list[int]], completions: list[list[int]]) -> Any:
    """A rollout batch of ``len(prompts)`` groups of ``len(completions) / len(prompts)``."""
    import torch

    from grpo_train.collect.batch import RolloutBatch

    p, g = len(prompts), len(completions) // len(prompts)
    return RolloutBatch(
        prompt_ids=tuple(tuple(x) for x in prompts),
        completion_ids=tuple(tuple(c) for c in completions),
        loss_mask=tuple(torch.ones(len(c), dtype=torch.bool) for c in completions),
        sampling_logprobs=tuple((0.0,) * len(c) for c in completions),
        rewards=torch.arange(p * g, dtype=torch.float64).view(p, g) % 2,
        scored=torch.ones(p, g, dtype=torch.bool),
        trainable=torch.ones(p, g, dtype=torch.bool),
        truncated=torch.zeros(p, g, dtype=torch.bool),
        env_index=torch.zeros(p, dtype=torch.long),
    )


def _small_rows(vocab: int) -> tuple[list[list[int]], list[list[int]], Any]:
    """Two prompts of two completions each (random ids, seed 0) and their advantages."""
    import torch

    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    prompts, completions = [ids(5), ids(4)], [ids(9), ids(6), ids(7), ids(8)]
    return prompts, completions, torch.tensor([[1.0, -1.0], [-0.5, 0.5]])


def _small_batch(vocab: int) -> tuple[Any, Any]:
    prompts, completions, advantages = _small_rows(vocab)
    return _batch(prompts, completions), advantages


def _stepper(optimizer: Any) -> Callable[[float], float]:
    def step(loss: float) -> float:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return 0.0

    return step


def _capture(model: Any, into: dict[str, Any]) -> Callable[[float], float]:
    def capture(loss: float) -> float:
        into["loss"] = loss
        into["grads"] = {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }
        model.zero_grad(set_to_none=True)
        return 0.0

    return capture


# --------------------------------------------------------------------------------------- paths


def check_bf16_full_ft(model_dir: Path, device: str) -> str:

    from grpo_train.config import TrainConfig
    from grpo_train.learner.update import Learner, grpo_update
    from grpo_train.setup.run import build_optimizer, parameter_dtype, training_autocast
    from grpo_train.setup.settings import update_settings

    cfg = TrainConfig.from_flat({"dtype": "bfloat16", "learning_rate": 1e-6, "beta": 0.0})
    model = _load(model_dir, device, parameter_dtype(cfg.policy))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.ndim == 2}
    optimizer, _ = build_optimizer(cfg, model)
    learner = Learner(
        model, pad_id=0, device=device, autocast=lambda: training_autocast(cfg.policy, device)
    )
    batch, advantages = _small_batch(model.config.vocab_size)
    for _ in range(5):
        grpo_update(learner, _stepper(optimizer), batch, advantages, update_settings(cfg))
    moved = {
        n: (p.detach() != before[n]).float().mean().item()
        for n, p in model.named_parameters()
        if n in before
    }
    worst = min(moved, key=moved.__getitem__)
    assert moved[worst] > 0.5, f"{worst}: only {moved[worst]:.1%} of its entries changed"
    dtype = next(model.parameters()).dtype
    share = f"{moved[worst]:.1%}"
    return f"master weights {dtype} under bf16 autocast; least-moved matrix {worst}: {share}"


def check_logprob_heads(model_dir: Path, device: str) -> str:
    import torch

    from grpo_train.learner.logprobs import chunked_logprobs, fused_logprobs, plain_logprobs

    model = _load(model_dir, device)
    head = model.get_output_embeddings()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 33, model.config.hidden_size, generator=gen).to(device)
    ids = torch.randint(0, vocab, (2, 33), generator=gen).to(device)
    results = {}
    for name in ("plain", "chunked", "fused"):
        h = hidden.clone().requires_grad_(True)
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            if name == "plain":
                lp, _ = plain_logprobs(head(h), ids, 1.0, False)
            elif name == "chunked":
                lp, _ = chunked_logprobs(head(h), ids, 1.0, False, chunk=7)
            else:
                lp, _ = fused_logprobs(head, h, ids, 1.0, False, vocab=vocab, chunk=7)
        lp.float().sum().backward()
        results[name] = (lp.detach().float(), h.grad.float())
    worst = 0.0
    for name in ("chunked", "fused"):
        for got, want in zip(results[name], results["plain"], strict=True):
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2, msg=f"{name} vs plain")
            worst = max(worst, (got - want).abs().max().item())
    return f"chunked and fused equal plain under bf16 autocast (max diff {worst:.1e}, tol 2e-2)"


def check_lora_gc_kl(model_dir: Path, device: str) -> str:
    import math

    import torch

    from grpo_train.config import TrainConfig
    from grpo_train.learner.lora import LoraSettings, apply_lora
    from grpo_train.learner.memory import enable_gradient_checkpointing
    from grpo_train.learner.update import Learner, grpo_update
    from grpo_train.setup.run import KLReference
    from grpo_train.setup.settings import update_settings

    model = apply_lora(_load(model_dir, device), LoraSettings(lora_r=4, lora_alpha=8))
    enable_gradient_checkpointing(model)
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    reference = KLReference(model, None, device, 1.0, lora=True, offload=False, share_prompts=False)
    learner = Learner(model, pad_id=0, device=device, reference=reference)
    cfg = TrainConfig.from_flat({"beta": 0.1})
    batch, advantages = _small_batch(model.config.vocab_size)
    metrics = grpo_update(learner, _stepper(optimizer), batch, advantages, update_settings(cfg))
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    assert not bad, f"non-finite metrics {bad}"
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    lora_b = {n for n in before if "lora_B" in n}
    base_moved = {n for n in changed if "lora_" not in n}
    assert not base_moved, f"base weights moved: {sorted(base_moved)[:3]}"
    assert lora_b and lora_b <= changed, f"lora_B not moved: {sorted(lora_b - changed)[:3]}"
    loss = metrics.get("loss", float("nan"))
    return f"{len(changed)} LoRA tensors moved, base unchanged, loss {loss:.4f}"


def check_qlora_export(model_dir: Path, device: str) -> str:
    _need("bitsandbytes")
    import torch

    if not device.startswith("cuda"):
        raise Skip("4-bit NF4 needs CUDA")
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from grpo_train.learner.lora import (
        LoraSettings,
        apply_lora,
        load_quantized_base,
        qlora_compute_dtype,
        save_merged,
    )

    plain = _load(model_dir, "cpu")
    names = set(plain.state_dict()) - {"lm_head.weight"}  # tied: saved once, as the embedding
    index = torch.device(device).index or 0
    model = apply_lora(
        load_quantized_base(str(model_dir), qlora_compute_dtype("float32", device), index),
        LoraSettings(lora_r=4, lora_alpha=8, use_qlora=True),
    )
    with tempfile.TemporaryDirectory() as out:
        saved_dir = save_merged(model, AutoTokenizer.from_pretrained(model_dir), Path(out) / "m")
        saved = {k for f in Path(saved_dir).glob("*.safetensors") for k in load_file(f)}
    assert saved == names, f"extra {sorted(saved - names)[:3]}, missing {sorted(names - saved)[:3]}"
    return f"merged export has the base's {len(names)} names exactly"


def check_liger_head(model_dir: Path, device: str) -> str:
    _need("liger_kernel")
    import torch

    from grpo_train.config import TrainConfig
    from grpo_train.learner.logprobs import HeadChoice
    from grpo_train.learner.update import Learner, grpo_update
    from grpo_train.setup.settings import update_settings

    model = _load(model_dir, device)
    batch, advantages = _small_batch(model.config.vocab_size)
    runs: dict[str, dict[str, Any]] = {}
    for head in ("fused", "liger"):
        runs[head] = {}
        learner = Learner(model, pad_id=0, device=device, head=HeadChoice(head))  # type: ignore[arg-type]
        grpo_update(
            learner,
            _capture(model, runs[head]),
            batch,
            advantages,
            update_settings(TrainConfig.from_flat({"beta": 0.0})),
        )
    fused, liger = runs["fused"], runs["liger"]
    assert abs(fused["loss"] - liger["loss"]) < 1e-4, f"loss {liger['loss']} vs {fused['loss']}"
    for name, grad in fused["grads"].items():
        torch.testing.assert_close(liger["grads"][name], grad, rtol=1e-3, atol=1e-5, msg=name)
    return f"loss {liger['loss']:.5f} and {len(fused['grads'])} gradients equal the fused head's"


def check_vllm_sync(model_dir: Path, device: str) -> str:
    _need("vllm")
    import torch

    from grpo_train.learner.weight_export import export_state_dict
    from grpo_train.rollout.base import SamplingConfig
    from grpo_train.rollout.vllm_engine import VLLMEngine

    model = _load(model_dir, device)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine = VLLMEngine(model_dir, dtype="float32", seed=0, max_model_len=256)
    try:
        engine.sync_weights(export_state_dict(model))
        prompts = [[5, 6, 7, 8], [9, 10, 11]]
        groups = engine.generate(prompts, SamplingConfig(n=2, max_new_tokens=16, seed=0))
    finally:
        engine.close()
    worst = 0.0
    with torch.no_grad():
        for prompt, group in zip(prompts, groups, strict=True):
            for c in group:
                ids = torch.tensor([prompt + list(c.token_ids)], device=device)
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
                mine = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
                diff = (mine.cpu() - torch.tensor(c.logprobs)).abs().max().item()
                worst = max(worst, diff)
    assert worst < 5e-2, f"engine vs trainer logprobs differ by {worst:.3g} after the sync"
    return f"engine and trainer logprobs agree after a sync (max diff {worst:.1e}, tol 5e-2)"


def check_checkpoint_resume(model_dir: Path, device: str) -> str:
    import torch
    from transformers import AutoTokenizer

    from grpo_train.config import TrainConfig
    from grpo_train.learner.update import Learner, grpo_update
    from grpo_train.run.checkpoint import SamplerState, load_checkpoint, save_checkpoint
    from grpo_train.setup.run import build_optimizer
    from grpo_train.setup.settings import update_settings

    cfg = TrainConfig.from_flat({"learning_rate": 1e-3, "beta": 0.0})
    model = _load(model_dir, device)
    optimizer, scheduler = build_optimizer(cfg, model)
    batch, advantages = _small_batch(model.config.vocab_size)

    def step(loss: float) -> float:
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return 0.0

    grpo_update(
        Learner(model, pad_id=0, device=device),
        step,
        batch,
        advantages,
        update_settings(TrainConfig.from_flat({})),
    )
    with tempfile.TemporaryDirectory() as run_dir:
        path = save_checkpoint(
            run_dir,
            1,
            model=model,
            tokenizer=AutoTokenizer.from_pretrained(model_dir),
            optimizer=optimizer,
            scheduler=scheduler,
            sampler=SamplerState(4, (1, 0)),
            config_yaml=cfg.to_yaml(),
            keep_last=1,
        )
        restored = _load(path / "model", device)
        optimizer2, scheduler2 = build_optimizer(cfg, restored)
        state = load_checkpoint(path, optimizer=optimizer2, scheduler=scheduler2)
    assert state.step == 1, f"step {state.step}"
    weights = dict(model.named_parameters())
    for name, p in restored.named_parameters():
        assert torch.equal(p, weights[name]), f"weight {name} differs after reload"
    saved, loaded = optimizer.state_dict()["state"], optimizer2.state_dict()["state"]
    assert saved.keys() == loaded.keys() and saved, "optimizer state entries differ"
    for key, entry in saved.items():
        for field, value in entry.items():
            assert torch.equal(
                torch.as_tensor(loaded[key][field]).cpu(), torch.as_tensor(value).cpu()
            ), f"optimizer state {key}.{field} differs"
    return f"{len(weights)} weights and {len(saved)} AdamW states equal after reload"


def check_long_completion(model_dir: Path, device: str) -> str:
    import math
    import resource

    import torch

    from grpo_train.config import TrainConfig
    from grpo_train.learner.update import Learner, grpo_update
    from grpo_train.setup.settings import update_settings

    model = _load(model_dir, device)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    completion = torch.randint(3, vocab, (2000,), generator=gen).tolist()
    batch = _batch([[5, 6, 7, 8]], [completion, completion[:1000]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    metrics = grpo_update(
        Learner(model, pad_id=0, device=device),
        _stepper(optimizer),
        batch,
        torch.tensor([[1.0, -1.0]]),
        update_settings(TrainConfig.from_flat({"beta": 0.0, "max_completion_length": 2000})),
    )
    if cuda:
        peak_mib = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        what = "peak CUDA memory above the model"
    else:
        peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
        what = "ru_maxrss growth"
    assert all(math.isfinite(v) for v in metrics.values()), f"non-finite metrics {metrics}"
    assert math.isfinite(peak_mib), "peak memory is not finite"
    return f"2000-token completion: {what} {peak_mib:.0f} MiB"


# ------------------------------------------------------------------ launched and CLI paths


def _one_rank_fsdp_env(device: str) -> dict[str, str]:
    """What ``accelerate launch --config_file examples/accelerate/fsdp.yaml`` gives one rank.

    torchrun's rendezvous variables (rank 0 of 1, a free port) and the shipped config's FSDP
    settings (its ``fsdp_config`` keys upper-cased, as accelerate's launcher passes them); the
    config's bf16 mixed precision on CUDA, none on CPU.
    """
    import yaml

    from grpo_train.rollout.weight_channel import free_port

    config = yaml.safe_load((REPO / "examples" / "accelerate" / "fsdp.yaml").read_text())
    cpu = not device.startswith("cuda")
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_SYNC_MODULE_STATES": "true",
        "ACCELERATE_MIXED_PRECISION": "no" if cpu else str(config["mixed_precision"]),
    }
    for key, value in config["fsdp_config"].items():
        env[key.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    if cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def _force_fsdp_on_cpu() -> None:
    """Make accelerate's state FSDP on a CPU rank (on CUDA it is FSDP by itself).

    With ``ACCELERATE_USE_CPU`` accelerate keeps ``MULTI_CPU`` and drops the FSDP plugin (it
    promotes only accelerator device types to FSDP), while torch's FSDP2 runs on CPU over gloo.
    The trainer's ``Accelerator`` then finds this state; everything after is accelerate's own
    FSDP2 code (``prepare``, ``clip_grad_norm_``, ``save_state``, ``load_state``).
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    Accelerator()  # starts the process group and the shared state, as MULTI_CPU
    state = AcceleratorState()
    state.fsdp_plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* variables
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def _full(value: Any) -> Any:
    """A tensor's whole value on the CPU (an FSDP2 shard, a ``DTensor``, gathered)."""
    import torch
    from torch.distributed.tensor import DTensor

    whole = value.full_tensor() if isinstance(value, DTensor) else torch.as_tensor(value)
    return whole.detach().cpu().clone()


def _fsdp_policy(cfg: Any, model_dir: Path) -> tuple[Any, Any, Any, Any]:
    """The trainer's setup of a full fine-tuning policy under a launcher: accelerate's process
    (``setup.run._start_process``), the policy (``load_run_policy``), AdamW and its schedule
    (``build_optimizer``), then ``accelerator.prepare``; returns the accelerator, the unwrapped
    and the prepared model, and (optimizer, scheduler, tokenizer)."""
    from grpo_train.setup.run import _start_process, build_optimizer, load_run_policy

    accelerator, distributed, _, device = _start_process(cfg)
    assert distributed, "accelerate did not start a launched (FSDP) process"
    model, tokenizer, _, _ = load_run_policy(cfg, None, device, str(model_dir), None, None)
    optimizer, scheduler = build_optimizer(cfg, model)
    wrapped, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, wrapped, (optimizer, scheduler, tokenizer)


def check_fsdp2_save_resume(model_dir: Path, device: str) -> str:
    import torch
    from safetensors.torch import load_file

    from grpo_train.config import TrainConfig
    from grpo_train.learner.update import ClipAndStep, grpo_update
    from grpo_train.learner.weight_export import export_state_dict, full_state_dict, is_sharded
    from grpo_train.run.checkpoint import SamplerState, load_checkpoint, save_checkpoint
    from grpo_train.setup.run import _learner, resolve_auto
    from grpo_train.setup.settings import update_settings

    if not torch.distributed.is_available():
        raise Skip("torch.distributed is not available")
    os.environ.update(_one_rank_fsdp_env(device))
    if not device.startswith("cuda"):
        _force_fsdp_on_cpu()
    with tempfile.TemporaryDirectory() as tmp:
        flat = {"model": str(model_dir), "learning_rate": 1e-3, "beta": 0.0, "dtype": "auto"}
        cfg = resolve_auto(TrainConfig.from_flat({**flat, "output_dir": f"{tmp}/run"}))
        accelerator, model, wrapped, (optimizer, scheduler, tokenizer) = _fsdp_policy(
            cfg, model_dir
        )
        assert accelerator.distributed_type.name == "FSDP", accelerator.distributed_type
        assert accelerator.is_fsdp2 and is_sharded(wrapped), "the policy is not FSDP2-sharded"
        learner = _learner(cfg, wrapped, None, tokenizer, str(accelerator.device), None,
                           accelerator, True)  # fmt: skip
        step = ClipAndStep(wrapped, optimizer, scheduler, cfg.optim.max_grad_norm,
                           cfg.run.max_bad_steps, accelerator.clip_grad_norm_)  # fmt: skip
        batch, advantages = _small_batch(model.config.vocab_size)
        grpo_update(learner, step, batch, advantages, update_settings(cfg))
        trained = {n: _full(p) for n, p in model.named_parameters()}
        initial = load_file(model_dir / "model.safetensors")
        moved = max((trained[n] - initial[n]).abs().max().item() for n in initial)
        assert moved > 1e-5, f"no weight moved in the update (max change {moved:.1e})"
        path = save_checkpoint(
            f"{tmp}/run", 1, model=model, tokenizer=tokenizer, optimizer=optimizer,
            scheduler=scheduler, sampler=SamplerState(4, (1,)), config_yaml=cfg.to_yaml(),
            keep_last=1, state_dict=full_state_dict(wrapped, rank0_only=True),
            accelerator=accelerator,
        )  # fmt: skip
        assert (path / "accelerate").is_dir(), "the sharded state did not go through save_state"
        saved = load_file(path / "model" / "model.safetensors")
        exported = export_state_dict(wrapped)
        odd = sorted(set(saved) ^ set(initial))
        assert not odd, f"saved names differ from the base checkpoint's: {odd[:3]}"
        for name, tensor in saved.items():
            assert torch.equal(tensor, trained[name]), f"saved {name} is not the trained weight"
            assert torch.equal(exported[name].cpu(), trained[name]), f"exported {name} differs"
        # A fresh start (new process state aside): new accelerator, policy and optimizer.
        cfg2 = resolve_auto(TrainConfig.from_flat({**flat, "output_dir": f"{tmp}/fresh"}))
        accelerator2, model2, _, (optimizer2, scheduler2, _) = _fsdp_policy(cfg2, model_dir)
        state = load_checkpoint(
            path, optimizer=optimizer2, scheduler=scheduler2, accelerator=accelerator2
        )
    assert state.step == 1, f"step {state.step}"
    for name, p in model2.named_parameters():
        assert torch.equal(_full(p), trained[name]), f"weight {name} differs after load_state"
    before, after = optimizer.state_dict()["state"], optimizer2.state_dict()["state"]
    assert before.keys() == after.keys() and before, "optimizer state entries differ"
    for key, entry in before.items():
        for field, value in entry.items():
            assert torch.equal(_full(after[key][field]), _full(value)), f"{key}.{field} differs"
    mixed = os.environ["ACCELERATE_MIXED_PRECISION"]
    backend = torch.distributed.get_backend()
    torch.distributed.destroy_process_group()
    return (
        f"FSDP2 (1 rank, {backend}, mixed precision {mixed}): "
        f"{len(trained)} weights and {len(before)} AdamW states equal after load_state; "
        f"saved and exported weights equal the gathered shards"
    )


#: Ranks of the multi-process path; rank r trains group r of ``_small_rows``.
RANKS = 2


def _update_once(wrapped: Any, model: Any, device: str, rows: tuple[Any, Any, Any]) -> Any:
    """One trainer update (``grpo_update``, ``ClipAndStep``, AdamW from ``build_optimizer``) of
    ``wrapped`` (``model`` or its DDP wrapper) on ``rows``; returns the gradients the step saw,
    the weights after it and the metrics."""
    from grpo_train.config import TrainConfig
    from grpo_train.learner.update import ClipAndStep, Learner, grpo_update
    from grpo_train.setup.run import build_optimizer
    from grpo_train.setup.settings import update_settings

    cfg = TrainConfig.from_flat({"learning_rate": 1e-3, "beta": 0.0})
    optimizer, scheduler = build_optimizer(cfg, model)
    grads: dict[str, Any] = {}

    def clip(params: Any, max_norm: float) -> Any:
        import torch

        for name, p in model.named_parameters():
            if p.grad is not None:
                grads[name] = p.grad.detach().cpu().clone()
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    step = ClipAndStep(wrapped, optimizer, scheduler, cfg.optim.max_grad_norm,
                       cfg.run.max_bad_steps, clip)  # fmt: skip
    prompts, completions, advantages = rows
    learner = Learner(wrapped, pad_id=0, device=device)
    batch = _batch(prompts, completions)
    metrics = grpo_update(learner, step, batch, advantages, update_settings(cfg))
    weights = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    return {"grads": grads, "weights": weights, "metrics": metrics}


def _ddp_rank(rank: int, port: int, backend: str, device: str, model_dir: Path, out: Path) -> int:
    """One rank of the multi-process path: DDP over ``backend``, its own group, one update."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from grpo_train.parallel.distributed import max_rank_difference

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=RANKS, timeout=timedelta(seconds=60))
    try:
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(device)
        model = _load(model_dir, device)
        ddp = DistributedDataParallel(model, device_ids=[torch.device(device)] if cuda else None)
        prompts, completions, advantages = _small_rows(model.config.vocab_size)
        size = len(completions) // len(prompts)  # a group's completions
        own = completions[rank * size : (rank + 1) * size]
        group = ([prompts[rank]], own, advantages[rank : rank + 1])
        result = _update_once(ddp, model, device, group)
        result["rank_difference"] = max_rank_difference(ddp)
        torch.save(result, out)
    finally:
        dist.destroy_process_group()
    return 0


def check_multi_process(model_dir: Path, device: str) -> str:
    import torch

    from grpo_train.rollout.weight_channel import free_port

    if not torch.distributed.is_available():
        raise Skip("torch.distributed is not available")
    cuda = device.startswith("cuda")
    # NCCL needs a GPU of its own per rank; on one GPU both ranks share it over gloo.
    backend = "nccl" if cuda and torch.cuda.device_count() >= RANKS else "gloo"
    if backend == "nccl":
        devices = [f"cuda:{r}" for r in range(RANKS)]
    else:  # a CUDA device needs its index (torch.cuda.set_device)
        devices = [f"cuda:{torch.device(device).index or 0}" if cuda else device] * RANKS
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"rank{r}.pt" for r in range(RANKS)]
        ranks = []
        for r in range(RANKS):
            command = [
                sys.executable, __file__, "--ddp-rank", str(r), "--ddp-port", str(port),
                "--ddp-backend", backend, "--device", devices[r], "--model-dir", str(model_dir),
                "--ddp-out", str(outs[r]),
            ]  # fmt: skip
            pipe = subprocess.PIPE
            ranks.append(
                subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, env=env, cwd=REPO)
            )
        try:
            ended = [rank.communicate(timeout=90) for rank in ranks]
        finally:
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
                    rank.communicate()
        for r, (rank, (_, err)) in enumerate(zip(ranks, ended, strict=True)):
            assert rank.returncode == 0, f"rank {r} exited {rank.returncode}: {_tail(err, 3)}"
        results = [torch.load(out, weights_only=False) for out in outs]
    model = _load(model_dir, device)
    initial = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    alone = _update_once(model, model, device, _small_rows(model.config.vocab_size))
    first, second = results
    for name, value in first["weights"].items():
        assert torch.equal(value, second["weights"][name]), f"ranks differ in {name}"
    assert first["rank_difference"] == 0.0, f"max_rank_difference {first['rank_difference']}"
    moved = max((first["weights"][n] - initial[n]).abs().max().item() for n in initial)
    assert moved > 1e-5, f"no weight moved (max change {moved:.1e})"
    assert alone["grads"] and alone["grads"].keys() == first["grads"].keys(), "gradients missing"
    worst = 0.0
    for name, grad in alone["grads"].items():
        got = first["grads"][name]
        torch.testing.assert_close(got, grad, rtol=1e-3, atol=1e-6, msg=f"gradient of {name}")
        worst = max(worst, (got - grad).abs().max().item())
    where = "cuda:0 and cuda:1" if backend == "nccl" else devices[0]
    note = "" if backend == "nccl" or not cuda else " (one GPU: NCCL needs a GPU per rank)"
    return (
        f"{RANKS} {backend} ranks on {where}{note}: equal weights after a DDP update "
        f"(max change {moved:.1e}); the all-reduced gradients equal one process's on the "
        f"whole batch (max diff {worst:.1e})"
    )


#: The train-cli path's environment: reward 1 when the completion starts with a digit, which a
#: random tiny model does now and then (about 5% of its tokens), so some steps move the weights.
DIGIT_ENV = "check/digit-v0"


class _Rows(list):  # type: ignore[type-arg]
    """The digit environment's rows where the datasets package is missing: what ``grpo train``
    and ``grpo eval`` read of a ``datasets.Dataset`` (length, rows by index and in order,
    ``select``), so that train-cli runs on a machine with torch, transformers, peft and
    accelerate only."""

    def select(self, indices: Any) -> _Rows:
        return _Rows(self[i] for i in indices)


def _digit_env() -> Any:
    import importlib.util

    from grpo_envs.base import Environment
    from grpo_envs.types import Component, Outcome, Sample, Score

    class DigitEnv(Environment):
        score_workers = 0  # scored in-process: the scorer is a character test

        def dataset(self, split: str = "train") -> Any:
            offset, n = (0, 64) if split == "train" else (10_000, 16)
            rows = [
                Sample(id=f"{split}-{i}", prompt=(), answer="7", env_id=DIGIT_ENV).to_row()
                | {"prompt": [{"role": "user", "content": f"Question {offset + i}: a digit?"}]}
                for i in range(n)
            ]
            if importlib.util.find_spec("datasets") is None:
                return _Rows(rows)
            import datasets

            return datasets.Dataset.from_list(rows)

        def score(self, completion: str, sample: Any) -> Any:
            text = completion.lstrip()
            ok = bool(text) and text[0].isdigit()
            return Score(
                reward=float(ok),
                outcome=Outcome.CORRECT if ok else Outcome.WRONG,
                components=(Component("digit", float(ok)),),
            )

    return DigitEnv()


def _grpo(argv: list[str]) -> int:
    """The ``grpo`` command (``grpo_train.cli.main``) with ``DIGIT_ENV`` registered."""
    import grpo_envs
    from grpo_train.cli import main

    grpo_envs.register(DIGIT_ENV, _digit_env)
    return main(argv)


def check_train_cli(model_dir: Path, device: str) -> str:
    import importlib.util
    import math

    import yaml
    from safetensors.torch import load_file

    from grpo_train.models.loading import auto_dtype
    from grpo_train.run.checkpoint import read_manifest
    from grpo_train.run.run_log import read_metrics

    cuda = device.startswith("cuda")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CLI takes a GPU wherever it sees one

    def grpo(*args: str) -> str:
        command = [sys.executable, __file__, "--grpo", *args]
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=REPO, timeout=100
        )
        code, last_lines = done.returncode, _tail(done.stderr, 4)
        assert code == 0, f"grpo {args[0]} exited {code}: {last_lines}"
        return done.stdout

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        train = [
            "train", "--model", str(model_dir), "--env", DIGIT_ENV, "--engine", "hf",
            "--dtype", "auto", "--save_every", "2", "--num_generations", "4",
            "--prompts_per_step", "4", "--max_completion_length", "6", "--eval_size", "2",
            "--learning_rate", "5e-3", "--seed", "11", "--progress", "false",
            "--output_dir", str(run),
        ]  # fmt: skip
        grpo(*train, "--max_steps", "2")
        first = [r["step"] for r in read_metrics(run)]
        grpo(*train, "--max_steps", "3", "--resume", "latest")
        rows = read_metrics(run)
        last = run / "checkpoints" / "step-000003"
        manifest = read_manifest(last)
        config = yaml.safe_load((run / "config.yaml").read_text())
        weights = load_file(last / "model" / "model.safetensors")
        evaluate = [
            "eval", "--model", str(last / "model"), "--suite", DIGIT_ENV, "--engine", "hf",
            "--limit", "4", "--max_tokens", "6", "--out", f"{tmp}/eval", "--no_progress",
        ]  # fmt: skip
        grpo(*evaluate)
        summary = json.loads((Path(tmp) / "eval" / "summary.json").read_text())
    trained = [r for r in rows if "loss" in r]
    assert first == [0, 1, 2], f"first run's metrics steps {first}"
    assert [r["step"] for r in trained] == [1, 2, 3], f"steps {[r['step'] for r in rows]}"
    assert manifest is not None and manifest.parent == "step-000002", "step 3 is not step 2's"
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in trained)
    dtype = auto_dtype("cuda" if cuda else "cpu")
    resolved = config["policy"]["dtype"]
    assert resolved == dtype, f"--dtype auto resolved to {resolved}, not {dtype}"
    kinds = {str(t.dtype) for t in weights.values()}
    assert kinds == {"torch.float32"}, f"checkpoint weights are {kinds}, not float32 masters"
    initial = load_file(model_dir / "model.safetensors")
    moved = max((weights[n] - initial[n]).abs().max().item() for n in initial)
    signal = any(r["group/frac_zero_std"] < 1 for r in trained)
    assert (moved > 0) if signal else (moved == 0), f"signal {signal}, max weight change {moved}"
    score = summary["overall"]["micro_avg"]
    without = importlib.util.find_spec("datasets") is None
    rows_note = " (prompt rows as a list: datasets is not installed)" if without else ""
    assert 0 <= score <= 1 and summary["num_generated"] == 4, f"eval summary {summary['overall']}"
    return (
        f"train 2 steps, resume at step 3, eval: exit 0 each; dtype auto -> {dtype} with float32 "
        f"master weights (max change {moved:.1e}, {'with' if signal else 'no'} reward signal); "
        f"eval score {score:.2f} on 4 prompts{rows_note}"
    )


def check_hf_out_of_memory(model_dir: Path, device: str) -> str:
    import torch
    from transformers import AutoTokenizer

    from grpo_train.config import TrainConfig
    from grpo_train.rollout.base import SamplingConfig
    from grpo_train.rollout.hf import HFEngine
    from grpo_train.run.memory_advice import out_of_memory_line
    from grpo_train.setup.settings import memory_settings

    model = _load(model_dir, device).eval()
    engine = HFEngine(model, AutoTokenizer.from_pretrained(model_dir), max_batch_size=16)
    cuda = device.startswith("cuda")
    capacity = torch.cuda.get_device_properties(device).total_memory if cuda else 64 << 30
    share = {"per_row": capacity // 8}  # 8 rows: the whole device; 4 rows: half of it

    def allocate_per_row(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        size = int(kwargs["input_ids"].shape[0]) * share["per_row"]
        if cuda:
            torch.empty(size, dtype=torch.uint8, device=device)  # the allocator decides; freed
        elif size >= capacity:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {size / 2**30:.2f} GiB. GPU 0 has a total "
                f"capacity of {capacity / 2**30:.2f} GiB of which 1.00 GiB is free. Including "
                "non-PyTorch memory, this process has 63.00 GiB memory in use. If reserved but "
                "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_"
                "segments:True to avoid fragmentation."
            )

    handle = model.register_forward_pre_hook(allocate_per_row, with_kwargs=True)
    sampling = SamplingConfig(n=16, max_new_tokens=4, temperature=1.0, seed=0)
    try:
        groups = engine.generate([[5, 6, 7, 8]], sampling)
        assert [len(g) for g in groups] == [16], f"groups of {[len(g) for g in groups]}"
        assert engine.max_batch_size == 4, f"halved to {engine.max_batch_size}, not 16 -> 8 -> 4"
        halved_to = engine.max_batch_size
        share["per_row"] = 2 * capacity  # now one sequence cannot fit
        try:
            engine.generate([[5, 6, 7, 8]], SamplingConfig(n=1, max_new_tokens=4))
        except torch.OutOfMemoryError as err:
            settings = memory_settings(TrainConfig.from_flat({"engine": "hf"}))
            line = out_of_memory_line(err, settings)
        else:
            raise AssertionError("a sequence larger than the device was decoded")
    finally:
        handle.remove()
    assert line.startswith("out of GPU memory during generation (hf engine: out of memory "), line
    assert "Tried to allocate" in line and "max_completion_length" in line, line
    for dropped in ("Including non-PyTorch", "PYTORCH_CUDA_ALLOC_CONF"):
        assert dropped not in line, f"torch's {dropped!r} left in: {line}"
    where = "the CUDA allocator" if cuda else "a stand-in allocator (CPU)"
    return f"16 sequences in chunks halved 16 -> {halved_to} by {where}; one line: {line[:160]}"


CHECKS: dict[str, Callable[[Path, str], str]] = {
    "bf16-full-ft": check_bf16_full_ft,
    "logprob-heads": check_logprob_heads,
    "lora-gc-kl": check_lora_gc_kl,
    "qlora-export": check_qlora_export,
    "liger-head": check_liger_head,
    "vllm-sync": check_vllm_sync,
    "checkpoint-resume": check_checkpoint_resume,
    "long-completion": check_long_completion,
    "fsdp2-save-resume": check_fsdp2_save_resume,
    "multi-process": check_multi_process,
    "train-cli": check_train_cli,
    "hf-out-of-memory": check_hf_out_of_memory,
}


# -------------------------------------------------------------------------------- child process


def _child(path: str, device: str, model_dir: Path, fail: bool) -> int:
    """Run one path; print its verdict as the last stdout line; exit 1 on FAIL."""
    import traceback

    try:
        if fail:
            raise AssertionError("failure forced by --fail-path")
        status, detail = "PASS", CHECKS[path](model_dir, device)
    except Skip as skip:
        status, detail = "SKIP", str(skip)
    except Exception as error:  # any error is this path's FAIL, reported with its message
        traceback.print_exc()
        status, detail = "FAIL", f"{type(error).__name__}: {error}".splitlines()[0][:300]
    print(f"{RESULT} {status} {detail}", flush=True)
    return 1 if status == "FAIL" else 0


def _build_child(model_dir: Path, device: str) -> int:
    from grpo_train.models.loading import build_tiny_model

    build_tiny_model(model_dir)
    resolved = device
    if device == "auto":
        import torch

        resolved = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{RESULT} {resolved}", flush=True)
    return 0


# -------------------------------------------------------------------------------- parent process


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _spawn(args: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run this script with ``args``; return (exit status or None on timeout, stdout, stderr).

    The child leads a process group of its own, ended whole on a timeout (or an interrupt):
    a path's ranks and CLI commands go with it.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    child = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except BaseException as stopped:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        if isinstance(stopped, subprocess.TimeoutExpired):
            return None, out, err
        raise
    return child.returncode, out, err


def _verdict(path: str, code: int | None, out: str, err: str, timeout: float) -> tuple[str, str]:
    results = [line for line in out.splitlines() if line.startswith(RESULT + " ")]
    if code is None:
        return "FAIL", f"timed out after {timeout:.0f} s: {_tail(err)}"
    if not results:
        return "FAIL", f"crashed (exit {code}): {_tail(err)}"
    status, _, detail = results[-1][len(RESULT) + 1 :].partition(" ")
    if status == "FAIL":
        return "FAIL", f"{detail} | {_tail(err, 3)}"
    return status, detail


def run_all(paths: list[str], device: str, timeout: float, fail_path: str | None) -> list[Outcome]:
    """Build the tiny model, then run each path in its own subprocess; return the verdicts."""
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        code, out, err = _spawn(["--build", str(model_dir), "--device", device], timeout)
        built = [line for line in out.splitlines() if line.startswith(RESULT + " ")]
        if code != 0 or not built:
            reason = f"tiny model build failed (exit {code}): {_tail(err)}"
            return [Outcome(p, "FAIL", reason, 0.0) for p in paths]
        device = built[-1].split(" ", 1)[1]
        print(f"device: {device}", flush=True)
        for path in paths:
            args = ["--path", path, "--device", device, "--model-dir", str(model_dir)]
            if path == fail_path:
                args.append("--fail-path")
            start = time.perf_counter()
            code, out, err = _spawn(args, timeout)
            status, detail = _verdict(path, code, out, err, timeout)
            outcome = Outcome(path, status, detail, time.perf_counter() - start)
            print(f"{status:<4}  {path:<18}  {detail}  ({outcome.seconds:.1f} s)", flush=True)
            outcomes.append(outcome)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    """Command line: run the paths (parent) or one path (child, ``--path``)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--grpo"]:  # the train-cli path's commands
        return _grpo(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cpu")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated paths to run")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per path")
    parser.add_argument(
        "--fail-path", nargs="?", const="", default=None, help="make this path fail (self-test)"
    )
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ddp-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ddp-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ddp-backend", help=argparse.SUPPRESS)
    parser.add_argument("--ddp-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ddp_rank is not None:
        return _ddp_rank(
            args.ddp_rank, args.ddp_port, args.ddp_backend, args.device, args.model_dir,
            args.ddp_out,
        )  # fmt: skip
    if args.build is not None:
        return _build_child(args.build, args.device)
    if args.path is not None:
        return _child(args.path, args.device, args.model_dir, args.fail_path is not None)
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown or not paths:
        wrong = f"unknown paths {unknown}" if unknown else "--paths names no path"
        parser.error(f"{wrong}; choose from {', '.join(PATHS)}")
    outcomes = run_all(paths, args.device, args.timeout, args.fail_path)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("PASS", "FAIL", "SKIP")}
    print(f"summary: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
