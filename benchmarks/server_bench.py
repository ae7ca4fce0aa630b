"""Benchmark: ``vllm_mode: server`` and ``async_generation`` against the colocated vLLM engine.

Each variant trains the same float32 model (the embedded SmolLM2-135M by default) on
the quick start's task (``math/arithmetic-v0``, ``task=add2``, ``answer=loose``; learning
rate 2e-5) for ``--steps`` steps with the same prompts, seeds, group size and completion
cap, in its own process tree:

* ``colocate``: ``grpo train --engine vllm`` (the engine in a child process of the trainer);
* ``server``: ``grpo serve`` started first (its start-up is not part of the run), then
  ``grpo train --vllm_mode server``; the weights go over gloo, one broadcast per step;
* ``colocate-async`` / ``server-async``: the same with ``--async_generation true
  --max_staleness 1``: step t+1's rollouts are generated (with the weights before step t's
  update) while step t trains.

Columns (medians over the steps after the first): steps per hour, seconds per step and its
generate / train / sync split, the bytes each sync sends; for async, the time the trainer
waited for rollouts, the engine's idle time in the step and the trained samples' staleness
(generate_s is then the producer's, overlapping train_s); and the time to reach ``--target``
held-out accuracy (``time/elapsed`` at the first evaluation that reached it, nan if none did;
evaluations every ``--eval-every`` steps are part of every variant's time).

With one replica ``colocate`` and ``server`` run the same engine calls, so they train the same
(the tests check that bit for bit); the table shows what the server's extra hops cost (HTTP +
JSON for the completions, a broadcast instead of a file written for the engine). The async
variants train on samples one update old, so their curves differ; what they can gain is the
overlap of generation with the update, bounded on a 2-core machine, where the engine's process
and the trainer share the same two cores (the idle and wait columns show how much overlapped).

    python benchmarks/server_bench.py --steps 6
    python benchmarks/server_bench.py --variants colocate,colocate-async --steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BIN = Path(sys.executable).parent


def _train_args(model: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return [
        "--model", str(model), "--env", args.env, "--engine", "vllm",
        "--num_generations", str(args.group), "--prompts_per_step", str(args.prompts),
        "--max_prompt_length", "128", "--max_completion_length", str(args.max_new_tokens),
        "--max_steps", str(args.steps), "--eval_size", str(args.eval_size),
        "--eval_every", str(args.eval_every), "--save_every", "0",
        "--learning_rate", str(args.learning_rate), "--progress", "false",
        "--log_every_samples", "0",
        "--seed", "1", "--num_threads", str(args.threads), "--vllm_cpu_kv_cache_gib", "0.25",
        "--output_dir", str(out),
    ]  # fmt: skip


def _env(args: argparse.Namespace) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}


ASYNC = ["--async_generation", "true", "--max_staleness", "1"]


def _rows(out: Path) -> list[dict[str, float]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines)]


def _summary(name: str, every: list[dict[str, float]], target: float) -> dict[str, float | str]:
    rows = [r for r in every if "time/step" in r][1:]

    def med(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in rows) if rows else float("nan")

    reached = [
        r["time/elapsed"] for r in every if r.get("eval/accuracy", -1.0) >= target and r["step"]
    ]
    step = med("time/step")
    return {
        "variant": name,
        "steps_per_hour": 3600 / step if step else float("nan"),
        "step_s": step,
        "generate_s": med("time/producer_generate" if "async" in name else "time/generate"),
        "train_s": med("time/train"),
        "sync_s": med("time/sync"),
        "sync_mb": med("sync/bytes") / 2**20,
        "wait_s": med("time/wait") if "async" in name else med("time/generate"),
        "engine_idle_s": med("time/engine_idle") if "async" in name else float("nan"),
        "staleness": med("async/staleness"),
        "to_target_s": reached[0] if reached else float("nan"),
        "final_acc": next(
            (r["eval/accuracy"] for r in reversed(every) if "eval/accuracy" in r), float("nan")
        ),
    }


def run_colocate(
    model: Path, tmp: Path, args: argparse.Namespace, name: str = "colocate"
) -> dict[str, float | str]:
    out = tmp / name
    cmd = [str(BIN / "grpo"), "train", *_train_args(model, out, args)]
    cmd += ASYNC if name.endswith("async") else []
    subprocess.run(cmd, env=_env(args), check=True, stdout=subprocess.DEVNULL)
    return _summary(name, _rows(out), args.target)


def run_server(
    model: Path, tmp: Path, args: argparse.Namespace, name: str = "server"
) -> dict[str, float | str]:
    from grpo_train.rollout.weight_channel import free_port

    port = free_port()
    serve = [
        str(BIN / "grpo"), "serve", "--model", str(model), "--port", str(port), "--host",
        "127.0.0.1", "--dtype", "float32", "--max_model_len", str(128 + args.max_new_tokens),
        "--cpu_kv_cache_gib", "0.25",
    ]  # fmt: skip
    server = subprocess.Popen(serve, env=_env(args), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"grpo serve ended with {server.returncode}")
            try:
                urllib.request.urlopen(url + "/health", timeout=5).close()
                break
            except OSError:
                time.sleep(1)
        out = tmp / name
        cmd = [str(BIN / "grpo"), "train", *_train_args(model, out, args)]
        cmd += ["--vllm_mode", "server", "--vllm_server_urls", url]
        cmd += ASYNC if name.endswith("async") else []
        subprocess.run(cmd, env=_env(args), check=True, stdout=subprocess.DEVNULL)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=120)
    return _summary(name, _rows(out), args.target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--env",
        default="{id: math/arithmetic-v0, kwargs: {task: add2, answer: loose}}",
        help="the environment (default: the quick start's, so time-to-target is the default run's)",
    )
    parser.add_argument("--learning-rate", type=float, default=2e-5, help="the quick start's")
    parser.add_argument(
        "--variants",
        default="colocate,server",
        help="comma-separated, run in this order: colocate, server, colocate-async, server-async",
    )
    parser.add_argument("--eval-size", type=int, default=0, help="held-out prompts (0: none)")
    parser.add_argument("--eval-every", type=int, default=0, help="steps between evaluations")
    parser.add_argument("--target", type=float, default=0.5, help="held-out accuracy to reach")
    parser.add_argument(
        "--model",
        default="default",
        help="model (default: the embedded SmolLM2-135M-Instruct, which gets some add2 "
        "questions right, so steps have an update; 'tiny': a random model, generation only)",
    )
    args = parser.parse_args(argv)
    from grpo_train.models.loading import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="server-bench-") as name:
        tmp = Path(name)
        model = build_tiny_model(tmp / "tiny", seed=0) if args.model == "tiny" else Path(args.model)
        if args.model == "default":
            from grpo_train.models.loading import resolve_model

            model = Path(resolve_model("default"))
        reports = [
            (run_server if name.startswith("server") else run_colocate)(model, tmp, args, name)
            for name in args.variants.split(",")
        ]
    keys = list(reports[0])
    print(" | ".join(f"{k:>14}" for k in keys))
    for r in reports:
        print(" | ".join(f"{v:>14.3f}" if isinstance(v, float) else f"{v:>14}" for v in r.values()))
    base = reports[0]
    for r in reports[1:]:
        speed = float(r["steps_per_hour"]) / float(base["steps_per_hour"])
        print(f"{r['variant']} / {base['variant']} steps per hour: {speed:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
