"""Same seeds, same results: digests of tiny-model CLI runs, to compare two versions of the code.

A refactoring of the trainer must not change what it computes. This script runs ``grpo train`` on
a tiny random model (``grpo_train.models.loading.build_tiny_model``, seed 0) with the hf engine
and fixed seeds, in four configurations, and prints one digest per run of

- the metrics (``metrics.jsonl`` without the keys that depend on wall time or memory),
- the logged samples (``samples.jsonl``, every step),
- the final weights and the trainer state (optimizer, scheduler, RNG, sampler, baselines) of the
  last checkpoint, tensor by tensor.

Run it on the old code and on the new code (each in its own checkout and environment) and compare
the printed lines; equal digests mean bit-identical metrics, samples and weights::

    python benchmarks/refactor_check.py > before.txt     # on the old code
    python benchmarks/refactor_check.py > after.txt      # on the new code
    diff before.txt after.txt

The runs (about a minute each on 2 CPU cores):

- ``defaults``: every algorithm default (dynamic sampling and curriculum ``auto``, DAPO loss,
  group scaling) on the digit task below, where a random policy earns some reward;
- ``defaults-arithmetic``: the defaults on ``math/arithmetic-v0``, where the tiny model earns
  nothing: the learning-signal guard fires and the automatic curriculum switches stage;
- ``beta-mu2-dynamic-micro``: KL (beta 0.1), two updates per batch, dynamic sampling on and
  micro-batches of 32 tokens (several per group);
- ``lora-kl``: LoRA rank 4 with KL (beta 0.1);
- ``rloo`` and ``ema-batch-std``: the other advantage estimators (leave-one-out; a running
  baseline per prompt with batch-std scaling).

``--keep DIR`` leaves the run folders there for a closer look at a difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import datasets

from grpo_envs.base import Environment
from grpo_envs.registration import register, registry
from grpo_envs.types import Component, Outcome, Sample, Score

DIGIT_ENV_ID = "check/digit-v0"
#: Metric keys that measure the machine, not the computation.
TIMING_KEYS = ("time/", "tokens_per_s", "throughput/", "memory/")

_COMMON = (
    "--engine hf --num_generations 4 --prompts_per_step 4 --max_prompt_length 64 "
    "--max_completion_length 6 --learning_rate 1e-2 --eval_size 4 --save_every 0 "
    "--log_every_samples 1 --progress false --seed 3 --dtype float32 --overwrite"
)
COMMON = _COMMON.split()
DIGITS = f"--env refactor_check:{DIGIT_ENV_ID}"
RUNS: dict[str, list[str]] = {
    name: argv.split()
    for name, argv in {
        "defaults": f"{DIGITS} --max_steps 4",
        "defaults-arithmetic": "--env math/arithmetic-v0 --max_steps 6",
        "beta-mu2-dynamic-micro": f"{DIGITS} --max_steps 3 --beta 0.1 --mu 2 "
        "--dynamic_sampling on --micro_batch_tokens 32",
        "lora-kl": f"{DIGITS} --max_steps 3 --lora_r 4 --lora_alpha 8 --beta 0.1",
        "rloo": f"{DIGITS} --max_steps 3 --advantage_estimator rloo",
        "ema-batch-std": f"{DIGITS} --max_steps 3 --advantage_estimator ema "
        "--scale_rewards batch --dynamic_sampling off",
    }.items()
}


class DigitEnv(Environment):
    """'Say a digit': reward 1 when the completion's first non-space character is a digit.

    A few percent of the tiny tokenizer's tokens start with a digit, so a random policy earns the
    reward now and then: groups have a learning signal and the weights move.
    """

    score_workers = 0  # in-process scoring: this scorer cannot hang

    def dataset(self, split: str = "train") -> datasets.Dataset:
        """64 training prompts, 16 held-out ones."""
        offset, size = (0, 64) if split == "train" else (10_000, 16)
        rows = [
            Sample(id=f"{split}-{i}", prompt=(), answer="7", env_id=DIGIT_ENV_ID).to_row()
            | {"prompt": [{"role": "user", "content": f"Question {offset + i}: say a digit."}]}
            for i in range(size)
        ]
        return datasets.Dataset.from_list(rows)

    def score(self, completion: str, sample: Sample | Mapping[str, object]) -> Score:
        """1 for a leading digit, else 0."""
        text = completion.lstrip()
        ok = bool(text) and text[0].isdigit()
        return Score(
            reward=1.0 if ok else 0.0,
            outcome=Outcome.CORRECT if ok else Outcome.WRONG,
            components=(Component("digit", 1.0 if ok else 0.0),),
        )


if DIGIT_ENV_ID not in registry:
    register(DIGIT_ENV_ID, DigitEnv, description="say a digit (refactor check)")


def _sha(parts: Iterator[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()[:16]


def metrics_digest(run_dir: Path) -> str:
    """Digest of metrics.jsonl without the timing and memory keys (rows and keys in order)."""

    def rows() -> Iterator[bytes]:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            kept = {k: v for k, v in row.items() if not any(t in k for t in TIMING_KEYS)}
            yield json.dumps(kept, sort_keys=False).encode()

    return _sha(rows())


def samples_digest(run_dir: Path) -> str:
    """Digest of samples.jsonl (prompts, completions, rewards, advantages of every logged step)."""
    path = run_dir / "samples.jsonl"
    return _sha(iter([path.read_bytes() if path.exists() else b""]))


def _tensor_parts(name: str, value: object) -> Iterator[bytes]:
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous().reshape(-1)
        yield f"{name}:{value.dtype}:{tuple(value.shape)}".encode()
        yield tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from _tensor_parts(f"{name}.{key}", value[key])
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _tensor_parts(f"{name}[{i}]", item)
    else:
        yield f"{name}={value!r}".encode()


def weights_digest(run_dir: Path) -> tuple[str, str]:
    """Digests of the last checkpoint's weights (every safetensors file) and trainer state."""
    import torch
    from safetensors.torch import load_file

    last = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    files = sorted(last.rglob("*.safetensors"))
    weights = _sha(
        part
        for path in files
        for name, tensor in sorted(load_file(path).items())
        for part in _tensor_parts(f"{path.relative_to(last)}/{name}", tensor)
    )
    state = torch.load(last / "trainer_state.pt", weights_only=False)
    return weights, _sha(_tensor_parts("state", state))


def run_one(name: str, argv: Sequence[str], model: Path, out: Path) -> str:
    """Run ``grpo train`` once and return its digest line."""
    grpo = str(Path(sys.executable).with_name("grpo"))
    run_dir = out / name
    here = str(Path(__file__).resolve().parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",  # one summation order: float results independent of the load
    }
    cmd = [grpo, "train", "--model", str(model), *COMMON, *argv, "--output_dir", str(run_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: grpo train failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    weights, state = weights_digest(run_dir)
    return (
        f"{name:24s} metrics={metrics_digest(run_dir)} samples={samples_digest(run_dir)} "
        f"weights={weights} state={state}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print one digest line per run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="*", choices=sorted(RUNS), default=list(RUNS))
    parser.add_argument("--keep", type=Path, help="keep the run folders in this directory")
    args = parser.parse_args(argv)
    from grpo_train.models.loading import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        model = build_tiny_model(Path(tmp) / "tiny", seed=0)
        for name in args.runs:
            print(run_one(name, RUNS[name], model, out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
