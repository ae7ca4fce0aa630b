"""vLLM tensor parallelism in colocate mode: 2 CPU ranks sharing one engine train as one process.

``grpo train --vllm_tensor_parallel_size 2`` on 2 gloo ranks runs one vLLM engine sharded over
both ranks (vLLM's ``external_launcher``); both ranks generate the step's prompts in the same
calls and each keeps its own share. Compared with the single-process run (one whole engine) of
the same seed: the same tokens (rewards, lengths, logged samples, greedy evaluation) and, after
each weight sync, engine logprobs that match the trainer's (``is_ratio_*``: the sampled
token's probability under the trainer over the engine's).

Tolerance: a sharded layer sums its output from two partial products joined by an all-reduce,
another float32 summation order than the whole layer's, so logprobs may differ in the last
digits; measured on this model: every sampled token's |log(trainer / engine)| <= 1e-6 after
the sync, the same tokens, grad norms equal to 1e-7. ``LOGPROB_TOL`` leaves room for other CPUs'
kernels; a token flips only if a uniform draw lands within that sliver of a boundary.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_train.rollout.weight_channel import free_port

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

#: |log(trainer prob / engine prob)| of every sampled token after a weight sync.
LOGPROB_TOL = 1e-4


def _args(model: Path, out: Path) -> list[str]:
    return [
        "grpo", "train", "--model", str(model), "--env", "test/digit-v0", "--engine", "vllm",
        "--max_steps", "2", "--num_generations", "4", "--prompts_per_step", "4",
        "--max_prompt_length", "64", "--max_completion_length", "6", "--eval_size", "2",
        "--eval_every", "0", "--save_every", "0", "--learning_rate", "5e-3", "--seed", "1",
        "--progress", "false", "--log_every_samples", "1", "--num_threads", "1",
        "--vllm_cpu_kv_cache_gib", "0.25", "--output_dir", str(out),
        "--vllm_dtype", "float32",  # the engine's logprobs within LOGPROB_TOL of the trainer's
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2-rank TP=2 run and the single-process run, side by side (``two``, ``one``)."""
    root = tmp_path_factory.mktemp("tp")
    here = str(Path(__file__))
    env = {
        **os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING",
    }  # fmt: skip
    launch = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
        "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), here,
    ]  # fmt: skip
    two = subprocess.Popen(
        [*launch, *_args(tiny_model_path, root / "two"), "--vllm_tensor_parallel_size", "2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    one = subprocess.Popen(
        # The reference's engine core in the trainer's process: quicker to start, same samples.
        [sys.executable, here, *_args(tiny_model_path, root / "one"), "--vllm_in_process", "true"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        outs = [p.communicate(timeout=540)[0] for p in (two, one)]
    finally:
        for p in (two, one):
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, out in zip((two, one), outs):
        assert p.returncode == 0, out[-6000:]
    return root


def _rows(run: Path) -> list[dict[str, float]]:
    from grpo_train.run.run_log import read_metrics

    return read_metrics(run)


def _samples(run: Path) -> list[tuple[int, str, float]]:
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    return [(r["step"], r["completion"], r["reward"]) for r in rows]


def test_tp2_engine_generates_what_one_engine_does(runs: Path) -> None:
    two, one = _rows(runs / "two"), _rows(runs / "one")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [0, 1, 2]
    assert two[0]["eval/accuracy"] == one[0]["eval/accuracy"]  # greedy, main's engine group
    assert two[-1]["eval/accuracy"] == one[-1]["eval/accuracy"]
    for a, b in zip(two[1:], one[1:], strict=True):
        # The same sampled tokens: the same rewards and lengths over the whole step.
        assert a["reward/mean"] == b["reward/mean"] and a["length/mean"] == b["length/mean"]
        assert a["group/frac_zero_std"] == b["group/frac_zero_std"]
    assert _samples(runs / "two") == _samples(runs / "one")


def test_tp2_training_and_weight_sync(runs: Path) -> None:
    two, one = _rows(runs / "two"), _rows(runs / "one")
    assert two[1]["grad_norm"] > 0  # the update moved the weights: the sync carried news
    assert two[-1]["dist/max_rank_diff"] == 0.0  # DDP unchanged under the shared engine
    for a, b in zip(two[1:], one[1:], strict=True):
        # Step 2 generated with the synced weights: each rank's shard reloaded its slice.
        for row in (a, b):
            assert abs(math.log(row["is_ratio_min"])) < LOGPROB_TOL, row
            assert abs(math.log(row["is_ratio_max"])) < LOGPROB_TOL, row
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-3)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-2)


if __name__ == "__main__" and sys.argv[1:2] == ["grpo"]:  # a rank: the CLI with the toy env
    sys.path.insert(0, str(Path(__file__).parents[1]))
    import grpo_envs
    from grpo_train.cli import main

    grpo_envs.register("test/digit-v0", "toy_env:DigitEnv")
    raise SystemExit(main(sys.argv[2:]))
