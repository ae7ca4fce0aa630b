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
from grpo_train.rollout.server_engine import ServerEngine
from grpo_train.rollout.weight_channel import (
    GroupAddress,
    WeightGroup,
    flatten,
    free_port,
    unflatten,
)
from grpo_train.server_address import parse_server_urls


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
    with pytest.raises(EngineDied, match=r"the server http://127\.0\.0\.1:\d+ is unreachable"):
        ServerEngine([f"http://127.0.0.1:{free_port()}"], timeout_s=5)


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
