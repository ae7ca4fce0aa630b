"""Benchmark: our trainer (hf engine, vllm engine) against TRL's GRPOTrainer (hf generation).

Same tiny model, same prompts, same group size, same completion length, same reward; each variant
runs a few steps in its own subprocess (clean peak RSS), and the parent prints one table:

    python benchmarks/trainer_bench.py                       # all variants, defaults below
    python benchmarks/trainer_bench.py --steps 6 --variants ours-hf trl-hf
    python benchmarks/trainer_bench.py --model path/to/model --completion-length 64

Columns: seconds per step, the generate / score / train / sync split, completion tokens per step
(to check that the variants generate comparable lengths), the fraction of groups whose rewards all
agree (no learning signal; ours skips their rows in the update, so its train time depends on it)
and completion tokens per second of step time (medians over the steps after the first, which warms
caches and is excluded for every variant; the fraction is a mean over them), peak RSS of the
process tree (trainer plus any engine processes, sampled every 0.1 s), the start-up time, and the
CPU seconds per step of the process tree (user + system, median): with one thread per process
this is close to the wall time of an idle machine and far less sensitive to other jobs than the
wall time, which on a loaded machine measures the scheduler's share. The variants run round robin
``--repeats`` times and the fastest run of each is shown: on a shared machine the load drifts by
several x within minutes.

Fairness: every variant trains the same float32 model with the same prompts, group size, length
cap, sampling (temperature 1, no top-k/top-p), learning rate, loss (``dapo``, clip 0.2/0.28,
beta 0) and one optimizer step per step, in its own process with the same number of CPU threads
(``--threads``, default 1: on a small machine shared with other jobs, OpenMP threads that spin
while another process holds the cores make every kernel several times slower and the timings
measure the load rather than the code; the vLLM engine gets the same count).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

VARIANTS = ("ours-hf", "ours-vllm", "ours-vllm-child", "trl-hf")


@dataclass
class Result:
    variant: str
    steps: int = 0
    step_s: float = 0.0
    generate_s: float = 0.0
    score_s: float = 0.0
    train_s: float = 0.0
    sync_s: float = 0.0
    tokens_per_s: float = 0.0
    tokens_per_step: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds per step of the whole process tree (trainer and engine processes)."""
    equal_groups: float = 0.0
    """Mean fraction of groups whose rewards all agree (no gradient: ours skips their rows)."""
    peak_rss_mb: float = 0.0
    startup_s: float = 0.0
    reward_first: float = 0.0
    reward_last: float = 0.0
    error: str = ""
    per_step: list[float] = field(default_factory=list)


def tree_cpu_seconds() -> float:
    """User + system CPU seconds used so far by this process and its live children."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a child may exit meanwhile
            times = p.cpu_times()
            total += times.user + times.system
    return total


class RssPeak:
    """Peak resident memory of this process and its children, sampled in a thread."""

    def __init__(self, interval: float = 0.1) -> None:
        import psutil

        self.proc, self.peak, self.interval = psutil.Process(), 0, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            with contextlib.suppress(psutil.Error):
                for p in [self.proc, *self.proc.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):  # a child may exit meanwhile
                        total += p.memory_info().rss
            self.peak = max(self.peak, total)
            time.sleep(self.interval)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


# --------------------------------------------------------------------------- shared workload


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Question {i}: say a digit."}] for i in range(n)]


def digit_reward(text: str) -> float:
    """1 if the first non-space character is a digit (the toy task of the trainer tests)."""
    stripped = text.lstrip()
    return 1.0 if stripped and stripped[0].isdigit() else 0.0


def make_env(n_prompts: int):
    import datasets

    from grpo_envs.base import Environment
    from grpo_envs.types import Outcome, Score

    class BenchEnv(Environment):
        env_id = "bench/digit-v0"
        score_workers = 0  # in-process, like TRL's reward functions

        def dataset(self, split: str = "train") -> datasets.Dataset:
            rows = [
                {
                    "id": f"{split}-{i}",
                    "prompt": p,
                    "answer": "7",
                    "env_id": self.env_id,
                    "metadata": "{}",
                }
                for i, p in enumerate(prompts(n_prompts))
            ]
            return datasets.Dataset.from_list(rows)

        def score(self, completion, sample):
            r = digit_reward(completion)
            return Score(r, Outcome.CORRECT if r else Outcome.WRONG)

    return BenchEnv()


# --------------------------------------------------------------------------- variants


def run_ours(args: argparse.Namespace, variant: str) -> Result:
    """``ours-hf``, ``ours-vllm`` (on CPU in process, the default) or ``ours-vllm-child``
    (``vllm_in_process: false``)."""
    from grpo_train.config import TrainConfig
    from grpo_train.run.run_log import read_metrics
    from grpo_train.trainer import Trainer

    engine = "hf" if variant == "ours-hf" else "vllm"
    out = tempfile.mkdtemp(prefix=f"bench-{variant}-")
    cfg = TrainConfig.from_flat(
        {
            "model": args.model,
            "engine": engine,
            "num_generations": args.group,
            "prompts_per_step": args.prompts,
            "max_prompt_length": 128,
            "max_completion_length": args.completion_length,
            "learning_rate": args.lr,
            "epsilon_high": 0.28,
            "max_steps": args.steps,
            "output_dir": out,
            "eval_size": 0,
            "save_every": 0,
            "keep_last": 1,
            "progress": False,
            "log_every_samples": 0,
            "micro_batch_tokens": args.micro_batch_tokens,
            "vllm_cpu_kv_cache_gib": args.kv_cache_gib,
            **({"vllm_in_process": False} if variant == "ours-vllm-child" else {}),
        }
    )
    start = time.perf_counter()
    trainer = Trainer(cfg, env=make_env(args.prompts * args.steps))
    startup = time.perf_counter() - start
    walls: list[float] = []
    original = trainer.train_step

    cpus: list[float] = []

    def timed(step, log):
        t, c = time.perf_counter(), tree_cpu_seconds()
        metrics = original(step, log)
        walls.append(time.perf_counter() - t)
        cpus.append(tree_cpu_seconds() - c)
        return metrics

    trainer.train_step = timed  # type: ignore[method-assign]
    trainer.save = lambda step: None  # type: ignore[method-assign,assignment,return-value]
    try:
        trainer.train()
    finally:
        trainer.close()
    rows = [r for r in read_metrics(out) if "time/generate" in r][1:]
    # Per steady step: (wall, generate, score, sync, completion tokens).
    steps = [
        (
            w,
            r["time/generate"],
            r["time/score"],
            r["time/sync"],
            r["length/mean"] * args.prompts * args.group,
        )
        for w, r in zip(walls[1:], rows)
    ]
    res = summarize(variant, steps, startup, walls)
    res.cpu_s = statistics.median(cpus[1:])
    res.equal_groups = statistics.mean(r["group/frac_zero_std"] for r in rows)
    all_rows = [r for r in read_metrics(out) if "reward/mean" in r]
    res.reward_first, res.reward_last = all_rows[0]["reward/mean"], all_rows[-1]["reward/mean"]
    return res


def _trl_config(args: argparse.Namespace) -> Any:
    """TRL's GRPOConfig for the same run as ours: DAPO loss, clip-higher, no KL, CPU, float32."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        per_device_train_batch_size=args.prompts * args.group,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        max_completion_length=args.completion_length,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        epsilon_high=0.28,
        beta=0.0,
        loss_type="dapo",
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        temperature=1.0,
        dataloader_num_workers=0,
    )


def run_trl(args: argparse.Namespace) -> Result:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    timings = {"generate": 0.0, "score": 0.0}
    counts = {"tokens": 0}
    rewards: list[float] = []
    equal: list[float] = []  # per call (one per step): fraction of groups with equal rewards

    def reward_func(completions, completion_ids=None, **kwargs):
        if completion_ids is not None:
            counts["tokens"] += sum(len(c) for c in completion_ids)
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        scores = [digit_reward(t) for t in texts]
        rewards.append(sum(scores) / len(scores))
        groups = [scores[i : i + args.group] for i in range(0, len(scores), args.group)]
        equal.append(sum(len(set(g)) == 1 for g in groups) / len(groups))
        return scores

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    data = datasets.Dataset.from_list([{"prompt": p} for p in prompts(args.prompts * args.steps)])
    cfg = _trl_config(args)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_func,
        args=cfg,
        train_dataset=data,
        processing_class=tokenizer,
    )
    startup = time.perf_counter() - start

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timings[name] += time.perf_counter() - t

        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._calculate_rewards = timed("score", trainer._calculate_rewards)
    walls: list[float] = []
    splits: list[tuple[float, float, int]] = []
    cpus: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.t, self.c = time.perf_counter(), tree_cpu_seconds()
            self.base = (timings["generate"], timings["score"], counts["tokens"])

        def on_step_end(self, *a, **kw):
            walls.append(time.perf_counter() - self.t)
            cpus.append(tree_cpu_seconds() - self.c)
            g0, s0, k0 = self.base
            splits.append((timings["generate"] - g0, timings["score"] - s0, counts["tokens"] - k0))

    trainer.add_callback(StepTimer())
    trainer.train()
    steps = [(w, g, sc, 0.0, float(k)) for w, (g, sc, k) in zip(walls[1:], splits[1:])]
    res = summarize("trl-hf", steps, startup, walls)
    res.cpu_s = statistics.median(cpus[1:])
    res.equal_groups = statistics.mean(equal[1:]) if len(equal) > 1 else 0.0
    if rewards:
        res.reward_first, res.reward_last = rewards[0], rewards[-1]
    return res


# --------------------------------------------------------------------------- driver


def summarize(
    variant: str,
    steps: list[tuple[float, float, float, float, float]],
    startup: float,
    walls: list[float],
) -> Result:
    """Medians over the steady steps: this machine is shared, and medians shrug off stalls."""
    med = statistics.median
    res = Result(variant, steps=len(steps), startup_s=startup, per_step=walls)
    res.step_s = med(s[0] for s in steps)
    res.generate_s = med(s[1] for s in steps)
    res.score_s = med(s[2] for s in steps)
    res.sync_s = med(s[3] for s in steps)
    res.train_s = med(s[0] - s[1] - s[2] - s[3] for s in steps)
    res.tokens_per_s = med(s[4] / s[0] for s in steps)
    res.tokens_per_step = med(s[4] for s in steps)
    return res


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    peak = RssPeak()
    try:
        res = run_trl(args) if args.child == "trl-hf" else run_ours(args, args.child)
    except Exception as exc:  # report, don't crash the table
        res = Result(args.child, error=f"{type(exc).__name__}: {exc}")
    res.peak_rss_mb = peak.stop()
    Path(args.json).write_text(json.dumps(asdict(res)))


def table(results: list[Result], args: argparse.Namespace) -> str:
    head = (
        f"tiny model, {args.prompts} prompts x {args.group} completions, "
        f"{args.completion_length} new tokens max, {args.steps} steps (first one not counted); "
        f"medians over steps, best of {args.repeats} round-robin runs; "
        f"{args.threads} CPU thread(s) per variant; 1-min load average "
        f"{args.load_before:.1f} before, {os.getloadavg()[0]:.1f} after\n"
    )
    cols = (
        "variant",
        "s/step",
        "generate",
        "score",
        "train",
        "sync",
        "tokens/step",
        "equal-reward groups",
        "tok/s",
        "peak RSS MB",
        "startup s",
        "vs TRL",
        "CPU s/step",
        "vs TRL (CPU)",
    )
    lines = [head, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    trl = next((r for r in results if r.variant == "trl-hf" and not r.error), None)
    for r in results:
        if r.error:
            lines.append(f"| {r.variant} | failed: {r.error} |")
            continue
        speed = f"{trl.step_s / r.step_s:.1f}x" if trl and r.step_s else "-"
        cpu_speed = f"{trl.cpu_s / r.cpu_s:.1f}x" if trl and r.cpu_s else "-"
        lines.append(
            f"| {r.variant} | {r.step_s:.2f} | {r.generate_s:.2f} | {r.score_s:.3f} "
            f"| {r.train_s:.2f} | {r.sync_s:.2f} | {r.tokens_per_step:.0f} | "
            f"{r.equal_groups:.2f} | "
            f"{r.tokens_per_s:.0f} | {r.peak_rss_mb:.0f} | {r.startup_s:.1f} | {speed} | "
            f"{r.cpu_s:.2f} | {cpu_speed} |"
        )
    return "\n".join(lines)


def thread_env(threads: int) -> dict[str, str]:
    """Environment giving a variant's processes (trainer, vLLM engine) ``threads`` threads."""
    count = str(threads)
    # vLLM's CPU worker otherwise binds one OpenMP thread per core ("auto").
    return {
        "OMP_NUM_THREADS": count,
        "MKL_NUM_THREADS": count,
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: a tiny random Llama)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (best is shown)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--kv-cache-gib", type=float, default=0.25, help="vLLM CPU KV cache")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for every variant")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    if args.model is None:
        from grpo_train.models.loading import build_tiny_model

        args.model = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="bench-model-")) / "tiny"))
    args.load_before = os.getloadavg()[0]
    runs: dict[str, list[Result]] = {v: [] for v in args.variants}
    # Round robin: load on a shared machine drifts, so each variant sees the same conditions.
    for variant in [v for _ in range(args.repeats) for v in args.variants]:
        out = Path(tempfile.mkdtemp()) / "result.json"
        cmd = [
            sys.executable,
            __file__,
            "--child",
            variant,
            "--json",
            str(out),
            "--model",
            args.model,
            "--steps",
            str(args.steps),
            "--prompts",
            str(args.prompts),
            "--group",
            str(args.group),
            "--completion-length",
            str(args.completion_length),
            "--lr",
            str(args.lr),
            "--micro-batch-tokens",
            str(args.micro_batch_tokens),
            "--kv-cache-gib",
            str(args.kv_cache_gib),
            "--threads",
            str(args.threads),
        ]
        print(f"running {variant} ...", file=sys.stderr, flush=True)
        proc = subprocess.run(
            cmd,
            env={**os.environ, **thread_env(args.threads), "TOKENIZERS_PARALLELISM": "false"},
            capture_output=True,
            text=True,
        )
        if out.is_file():
            res = Result(**json.loads(out.read_text()))
        else:
            res = Result(variant, error=f"exit {proc.returncode}: {proc.stderr[-500:]}")
        runs[variant].append(res)
        print(f"  {res}", file=sys.stderr, flush=True)
    # The best (fastest) repeat of each variant; a failed variant shows its error.
    results = [min(rs, key=lambda r: (bool(r.error), r.step_s)) for rs in runs.values()]
    print(table(results, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
