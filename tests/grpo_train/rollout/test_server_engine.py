"""The server-mode client without vLLM: its configuration, its buffer and its failures.

The failures are the real ones: a port nobody listens on, and a server that accepts the
connection and never answers (a stalled process), each within the configured timeout.
"""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time

import pytest
import torch
import torch.distributed as dist

from grpo_train.config import ConfigError, TrainConfig
from grpo_train.rollout.base import EngineDied
from grpo_train.rollout.server_address import parse_server_urls
from grpo_train.rollout.server_engine import ServerEngine
from grpo_train.rollout.weight_channel import (
    GroupAddress,
    WeightGroup,
    flatten,
    free_port,
    unflatten,
)


def _config(**values: object) -> TrainConfig:
    return TrainConfig.from_flat({"model": "m", "env": "math/add2-v0", **values})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"vllm_mode": "server"}, "vllm_server_urls: empty with vllm_mode server; start `grpo"),
        (
            {"vllm_server_urls": "http://a:1"},
            "given with vllm_mode colocate; add --vllm_mode server",
        ),
        ({"vllm_mode": "server", "vllm_server_urls": "ftp://a:1"}, "is not http://HOST:PORT"),
        ({"vllm_mode": "server", "vllm_server_urls": "http://a"}, "is not http://HOST:PORT"),
        (
            {"vllm_mode": "server", "vllm_server_urls": "a:1", "engine": "hf"},
            "engine: hf cannot run in vllm_mode server",
        ),
        (
            {"vllm_mode": "server", "vllm_server_urls": "a:1", "vllm_server_timeout_s": 0},
            "vllm_server_timeout_s: 0",
        ),
        ({"vllm_mode": "remote"}, "vllm_mode"),
    ],
)
def test_server_mode_settings_fail_at_start_with_the_fix(values, message) -> None:
    with pytest.raises(ConfigError, match=r"vllm|engine") as err:
        _config(**values)
    assert message in str(err.value)


def test_server_addresses_parse_and_a_good_config_keeps_them() -> None:
    assert parse_server_urls(" a:1 ,http://b:2/,") == ["http://a:1", "http://b:2"]
    cfg = _config(vllm_mode="server", vllm_server_urls="gen:8000")
    assert cfg.rollout.vllm_mode == "server"
    with pytest.raises(ValueError, match="no server address"):
        parse_server_urls(" , ")


def test_flatten_round_trip_casts_to_the_engines_dtype() -> None:
    state = {"w": torch.randn(3, 4), "b": torch.randn(4).double(), "e": torch.randn(2, 1, 2)}
    buffer, specs = flatten(state, torch.bfloat16)
    assert buffer.dtype == torch.bfloat16 and buffer.numel() == 12 + 4 + 4
    back = unflatten(buffer, specs)
    assert list(back) == ["w", "b", "e"]
    for name, tensor in state.items():
        assert torch.equal(back[name], tensor.to(torch.bfloat16))
    with pytest.raises(ValueError, match="layout says"):
        unflatten(buffer[:-1], specs)


def _receive(port: int, numel: int, queue: multiprocessing.Queue) -> None:
    address = GroupAddress("127.0.0.1", port, 3, "gloo", 30.0)
    buffer = torch.zeros(numel)
    WeightGroup(address, int(queue.get())).broadcast(buffer)
    queue.put(buffer.tolist())


def test_one_broadcast_reaches_every_replica() -> None:
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    queues = [ctx.Queue(), ctx.Queue()]
    procs = [ctx.Process(target=_receive, args=(port, 5, q)) for q in queues]
    for rank, (proc, queue) in enumerate(zip(procs, queues), start=1):
        proc.start()
        queue.put(rank)
    group = WeightGroup(GroupAddress("127.0.0.1", port, 3, "gloo", 30.0), 0)
    group.broadcast(torch.arange(5.0))
    time.sleep(0.5)
    assert [q.get(timeout=60) for q in queues] == [[0.0, 1.0, 2.0, 3.0, 4.0]] * 2
    for proc in procs:
        proc.join(timeout=30)


def test_a_missing_replica_is_a_timeout_not_a_hang() -> None:
    start = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)timed? ?out|timeout"):
        WeightGroup(GroupAddress("127.0.0.1", free_port(), 2, "gloo", 2.0), 0).broadcast(
            torch.zeros(1)
        )
    assert time.monotonic() - start < 30  # the group's timeout, not torch's 30 minutes


def test_a_server_nobody_runs_is_unreachable_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(EngineDied, match=r"the server http://127\.0\.0\.1:\d+ is unreachable"):
        ServerEngine([f"http://127.0.0.1:{free_port()}"], timeout_s=30)
    # A refused connection is an answer: no waiting out the request timeout, no retries.
    assert time.monotonic() - start < 5


def test_a_server_that_never_answers_times_out_with_its_address() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(EngineDied, match=r"did not answer /health within 1 s") as err:
            ServerEngine([f"http://127.0.0.1:{port}"], timeout_s=1.0)
        assert err.value.what == "connect"
        assert time.monotonic() - start < 10
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


def test_dist_is_left_uninitialised_by_the_weight_group() -> None:
    # The trainer's own process group (accelerate's) and vLLM's are untouched by ours.
    assert not dist.is_initialized()


# ------------------------------------------------------------------ bucketed sync, real replicas


class RecordingEngine:
    """A replica's engine that keeps what it loads (the real ``ReplicaState`` serves it).

    ``fail`` after ``after`` tensors: ``die`` ends the process mid-sync, ``stall`` stops
    consuming (a hung loader). Each sync's tensors and the bytes of the largest buffer behind
    them (the bucket the channel allocated) go to ``out``.
    """

    dtype = torch.float32
    vocab_size = 8
    max_model_len = 16

    def __init__(self, out: str, fail: str = "", after: int = 0) -> None:
        self.out, self.fail, self.after = out, fail, after

    def generate(self, prompt_token_ids, sampling):
        raise AssertionError("these tests only sync")

    def sync_weight_stream(self, tensors) -> None:
        import os

        got, largest = {}, 0
        for index, (name, tensor) in enumerate(tensors):
            if self.fail and index == self.after:
                if self.fail == "die":
                    os._exit(3)
                time.sleep(3600)
            largest = max(largest, tensor.untyped_storage().nbytes())
            got[name] = tensor.clone()
        torch.save({"tensors": got, "largest": largest}, self.out)


def _replica(port: int, out: str, fail: str, after: int) -> None:
    from http.server import ThreadingHTTPServer

    from grpo_train.rollout.serve import ReplicaState, _handler

    state = ReplicaState(RecordingEngine(out, fail, after), "recording")
    ThreadingHTTPServer(("127.0.0.1", port), _handler(state)).serve_forever(poll_interval=0.1)


@pytest.fixture
def replicas(tmp_path):
    """Start recording replicas: ``start([(fail, after), ...])`` -> their URLs and out files."""
    ctx = multiprocessing.get_context("spawn")
    procs: list = []

    def start(kinds: list[tuple[str, int]]) -> tuple[list[str], list[str]]:
        urls, outs = [], []
        for i, (fail, after) in enumerate(kinds):
            port, out = free_port(), str(tmp_path / f"replica{i}.pt")
            procs.append(ctx.Process(target=_replica, args=(port, out, fail, after), daemon=True))
            procs[-1].start()
            urls.append(f"http://127.0.0.1:{port}")
            outs.append(out)
        deadline = time.monotonic() + 60
        for url in urls:
            while True:
                try:
                    ServerEngine([url], timeout_s=5).close()
                    break
                except EngineDied:
                    assert time.monotonic() < deadline, f"{url} did not start"
                    time.sleep(0.2)
        return urls, outs

    yield start
    for proc in procs:
        proc.kill()
        proc.join(timeout=10)


def _many_tensor_model() -> torch.nn.Module:
    """40 tensors of 1-4 KiB (about 84 KiB): many 8 KiB buckets."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(20)])


BUCKET_MB = 8 / 1024  # 8 KiB


@pytest.mark.parametrize("bucket_mb", [BUCKET_MB, 1 / 1024, 100.0])
def test_a_bucketed_sync_loads_the_exported_tensors_bit_for_bit_in_bounded_buffers(
    replicas, bucket_mb
) -> None:
    from grpo_train.learner.weight_export import export_state_dict, sync_rollout_weights

    urls, outs = replicas([("", 0), ("", 0)])
    model = _many_tensor_model()
    engine = ServerEngine(urls, timeout_s=60, sync_timeout_s=20, bucket_mb=bucket_mb)
    try:
        sent = sync_rollout_weights(engine, model)
        assert engine.sync_metrics()["sync/version"] == 1.0
    finally:
        engine.close()
    expected = export_state_dict(model)  # what the full-buffer sync sent
    model_bytes = sum(t.numel() * t.element_size() for t in expected.values())
    largest_tensor = max(t.numel() * t.element_size() for t in expected.values())
    bound = max(int(bucket_mb * 2**20), largest_tensor)
    assert sent == model_bytes
    stats = engine.last_sync_stats
    assert stats is not None and stats.bytes == model_bytes
    assert stats.largest_bucket_bytes <= bound
    if bound < model_bytes:
        assert stats.buckets >= model_bytes // bound  # the model really went in many pieces
    for out in outs:
        got = torch.load(out)
        assert list(got["tensors"]) == list(expected)
        for name, tensor in expected.items():
            assert torch.equal(got["tensors"][name], tensor), name
        # The replica's largest buffer is a bucket, not the model.
        assert got["largest"] <= bound


@pytest.mark.parametrize("fail", ["die", "stall"])
def test_a_replica_that_dies_or_stalls_mid_sync_ends_the_sync_naming_it_in_seconds(
    replicas, fail
) -> None:
    from grpo_train.learner.weight_export import sync_rollout_weights

    urls, _ = replicas([("", 0), (fail, 5)])
    model = _many_tensor_model()
    engine = ServerEngine(urls, timeout_s=600, sync_timeout_s=3, bucket_mb=BUCKET_MB)
    start = time.monotonic()
    try:
        with pytest.raises(EngineDied) as err:
            sync_rollout_weights(engine, model)
    finally:
        engine.close()
    assert time.monotonic() - start < 30  # the sync timeout, not the 600 s request timeout
    assert err.value.what == "weight sync"
    assert urls[1] in str(err.value) and urls[0] not in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bucket_mb", [0, -1, float("inf"), float("nan")])
def test_a_bucket_size_that_cannot_work_is_refused_with_the_fix(bucket_mb) -> None:
    with pytest.raises(ValueError, match=r"must be > 0 \(e\.g\. 256\)"):
        ServerEngine(["http://127.0.0.1:1"], bucket_mb=bucket_mb)
    with pytest.raises(ConfigError, match="vllm_sync_bucket_mb"):
        _config(vllm_mode="server", vllm_server_urls="a:1", vllm_sync_bucket_mb=bucket_mb)


# ------------------------------------------------------------------ generation, real replicas


class DelayedEngine(RecordingEngine):
    """A replica's engine that answers ``/generate`` after ``delay_s``: prompt ids as text."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(out="")
        self.delay_s = delay_s

    def generate(self, prompt_token_ids, sampling):
        from grpo_train.rollout.base import Completion

        time.sleep(self.delay_s)
        return [
            [Completion(i, f"{list(ids)}/{j}", (1,), (-0.1,), "stop") for j in range(sampling.n)]
            for i, ids in enumerate(prompt_token_ids)
        ]


def _delayed_replica(port: int, delay_s: float) -> None:
    from http.server import ThreadingHTTPServer

    from grpo_train.rollout.serve import ReplicaState, _handler

    state = ReplicaState(DelayedEngine(delay_s), "delayed")
    ThreadingHTTPServer(("127.0.0.1", port), _handler(state)).serve_forever(poll_interval=0.1)


def test_each_replicas_share_is_reported_as_soon_as_it_answers() -> None:
    from grpo_train.rollout.base import SamplingConfig

    ctx = multiprocessing.get_context("spawn")
    ports = [free_port(), free_port()]
    procs = [
        ctx.Process(target=_delayed_replica, args=(port, delay), daemon=True)
        for port, delay in zip(ports, (0.0, 1.5))
    ]
    for proc in procs:
        proc.start()
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        deadline = time.monotonic() + 60
        while True:
            try:
                engine = ServerEngine(urls, timeout_s=30)
                break
            except EngineDied:
                assert time.monotonic() < deadline, "the replicas did not start"
                time.sleep(0.2)
        prompts = [[1, 2], [3], [4, 5, 6], [7], [2, 2]]
        reported: list[tuple[int, float]] = []
        t = time.perf_counter()
        groups = engine.generate(
            prompts,
            SamplingConfig(n=2, max_new_tokens=4, seed=0),
            lambda i, group: reported.append((i, time.perf_counter() - t)) or None,
        )
        total = time.perf_counter() - t
        engine.close()
    finally:
        for proc in procs:
            proc.kill()
            proc.join(timeout=10)
    assert [g[0].text for g in groups] == [f"{p}/0" for p in prompts]
    assert sorted(i for i, _ in reported) == list(range(len(prompts)))  # once each
    # The fast replica's share (prompts 0-2) came before the slow one answered.
    fast = [at for i, at in reported if i < 3]
    assert max(fast) < 1.0 < total, (reported, total)
