"""GPU check: a few GRPO training steps of the tiny model and a mid-size one, in bf16.

For each model it prints generated tokens per second, the split of a step's time (generate /
score / train / sync) and peak GPU memory, for the hf engine and, where vLLM is installed, the
vllm engine (colocated) and ``vllm-server`` (``vllm_mode: server``: a ``grpo serve`` replica
in a process of its own, weights broadcast over NCCL, or gloo on a single GPU). On a machine
without CUDA it says so and exits 0 (no test may need a GPU).

``hf-async`` / ``vllm-async`` / ``vllm-server-async``: the same with ``async_generation`` and
``max_staleness: 1`` (step t+1's rollouts generated while step t trains; trainer mode only).
``hf-async`` needs no vLLM: the hf engine gets its own copy of the weights on the GPU (the
shared module cannot generate while the update changes it), synced after every step, so it
exercises the producer thread, the staleness schedule and the weight sync on CUDA; its overlap is
bounded, as both threads queue kernels on the same device and Python holds the GIL between
launches. The table's ``wait`` column is the time the trainer waited for rollouts (for
synchronous engines: generation + scoring), ``idle`` the engine's idle time per step.

Two modes:

* ``--mode trainer`` (default): the real ``grpo_train.trainer.Trainer`` on ``math/add2-v0``, with
  the timings it logs per step in ``metrics.jsonl``;
* ``--mode minimal``: a GRPO step assembled here from the library's parts (HF/vLLM generate,
  score, ``compute_advantages``, the trainer's own ``grpo_train.update.grpo_update`` with AdamW,
  weight sync), without the ``Trainer``; also the fallback (announced) when trainer mode fails.

The first step of each run is a warm-up (CUDA kernels, vLLM graphs) and is left out of the
medians. Run from the repository root:

    python benchmarks/gpu_check.py                       # tiny + SmolLM2-135M, hf (+ vllm)
    python benchmarks/gpu_check.py --model Qwen/Qwen2.5-0.5B-Instruct --engines vllm
    python benchmarks/gpu_check.py --engines vllm,vllm-server   # colocate vs server mode
    python benchmarks/gpu_check.py --engines hf,hf-async --skip-mid    # async against sync
    python benchmarks/gpu_check.py --allow-cpu --skip-mid --steps 2   # smoke run without a GPU
    python benchmarks/gpu_check.py --long-completion     # peak CUDA memory vs completion length

``--long-completion``: one update (forward, backward) of a random Qwen3-architecture model with
Qwen's 151,936-row vocabulary (2 layers, hidden 128, bf16) on 1 prompt x 2 completions of 1k to
16k tokens, per log-prob head: ``previous`` (the full float32 log-softmax kept), ``chunked``
and ``fused`` (``grpo_train.logprobs``), padded and packed; the table gives the peak CUDA memory
above the model's and its growth per completion token (the fused head should grow by the
activations only, far below one float32 vocabulary row, 594 KiB).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    pass

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ENV_ID = "math/add2-v0"


@dataclass(frozen=True)
class Report:
    """Median per-step numbers of one (model, engine) run, warm-up step excluded."""

    model: str
    engine: str
    mode: str
    steps: int
    tokens_per_s: float
    step_s: float
    generate_s: float
    score_s: float
    train_s: float
    sync_s: float
    peak_allocated_mb: float | None
    peak_reserved_mb: float | None
    wait_s: float = float("nan")
    idle_s: float = float("nan")


def _median(rows: Sequence[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def _report(model: str, engine: str, mode: str, rows: Sequence[dict[str, float]]) -> Report:
    """Summarise per-step rows (medians) with the peak GPU memory seen so far."""
    from grpo_train.metrics import peak_memory  # lazy, like every grpo_train import here

    peak = peak_memory()
    producer = "producer_" if engine.endswith("-async") else ""  # async: the producer's seconds
    return Report(
        model=model,
        engine=engine,
        mode=mode,
        steps=len(rows),
        tokens_per_s=_median(rows, "tokens_per_s"),
        step_s=_median(rows, "time/step"),
        generate_s=_median(rows, f"time/{producer}generate"),
        score_s=_median(rows, f"time/{producer}score"),
        train_s=_median(rows, "time/train"),
        sync_s=_median(rows, "time/sync"),
        peak_allocated_mb=peak.cuda_allocated_mb,
        peak_reserved_mb=peak.cuda_reserved_mb,
        wait_s=_median(rows, "time/wait")
        if engine.endswith("-async")
        else _median(rows, "time/generate") + _median(rows, "time/score"),
        idle_s=_median(rows, "time/engine_idle"),
    )


# ------------------------------------------------------------------------------- trainer mode


def run_trainer(model: str, engine: str, args: argparse.Namespace, out: Path) -> Report:
    """Run ``Trainer`` for ``args.steps`` steps and summarise its logged timings."""
    from grpo_train.config import TrainConfig
    from grpo_train.metrics import reset_peak_memory
    from grpo_train.run_log import read_metrics
    from grpo_train.trainer import Trainer

    base = engine.removesuffix("-async")
    values: dict[str, object] = dict(
        {
            "model": model,
            "dtype": args.dtype,
            "env": [{"id": ENV_ID}],
            "engine": base,
            "async_generation": base != engine,
            "max_staleness": 1,
            "num_generations": args.group,
            "prompts_per_step": args.prompts,
            "max_completion_length": args.max_new_tokens,
            "max_steps": args.steps,
            "eval_size": 0,
            "save_every": 0,
            "log_every_samples": 0,
            "learning_rate": 1e-6,
            "micro_batch_tokens": args.micro_batch_tokens,
            "gradient_checkpointing": args.gradient_checkpointing,
            "vllm_memory_fraction": args.vllm_memory_fraction,
            "output_dir": str(out),
            "progress": False,
        }
    )
    reset_peak_memory()
    with _served(model, base, args) as server_settings:
        config = TrainConfig.from_flat({**values, **server_settings})
        own = None
        if engine == "hf-async":  # its own weights: the shared module changes while it samples
            from grpo_train.rollout import make_engine

            own = make_engine("hf", model, dtype=args.dtype, device="auto")
        trainer = Trainer(config, engine=own)
        try:
            trainer.train()
        finally:
            trainer.close()
    rows = [r for r in read_metrics(out) if "time/step" in r][1:]  # drop the warm-up step
    return _report(model, engine, "trainer", rows)


@contextlib.contextmanager
def _served(model: str, engine: str, args: argparse.Namespace) -> Iterator[dict[str, object]]:
    """For ``vllm-server``: a ``grpo serve`` replica and the trainer settings that reach it.

    With two GPUs or more the replica gets the last one and the weights go over NCCL; on one GPU
    it shares the trainer's (NCCL refuses two ranks on one device: the broadcast goes through
    host memory, gloo). Other engines: nothing is started.
    """
    if engine != "vllm-server":
        yield {}
        return
    import json
    import os
    import subprocess
    import urllib.request

    from grpo_train.rollout.weight_channel import free_port

    port = free_port()
    gpus = torch.cuda.device_count()
    env = dict(os.environ)
    if gpus >= 2:
        env["CUDA_VISIBLE_DEVICES"] = str(gpus - 1)
    command = [
        sys.executable, "-m", "grpo_train.serve", "--model", model, "--port", str(port),
        "--host", "127.0.0.1", "--dtype", args.dtype, "--max_model_len", "1024",
        "--gpu_memory_utilization", str(args.vllm_memory_fraction),
    ]  # fmt: skip
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"grpo serve did not come up (exit code {proc.poll()})")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as reply:
                    print(f"  server ready: {json.loads(reply.read())}", flush=True)
                    break
            except OSError:
                time.sleep(2)
        yield {
            "vllm_mode": "server",
            "vllm_server_urls": url,
            "vllm_sync_backend": "nccl" if gpus >= 2 else "gloo",
            "engine": "vllm",
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------------------- minimal mode


def run_minimal(model_name: str, engine_name: str, args: argparse.Namespace) -> Report:
    """A self-contained GRPO loop: generate -> score -> advantages -> update -> sync."""
    import grpo_envs
    from grpo_train.memory import enable_gradient_checkpointing
    from grpo_train.metrics import reset_peak_memory
    from grpo_train.models import load_policy, resolve_model
    from grpo_train.update import Learner, UpdateSettings

    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = resolve_model(model_name)
    model, tokenizer = load_policy(path, args.dtype, device)
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    engine = _minimal_engine(engine_name, path, model, tokenizer, args)
    env = grpo_envs.make(ENV_ID)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def adamw_step(loss: float) -> float:
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    learner = Learner(model, pad_id=tokenizer.pad_token_id, device=device)
    settings = UpdateSettings.of(
        max_completion_length=args.max_new_tokens, micro_batch_tokens=args.micro_batch_tokens
    )
    reset_peak_memory()
    records: list[dict[str, float]] = []
    try:
        for step in range(args.steps):
            records.append(
                _minimal_step(step, engine, env, tokenizer, learner, adamw_step, settings, args)
            )
    finally:
        engine.close()
    kept = records[1:] if len(records) > 1 else records
    return _report(model_name, engine_name, "minimal", kept)


def _minimal_engine(
    engine_name: str, path: str, model: Any, tokenizer: Any, args: argparse.Namespace
) -> Any:
    """The rollout engine of minimal mode: vLLM on the model folder, or HF sharing ``model``."""
    if engine_name == "vllm":
        from grpo_train.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            path,
            dtype=args.dtype,
            max_model_len=512 + args.max_new_tokens,
            gpu_memory_utilization=args.vllm_memory_fraction,
        )
    from grpo_train.rollout.hf import HFEngine

    return HFEngine(model, tokenizer)


def _minimal_step(
    step: int,
    engine: Any,
    env: Any,
    tokenizer: Any,
    learner: Any,
    adamw_step: Any,
    settings: Any,
    args: argparse.Namespace,
) -> dict[str, float]:
    """One timed GRPO step of minimal mode; return its time split and throughput."""
    from grpo_envs.types import Sample
    from grpo_train.advantages import compute_advantages
    from grpo_train.batch import RolloutBatch
    from grpo_train.groups import Group
    from grpo_train.prompts import encode_prompt
    from grpo_train.rollout.base import SamplingConfig
    from grpo_train.update import grpo_update
    from grpo_train.weight_export import sync_rollout_weights

    times: dict[str, float] = {}
    rows = env.dataset("train")
    samples = [
        Sample.from_row(rows[(step * args.prompts + i) % len(rows)]) for i in range(args.prompts)
    ]
    prompts = [encode_prompt(tokenizer, s).ids for s in samples]
    _sync_cuda()
    t = time.perf_counter()
    sampling = SamplingConfig(n=args.group, max_new_tokens=args.max_new_tokens, seed=step)
    groups = engine.generate(prompts, sampling)
    _sync_cuda()
    times["generate"] = time.perf_counter() - t

    t = time.perf_counter()
    texts = [c.text for g in groups for c in g]
    scores = env.score_batch(texts, [s for s in samples for _ in range(args.group)])
    batch = RolloutBatch.from_groups(
        [
            Group(s, 0, p, list(g), scores[k * args.group : (k + 1) * args.group])
            for k, (s, p, g) in enumerate(zip(samples, prompts, groups))
        ],
        args.group,
    )
    times["score"] = time.perf_counter() - t

    t = time.perf_counter()
    adv = compute_advantages(batch.rewards, valid=batch.scored).float()  # (P, G)
    grpo_update(learner, adamw_step, batch, adv, settings)
    total_tokens = sum(len(c) for c in batch.completion_ids)
    _sync_cuda()
    times["train"] = time.perf_counter() - t

    t = time.perf_counter()
    sync_rollout_weights(engine, learner.model)
    _sync_cuda()
    times["sync"] = time.perf_counter() - t
    step_s = sum(times.values())
    print(f"  step {step + 1}: {step_s:.2f} s, {total_tokens} tokens", flush=True)
    return {
        **{f"time/{k}": v for k, v in times.items()},
        "time/step": step_s,
        "tokens_per_s": total_tokens / step_s,
    }


def _sync_cuda() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------- main


def _print_table(reports: Sequence[Report]) -> None:
    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    header = (
        f"{'model':<34} {'engine':<17} {'mode':<8} {'steps':>5} {'tok/s':>8} {'step s':>7} "
        f"{'gen':>6} {'score':>6} {'train':>6} {'sync':>6} {'wait':>6} {'idle':>6} "
        f"{'peak alloc MB':>14} {'peak resv MB':>13}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in reports:
        name = Path(r.model).name if Path(r.model).is_absolute() else r.model
        name = name if len(name) <= 34 else "..." + name[-31:]
        print(
            f"{name:<34} {r.engine:<17} {r.mode:<8} {r.steps:>5} {r.tokens_per_s:>8.0f} "
            f"{r.step_s:>7.2f} "
            f"{r.generate_s:>6.2f} {r.score_s:>6.2f} {r.train_s:>6.2f} {r.sync_s:>6.2f} "
            f"{r.wait_s:>6.2f} {r.idle_s:>6.2f} "
            f"{mb(r.peak_allocated_mb):>14} {mb(r.peak_reserved_mb):>13}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="default", help="mid-size model (default: SmolLM2-135M-Instruct)"
    )
    parser.add_argument("--skip-mid", action="store_true", help="only the tiny model")
    parser.add_argument("--skip-tiny", action="store_true", help="only the mid-size model")
    parser.add_argument(
        "--engines",
        default="auto",
        help="comma list of hf,vllm,vllm-server, each also as NAME-async; auto: hf, hf-async "
        "(+ vllm, vllm-async, vllm-server if installed)",
    )
    parser.add_argument("--mode", choices=("trainer", "minimal"), default="trainer")
    parser.add_argument(
        "--steps", type=int, default=4, help="steps per run; the first is a warm-up"
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--vllm-memory-fraction", type=float, default=0.3)
    parser.add_argument(
        "--allow-cpu", action="store_true", help="run without CUDA (smoke test only)"
    )
    parser.add_argument(
        "--long-completion",
        action="store_true",
        help="only the long-completion case: peak CUDA memory of one update vs length",
    )
    parser.add_argument("--lengths", default="1024,4096,16384", help="for --long-completion")
    args = parser.parse_args(argv)
    if args.long_completion:
        return long_completion_case(
            [int(n) for n in args.lengths.split(",")], allow_cpu=args.allow_cpu
        )

    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            "gpu_check: no CUDA device here; nothing to measure "
            "(pass --allow-cpu for a CPU smoke run)."
        )
        return 0
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        print(
            f"gpu_check: {props.name}, {props.total_memory / 2**30:.0f} GiB, "
            f"torch {torch.__version__}"
        )
    elif args.dtype == "bfloat16":
        args.dtype = "float32"  # bf16 matmuls on CPU are slow and not what this checks

    auto = ["hf", "hf-async"]
    engines = [e.strip() for e in args.engines.split(",")] if args.engines != "auto" else auto
    if args.engines == "auto" and importlib.util.find_spec("vllm") is not None:
        engines += ["vllm", "vllm-async", "vllm-server"]

    from grpo_train.models import ModelNotAvailableError, build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    reports: list[Report] = []
    try:
        models: list[str] = []
        if not args.skip_tiny:
            models.append(str(build_tiny_model(tmp / "tiny-llama", seed=0)))
        if not args.skip_mid:
            models.append(args.model)
        for model in models:
            for engine in engines:
                print(f"\n== {model} / {engine} / {args.dtype} ==", flush=True)
                try:
                    reports.append(_run(model, engine, args, tmp / f"run-{len(reports)}"))
                except ModelNotAvailableError as err:
                    print(f"  skipped: {err}")
                finally:
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _print_table(reports)
    return 0 if reports else 1


LONG_VARIANTS = ("previous", "chunked", "fused", "fused-packed")


def long_completion_case(lengths: Sequence[int], *, allow_cpu: bool = False) -> int:
    """Print peak memory of one update per log-prob head and completion length (see the doc)."""
    if not torch.cuda.is_available() and not allow_cpu:
        print("gpu_check --long-completion: no CUDA device here; nothing to measure.")
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"\n| head | {' | '.join(f'{n} MiB' for n in lengths)} | KiB / token |")
    print("|---" * (len(lengths) + 2) + "|")
    for variant in LONG_VARIANTS:
        peaks = []
        for length in lengths:
            try:
                peaks.append(_long_completion_peak_mib(variant, length, device))
            except torch.cuda.OutOfMemoryError:
                peaks.append(float("nan"))
            if device == "cuda":
                torch.cuda.empty_cache()
        growth = (peaks[-1] - peaks[0]) * 1024 / max(lengths[-1] - lengths[0], 1)
        cells = " | ".join("OOM" if p != p else f"{p:.0f}" for p in peaks)
        print(f"| {variant} | {cells} | {growth:.1f} |", flush=True)
    return 0


def _long_completion_peak_mib(variant: str, length: int, device: str) -> float:
    """Peak memory (MiB above the model's) of one forward + backward on 2 x ``length`` tokens."""
    from transformers import Qwen3ForCausalLM

    from benchmarks.long_completion_bench import previous_logprobs, tiny_qwen3_config
    from grpo_train.logprobs import HeadChoice
    from grpo_train.loss import make_micro_batches, token_logprobs

    torch.manual_seed(0)
    config = tiny_qwen3_config(length + 64)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = Qwen3ForCausalLM(config).to(device=device, dtype=dtype).train()
    prompt = torch.randint(3, 151_936, (64,)).tolist()
    completions = [torch.randint(3, 151_936, (length,)).tolist() for _ in range(2)]
    packed = variant == "fused-packed"
    batches = make_micro_batches([prompt] * 2, completions, 10**9, pad_id=0, packed=packed)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    for mb in batches:
        mb = mb.to(device)
        if variant == "previous":
            logprobs, _ = previous_logprobs(model, mb, True)
        else:
            head = HeadChoice("chunked" if variant == "chunked" else "fused")
            logprobs, _ = token_logprobs(model, mb, 1.0, True, head=head)
        (logprobs * mb.completion_mask).sum().backward()
    if not cuda:
        return 0.0
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _run(model: str, engine: str, args: argparse.Namespace, out: Path) -> Report:
    """Trainer mode, falling back to minimal mode when the trainer cannot be set up."""
    if engine.endswith("-async"):  # the pipeline lives in the Trainer: no minimal fallback
        return run_trainer(model, engine, args, out)
    if args.mode == "trainer":
        try:
            report = run_trainer(model, engine, args, out)
        except Exception as err:  # the trainer's API moved, or it fails on this machine
            # Report it and still measure: the numbers of the minimal step are worth having.
            print(f"  trainer mode failed ({type(err).__name__}: {err}); falling back to minimal")
        else:
            return report
    return run_minimal(model, engine, args)


if __name__ == "__main__":
    raise SystemExit(main())
