"""Benchmark: a LoRA policy pushed into vLLM as merged weights, or served as a LoRA adapter.

grpo-kit syncs a LoRA policy into its vLLM engine as merged weights (``W + scale * B @ A``,
``VLLMEngine.sync_weights``). vLLM can also serve the adapter itself (``LLM(enable_lora=True)``
plus a ``LoRARequest`` per generate call): the sync is then writing a few-MB adapter and
``add_lora``, but every forward pays the extra ``x @ A @ B`` of the punica kernels. This script
measures both on the same model, adapter and prompts, one engine after the other in this process:

    python benchmarks/lora_sync_bench.py                     # tiny model (built in a temp dir)
    python benchmarks/lora_sync_bench.py --model path/to/hf-folder --lora-r 16 --syncs 5

Per variant: engine start-up, the median per-step sync time over ``--syncs`` syncs (each after a
simulated update of the adapter), the median generation throughput (``--prompts`` x ``--n``
completions of ``--tokens`` tokens, EOS ignored), and the largest gap between the engine's
sampling logprobs and the trainer's (peft model, ``grpo_train.learner.forward.token_logprobs``)
on the sampled tokens, largest and mean: the numbers that say whether the engine samples from
the policy being trained (both variants should show the same engine-vs-trainer noise).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class Row:
    """One variant's measurements."""

    variant: str
    startup_s: float = 0.0
    sync_s: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    max_logprob_gap: float = float("nan")
    mean_logprob_gap: float = float("nan")


def perturb_adapter(model: torch.nn.Module, step: int, scale: float = 0.02) -> None:
    """Stand in for an optimizer step: move every LoRA matrix by deterministic noise."""
    gen = torch.Generator().manual_seed(1000 + step)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn(param.shape, generator=gen) * scale)


def sampling_params(args: argparse.Namespace, seed: int) -> list[Any]:
    """One ``SamplingParams`` per prompt: fixed length, sampled-token logprobs."""
    from vllm import SamplingParams

    return [
        SamplingParams(
            n=args.n,
            max_tokens=args.tokens,
            temperature=1.0,
            seed=seed + i * args.n,
            logprobs=0,
            ignore_eos=True,
            detokenize=False,
        )
        for i in range(args.prompts)
    ]


def generate(
    llm: Any, prompts: list[list[int]], args: argparse.Namespace, lora: Any = None
) -> tuple[float, list[tuple[list[int], list[int], list[float]]]]:
    """Sample and return (tokens per second, [(prompt, completion, logprobs)])."""
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        sampling_params(args, seed=7),
        use_tqdm=False,
        lora_request=lora,
    )
    seconds = time.perf_counter() - start
    rows = []
    for prompt, output in zip(prompts, outputs):
        for sample in output.outputs:
            ids = [int(t) for t in sample.token_ids]
            logprobs = [float(step[t].logprob) for step, t in zip(sample.logprobs or [], ids)]
            rows.append((prompt, ids, logprobs))
    return sum(len(c) for _, c, _ in rows) / seconds, rows


def logprob_gap(
    model: torch.nn.Module, rows: list[tuple[list[int], list[int], list[float]]]
) -> tuple[float, float]:
    """Largest and mean |engine logprob - trainer logprob| over all sampled tokens."""
    from grpo_train.learner.forward import token_logprobs
    from grpo_train.learner.micro_batches import make_micro_batches

    batches = make_micro_batches(
        [p for p, _, _ in rows], [c for _, c, _ in rows], token_budget=8192, pad_id=0
    )
    gaps = []
    with torch.no_grad():
        for mb in batches:
            trainer, _ = token_logprobs(model, mb)  # (B, C)
            for b, row in enumerate(mb.rows):
                engine = torch.tensor(rows[row][2])
                gaps.append((trainer[b, : len(engine)] - engine).abs())
    every = torch.cat(gaps)
    return float(every.max()), float(every.mean())


def run_merged(model: Any, path: str, prompts: list[list[int]], args: argparse.Namespace) -> Row:
    """The trainer's path: ``VLLMEngine.sync_weights`` of the peft model (merged on the fly)."""
    from grpo_train.learner.weight_export import sync_rollout_weights
    from grpo_train.rollout.vllm_engine import VLLMEngine

    row = Row("merged weights (current)")
    start = time.perf_counter()
    engine = VLLMEngine(path, seed=0, max_model_len=512, cpu_kv_cache_gib=0.5)
    row.startup_s = time.perf_counter() - start
    try:
        rows: list[Any] = []
        for step in range(args.syncs):
            perturb_adapter(model, step)
            sync_rollout_weights(engine, model)
            row.sync_s.append(engine.last_sync_seconds)
            tps, rows = generate(engine.llm, prompts, args)
            row.tokens_per_s.append(tps)
        row.max_logprob_gap, row.mean_logprob_gap = logprob_gap(model, rows)
    finally:
        engine.close()
    return row


def run_adapter(model: Any, path: str, prompts: list[list[int]], args: argparse.Namespace) -> Row:
    """vLLM's LoRA: save the adapter (peft format) to /dev/shm, ``add_lora`` a new id per sync."""
    from vllm.lora.request import LoRARequest

    from grpo_train.learner.lora import save_adapter
    from grpo_train.rollout.vllm_engine import VLLMEngine

    row = Row("vLLM LoRA adapter")
    start = time.perf_counter()
    engine = VLLMEngine(
        path,
        seed=0,
        max_model_len=512,
        cpu_kv_cache_gib=0.5,
        enable_lora=True,
        max_lora_rank=args.lora_r,
        max_loras=1,
    )
    row.startup_s = time.perf_counter() - start
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="lora-bench-", dir=shm))
    try:
        rows: list[Any] = []
        for step in range(args.syncs):
            perturb_adapter(model, step)
            t = time.perf_counter()
            save_adapter(model, folder / f"step-{step}")
            # A new id per sync: vLLM caches adapters by id, and evicts the old one (max_loras=1).
            request = LoRARequest(f"policy-{step}", step + 1, str(folder / f"step-{step}"))
            engine.llm.llm_engine.add_lora(request)
            row.sync_s.append(time.perf_counter() - t)
            tps, rows = generate(engine.llm, prompts, args, lora=request)
            row.tokens_per_s.append(tps)
        row.max_logprob_gap, row.mean_logprob_gap = logprob_gap(model, rows)
    finally:
        engine.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="HF folder (default: the tiny test model, built here)")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--syncs", type=int, default=5, help="simulated steps per variant")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8, help="completions per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per completion")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from grpo_train.learner.lora import LoraSettings, apply_lora
    from grpo_train.models.loading import build_tiny_model, load_policy

    path = args.model or str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    settings = LoraSettings(lora_r=args.lora_r, lora_alpha=2 * args.lora_r)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (16,), generator=gen).tolist() for _ in range(args.prompts)]
    rows = []
    for runner in (run_merged, run_adapter):
        torch.manual_seed(0)  # the same initial adapter and updates for both variants
        model = apply_lora(load_policy(path)[0], settings)
        rows.append(runner(model, path, prompts, args))

    print(
        f"\nmodel {path}, LoRA r={args.lora_r} all-linear, {args.syncs} syncs, "
        f"{args.prompts} prompts x {args.n} x {args.tokens} tokens, {args.threads} thread(s), "
        f"load {os.getloadavg()[0]:.1f}\n"
    )
    print("| variant | start s | sync s (median) | gen tok/s (median) | logprob gap max / mean |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.variant} | {r.startup_s:.1f} | {statistics.median(r.sync_s):.3f} | "
            f"{statistics.median(r.tokens_per_s):,.0f} | "
            f"{r.max_logprob_gap:.1e} / {r.mean_logprob_gap:.1e} |"
        )
    for r in rows:
        print(f"{r.variant}: sync s {[round(s, 3) for s in r.sync_s]}, "
              f"tok/s {[round(t) for t in r.tokens_per_s]}")  # fmt: skip


if __name__ == "__main__":
    main()
