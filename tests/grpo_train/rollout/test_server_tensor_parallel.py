"""``grpo serve --tensor_parallel_size 2`` on vLLM's CPU build: two worker processes, one replica.

The replica starts without ``VLLM_CPU_OMP_THREADS_BIND``: ``grpo serve`` splits the allowed
cores between the workers itself (vLLM's own binding wants one NUMA node per worker). One server
for the module; its start costs one to four minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from rollout_checks import PROMPTS, max_logprob_gap
from spool_polling import spool_peak
from test_server_mode import MAX_MODEL_LEN, _wait_ready, end_server

from grpo_train.learner.weight_export import sync_rollout_weights
from grpo_train.rollout.base import SamplingConfig
from grpo_train.rollout.serve import CPU_BIND_ENV
from grpo_train.rollout.vllm_engine import SYNC_DIR_PREFIX
from grpo_train.rollout.weight_channel import free_port

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU build's worker binding (a GPU here)"),
]


#: The replica's spool bucket (its workers' weight sync): 32 KiB, the tiny model is ~2 MiB.
SPOOL_BUCKET_MB = 1 / 32


@dataclass(frozen=True)
class TPServer:
    url: str
    pid: int
    """The replica's process, which owns the spool folder its workers read a sync from."""


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop(CPU_BIND_ENV, None)  # grpo serve's own binding is under test
    return env


def _serve(model: Path, port: int, tensor_parallel_size: int) -> list[str]:
    return [
        sys.executable, "-m", "grpo_train.rollout.serve", "--model", str(model),
        "--port", str(port), "--host", "127.0.0.1",
        "--tensor_parallel_size", str(tensor_parallel_size),
        "--dtype", "float32", "--max_model_len", str(MAX_MODEL_LEN), "--cpu_kv_cache_gib", "0.25",
        "--sync_bucket_mb", str(SPOOL_BUCKET_MB),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def tp_server(tiny_model_path: Path) -> Iterator[TPServer]:
    """One ``grpo serve --tensor_parallel_size 2`` replica on the tiny model."""
    pytest.importorskip("vllm")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two tensor-parallel workers need two cores")
    port = free_port()
    proc = subprocess.Popen(
        _serve(tiny_model_path, port, 2), env=_env(), text=True, start_new_session=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(proc, url)  # type: ignore[arg-type]
        yield TPServer(url, proc.pid)
    finally:
        end_server(proc)


def test_tp2_server_samples_a_tp1_engines_tokens_and_syncs_to_the_trainers_logprobs(
    tp_server, tiny_model_path
):
    from grpo_train.models.loading import load_policy
    from grpo_train.rollout.server_engine import ServerEngine
    from grpo_train.rollout.vllm_engine import VLLMEngine

    model = load_policy(str(tiny_model_path))[0]
    server = ServerEngine([tp_server.url], timeout_s=300)
    one = VLLMEngine(
        tiny_model_path, dtype="float32", max_model_len=MAX_MODEL_LEN, cpu_kv_cache_gib=0.25,
        in_process=True,
    )  # fmt: skip
    sampling = SamplingConfig(n=4, max_new_tokens=4, temperature=0.8, seed=0)

    def tokens(groups):
        return [[c.token_ids for c in group] for group in groups]

    try:
        sync_rollout_weights(server, model)
        before = server.generate(PROMPTS, sampling)
        assert max_logprob_gap(model, before, PROMPTS, 0.8) < 1e-4
        # Same seeds, same weights: the sharded engine samples what one process does (a
        # sharded layer sums two partial products, so logprobs may move in float32's last
        # digits; the tokens of the tiny model do not).
        assert tokens(before) == tokens(one.generate(PROMPTS, sampling))
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        assert max_logprob_gap(model, before, PROMPTS, 0.8) > 1e-2  # the change is visible
        # Both workers reload their shard from the replica's spool (VLLMEngine.workers_in_process),
        # which never holds more than two buckets (one may be the largest tensor, alone).
        state = model.state_dict()
        largest = max(t.numel() * t.element_size() for t in state.values())
        model_bytes = sum(t.numel() * t.element_size() for t in state.values())
        spool = f"{SYNC_DIR_PREFIX}{tp_server.pid}.*/*/*"
        with spool_peak(lambda: Path("/dev/shm").glob(spool)) as peak:
            sync_rollout_weights(server, model)
        assert 0 < peak[0] <= 2 * (int(SPOOL_BUCKET_MB * 2**20) + 4096) + largest < model_bytes / 4
        assert server.version == 2
        after = server.generate(PROMPTS, sampling)
        assert max_logprob_gap(model, after, PROMPTS, 0.8) < 1e-4
        sync_rollout_weights(one, model)
        assert tokens(after) == tokens(one.generate(PROMPTS, sampling))
        assert tokens(after) != tokens(before)
    finally:
        server.close()
        one.close()


def test_more_tp_workers_than_cores_fail_with_one_line(tiny_model_path):
    cores = len(os.sched_getaffinity(0))
    run = subprocess.run(
        _serve(tiny_model_path, free_port(), cores + 1),
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip() == (
        f"grpo serve: error: --tensor_parallel_size {cores + 1} on CPU: {cores + 1} "
        f"tensor-parallel workers need {cores + 1} cores, {cores} allowed; use "
        f"--tensor_parallel_size {cores} or less (or name each worker's cores in {CPU_BIND_ENV})"
    )


def test_a_failed_engine_core_start_prints_its_root_cause(tiny_model_path):
    # A binding the user set is kept, and vLLM's engine core refuses one list for two workers.
    # vLLM's own error says "See root cause above": the engine core's traceback must be there.
    pytest.importorskip("vllm")
    run = subprocess.run(
        _serve(tiny_model_path, free_port(), 2),
        env={**_env(), CPU_BIND_ENV: "0"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode != 0
    output = run.stdout + run.stderr
    assert "Engine core initialization failed" in output
    assert "doesn't match local world size 2" in output
