"""Benchmark: ``vllm_mode: server`` against the colocated vLLM engine, same task and seeds.

Each variant trains the same float32 model (the embedded SmolLM2-135M by default) on
``math/add2-v0`` for ``--steps`` steps with the same prompts, seeds, group size and completion
cap, in its own process tree:

* ``colocate``: ``grpo train --engine vllm`` (the engine in a child process of the trainer);
* ``server``: ``grpo serve`` started first (its start-up is not part of the run), then
  ``grpo train --vllm_mode server``; the weights go over gloo, one broadcast per step.

Columns (medians over the steps after the first): steps per hour, seconds per step and its
generate / train / sync split, and the bytes each sync sends. With one replica both variants run
the same engine calls, so they train the same (the tests check that bit for bit); the table shows
what the server's extra hops cost (HTTP + JSON for the completions, a broadcast instead of a
file written for the engine), and on a 2-core machine nothing else: generation and training
still take turns within a step, so there is no overlap to gain there.

    python benchmarks/server_bench.py --steps 6
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
        "--model", str(model), "--env", "math/add2-v0", "--engine", "vllm",
        "--num_generations", str(args.group), "--prompts_per_step", str(args.prompts),
        "--max_prompt_length", "128", "--max_completion_length", str(args.max_new_tokens),
        "--max_steps", str(args.steps), "--eval_size", "0", "--save_every", "0",
        "--learning_rate", "1e-3", "--progress", "false", "--log_every_samples", "0",
        "--seed", "1", "--num_threads", str(args.threads), "--vllm_cpu_kv_cache_gib", "0.25",
        "--output_dir", str(out),
    ]  # fmt: skip


def _env(args: argparse.Namespace) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}


def _rows(out: Path) -> list[dict[str, float]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "time/step" in r][1:]


def _summary(name: str, rows: list[dict[str, float]]) -> dict[str, float | str]:
    def med(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in rows) if rows else float("nan")

    step = med("time/step")
    return {
        "variant": name,
        "steps_per_hour": 3600 / step if step else float("nan"),
        "step_s": step,
        "generate_s": med("time/generate"),
        "train_s": med("time/train"),
        "sync_s": med("time/sync"),
        "sync_mb": med("sync/bytes") / 2**20,
    }


def run_colocate(model: Path, tmp: Path, args: argparse.Namespace) -> dict[str, float | str]:
    out = tmp / "colocate"
    cmd = [str(BIN / "grpo"), "train", *_train_args(model, out, args)]
    subprocess.run(cmd, env=_env(args), check=True, stdout=subprocess.DEVNULL)
    return _summary("colocate", _rows(out))


def run_server(model: Path, tmp: Path, args: argparse.Namespace) -> dict[str, float | str]:
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
        out = tmp / "server"
        cmd = [str(BIN / "grpo"), "train", *_train_args(model, out, args)]
        cmd += ["--vllm_mode", "server", "--vllm_server_urls", url]
        subprocess.run(cmd, env=_env(args), check=True, stdout=subprocess.DEVNULL)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=120)
    return _summary("server", _rows(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--model",
        default="default",
        help="model (default: the embedded SmolLM2-135M-Instruct, which gets some add2 "
        "questions right, so steps have an update; 'tiny': a random model, generation only)",
    )
    args = parser.parse_args(argv)
    from grpo_train.models import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="server-bench-") as name:
        tmp = Path(name)
        model = build_tiny_model(tmp / "tiny", seed=0) if args.model == "tiny" else Path(args.model)
        if args.model == "default":
            from grpo_train.models import resolve_model

            model = Path(resolve_model("default"))
        reports = [run_colocate(model, tmp, args), run_server(model, tmp, args)]
    keys = list(reports[0])
    print(" | ".join(f"{k:>14}" for k in keys))
    for r in reports:
        print(" | ".join(f"{v:>14.3f}" if isinstance(v, float) else f"{v:>14}" for v in r.values()))
    base = float(reports[0]["steps_per_hour"])
    print(f"server / colocate steps per hour: {float(reports[1]['steps_per_hour']) / base:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
