"""``vllm_mode: server``: ``grpo serve`` replicas in processes of their own, on the tiny model.

One ``grpo serve --data_parallel_size 2`` for the module (each replica's start costs about a
minute on a loaded 2-core machine); tests that use one replica talk to the first. The test that
kills the server runs last.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rollout_checks import PROMPTS, max_logprob_gap
from toy_env import DigitEnv

from grpo_train.config import TrainConfig
from grpo_train.learner.weight_export import sync_rollout_weights
from grpo_train.rollout.base import EngineDied, SamplingConfig
from grpo_train.rollout.weight_channel import free_port
from grpo_train.run.checkpoint import checkpoint_path, latest_checkpoint
from grpo_train.run.run_log import read_metrics
from grpo_train.run.stop import PAUSE_AT_ENV, PAUSE_FILE_ENV
from grpo_train.trainer import Trainer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BIN = Path(sys.executable).parent
#: The colocated engine's context in these runs (max_prompt_length + max_completion_length):
#: the server is started with the same, so both engines schedule the same batches.
MAX_MODEL_LEN = 68
#: Metrics that depend on wall time or memory, or that only server mode reports.
NON_DETERMINISTIC = ("time/", "tokens_per_s", "throughput/", "memory/", "sync/")


@pytest.fixture(scope="module")
def servers(tiny_model_path: Path) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Two replicas of ``grpo serve`` on the tiny model: the process and the replicas' URLs."""
    pytest.importorskip("vllm")
    port = free_port()
    command = [
        str(BIN / "grpo"), "serve", "--model", str(tiny_model_path), "--port", str(port),
        "--host", "127.0.0.1", "--data_parallel_size", "2", "--dtype", "float32",
        "--max_model_len", str(MAX_MODEL_LEN), "--cpu_kv_cache_gib", "0.25",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(command, env=env, text=True, start_new_session=True)
    urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    try:
        for url in urls:
            _wait_ready(proc, url)
        yield proc, urls
    finally:
        end_server(proc)


def end_server(proc: subprocess.Popen[str]) -> None:
    """End a ``grpo serve`` started in its own session: SIGTERM to its group, SIGKILL after 60 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _alive(pids: set[int]) -> list[str]:
    """Processes still alive among ``pids`` (not zombies): 'pid name' each."""
    import psutil

    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {p.name()}")
    return alive


def _wait_ready(proc: subprocess.Popen[str], url: str, limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"grpo serve ended with {proc.returncode}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as reply:
                json.loads(reply.read())
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url} not ready within {limit_s} s")


def make_config(model_path: Path, out: Path, **overrides: object) -> TrainConfig:
    values: dict[str, object] = {
        "model": str(model_path), "engine": "vllm", "num_generations": 8,
        "prompts_per_step": 4, "max_prompt_length": 64, "max_completion_length": 4,
        "learning_rate": 1e-2, "max_steps": 3, "output_dir": str(out), "eval_size": 8,
        "save_every": 0, "progress": False, "log_every_samples": 1, "seed": 3,
        "vllm_cpu_kv_cache_gib": 0.25,
        "vllm_dtype": "float32",  # colocated as the float32 replicas: bit-identical samples
    }  # fmt: skip
    values.update(overrides)
    return TrainConfig.from_flat(values)


def _train(config: TrainConfig) -> tuple[list[dict[str, float]], list[str], torch.Tensor]:
    """Run ``config``: its deterministic metrics, its sample lines and a weight fingerprint."""
    trainer = Trainer(config, env=DigitEnv())
    try:
        trainer.train()
        weights = torch.cat([p.detach().reshape(-1) for p in trainer.setup.model.parameters()])
    finally:
        trainer.close()
    out = Path(config.run.output_dir)
    rows = [
        {k: v for k, v in row.items() if not k.startswith(NON_DETERMINISTIC)}
        for row in read_metrics(out)
    ]
    samples = [
        json.dumps({k: v for k, v in json.loads(line).items() if not k.startswith("time")})
        for line in (out / "samples.jsonl").read_text().splitlines()
    ]
    return rows, samples, weights


def test_a_sync_moves_the_servers_logprobs_to_the_trainers_and_checks_the_version(
    servers, tiny_model_path
):
    from grpo_train.models.loading import load_policy
    from grpo_train.rollout.server_engine import ServerEngine

    _, urls = servers
    model = load_policy(str(tiny_model_path))[0]
    engine = ServerEngine(urls[:1], timeout_s=120)
    other = None
    try:
        sync_rollout_weights(engine, model)
        sampling = SamplingConfig(n=4, max_new_tokens=4, temperature=0.8, seed=0)
        before = engine.generate(PROMPTS, sampling)
        assert max_logprob_gap(model, before, PROMPTS, 0.8) < 1e-4
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        assert max_logprob_gap(model, before, PROMPTS, 0.8) > 1e-2  # the change is visible
        sync_rollout_weights(engine, model)
        assert engine.version == 2
        # Every tensor in one buffer of the engine's dtype (float32 here).
        assert engine.last_sync_bytes == 4 * sum(p.numel() for p in model.parameters())
        after = engine.generate(PROMPTS, sampling)
        assert max_logprob_gap(model, after, PROMPTS, 0.8) < 1e-4
        # Another trainer takes the server over: the first one's next request says so.
        other = ServerEngine(urls[:1], timeout_s=120)
        sync_rollout_weights(other, model)
        sync_rollout_weights(other, model)
        sync_rollout_weights(other, model)
        stale = "serves weights version 3, the trainer sent version 2"
        with pytest.raises(EngineDied, match=stale):
            engine.generate(PROMPTS, sampling)
    finally:
        engine.close()
        if other is not None:
            other.close()


def test_server_mode_trains_exactly_as_colocate_mode(servers, tiny_model_path, tmp_path):
    # One replica runs the colocated engine's own calls (same prompts, seeds, batches, float32
    # weights loaded from the same tensors), so "same" is bit-identical here: every sampled
    # token, logprob, reward, loss and the trained weights.
    _, urls = servers
    colocate = _train(make_config(tiny_model_path, tmp_path / "colocate"))
    served = _train(
        make_config(
            tiny_model_path, tmp_path / "server", vllm_mode="server", vllm_server_urls=urls[0]
        )
    )
    assert served[0] == colocate[0]
    assert served[1] == colocate[1]
    assert torch.equal(served[2], colocate[2])
    steps = [r for r in read_metrics(tmp_path / "server") if "time/step" in r]
    assert len(steps) == 3 and all(r["sync/bytes"] > 0 for r in steps)
    assert [r["sync/version"] for r in steps] == [2.0, 3.0, 4.0]  # 1: the sync at connection


def test_two_replicas_share_the_prompts_and_sample_what_one_does(
    servers, tiny_model_path, tmp_path
):
    from grpo_train.models.loading import load_policy
    from grpo_train.rollout.server_engine import ServerEngine

    _, urls = servers
    model = load_policy(str(tiny_model_path))[0]
    one, two = ServerEngine(urls[:1], timeout_s=120), ServerEngine(urls, timeout_s=120)
    try:
        for engine in (one, two):
            sync_rollout_weights(engine, model)
        sampling = SamplingConfig(n=4, max_new_tokens=4, temperature=0.8, seed=7)
        a, b = one.generate(PROMPTS, sampling), two.generate(PROMPTS, sampling)
    finally:
        one.close()
        two.close()
    # Each prompt keeps its seed whichever replica samples it; only the batch each forward
    # runs on differs (CPU kernels may round differently), so tokens match and logprobs agree
    # to float tolerance.
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    for ga, gb in zip(a, b):
        for ca, cb in zip(ga, gb):
            torch.testing.assert_close(
                torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-5, rtol=0
            )
    assert [c.prompt_index for g in b for c in g] == [i for i in range(3) for _ in range(4)]


def _run_cli(config: TrainConfig, env: dict[str, str]) -> subprocess.Popen[str]:
    out = Path(config.run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(config.to_yaml())
    return subprocess.Popen(
        [str(BIN / "grpo"), "train", "--config", str(path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _one_failure_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    output, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-6000:]
    lines = [line for line in output.splitlines() if line.startswith("grpo train:")][1:]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


def _paused_run(tiny_model_path: Path, tmp_path: Path, url: str, **overrides: object):
    marker = tmp_path / "pause"
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", PAUSE_AT_ENV: "generation@2",
        PAUSE_FILE_ENV: str(marker),
    }  # fmt: skip
    config = make_config(
        tiny_model_path, tmp_path / "run", vllm_mode="server", vllm_server_urls=url,
        max_steps=4, save_every=1, eval_size=0, env="math/add2-v0", **overrides,
    )  # fmt: skip
    proc = _run_cli(config, env)
    while not Path(f"{marker}.0").exists():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    return proc, Path(f"{marker}.0"), tmp_path / "run"


def test_a_stalled_server_ends_the_run_with_one_line_and_its_checkpoint(
    servers, tiny_model_path, tmp_path
):
    server, urls = servers
    proc, marker, out = _paused_run(tiny_model_path, tmp_path, urls[0], vllm_server_timeout_s=10)
    replica = _replica_pid(server, urls[0])
    os.kill(replica, signal.SIGSTOP)
    try:
        marker.unlink()  # step 2 asks the stopped server to generate
        line = _one_failure_line(proc, 240)
    finally:
        os.kill(replica, signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert line.startswith("grpo train: aborted: the rollout engine died during generate")
    assert f"the server {urls[0]} did not answer /generate within 10 s" in line
    ckpt = checkpoint_path(out, 1)
    assert f"last checkpoint {ckpt}; resume with" in line
    assert latest_checkpoint(out) == ckpt


def test_a_killed_server_ends_the_run_with_one_line_and_its_checkpoint(
    servers, tiny_model_path, tmp_path
):
    # Last in the module: the killed replica's parent stops the other one too.
    import psutil

    server, urls = servers
    proc, marker, out = _paused_run(tiny_model_path, tmp_path, urls[0])
    from grpo_train.rollout.processes import mapped_shm

    tree = {p.pid for p in psutil.Process(server.pid).children(recursive=True)}
    segments = set().union(*(mapped_shm(pid) for pid in tree))
    assert segments, "the replicas' engines share memory through /dev/shm"
    try:
        os.kill(_replica_pid(server, urls[0]), signal.SIGKILL)
        marker.unlink()
        line = _one_failure_line(proc, 240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert line.startswith("grpo train: aborted: the rollout engine died during generate")
    assert f"the server {urls[0]} is unreachable" in line
    assert f"last checkpoint {checkpoint_path(out, 1)}; resume with" in line
    assert server.wait(timeout=60) != 0  # grpo serve ends when a replica dies
    # ...and leaves none of its replicas' processes behind (the killed one's engine included).
    assert _alive(tree) == []
    # ...nor the shared memory their engines mapped (the killed replica never unlinked its own).
    assert sorted(name for name in segments if (Path("/dev/shm") / name).exists()) == []


def _replica_pid(server: subprocess.Popen[str], url: str) -> int:
    """The pid of the replica process listening at ``url`` (a child of ``grpo serve``)."""
    import psutil

    port = int(url.rsplit(":", 1)[1])
    for child in psutil.Process(server.pid).children():
        if child.cmdline()[-2:] == ["--port", str(port)]:
            return child.pid
    raise AssertionError(f"no replica process for {url}")
