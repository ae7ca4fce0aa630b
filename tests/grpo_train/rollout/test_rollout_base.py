"""The engine contract's sleep protocol: an engine sleeps during the update only when it can."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import TypeVar

import pytest
import torch

from grpo_train.rollout.base import engine_asleep

T = TypeVar("T")


class _SleepyEngine:
    """An engine whose ``sleep`` says whether it slept, recording the calls."""

    def __init__(self, can_sleep: bool) -> None:
        self.can_sleep, self.calls = can_sleep, []  # type: ignore[var-annotated]

    def sleep(self, level: int = 1) -> bool:
        self.calls.append(f"sleep{level}")
        return self.can_sleep

    def wake_up(self, tags: tuple[str, ...] | None = None) -> None:
        self.calls.append(f"wake{list(tags) if tags else ''}")


def test_engine_asleep_wakes_only_what_slept_even_when_the_update_fails() -> None:
    awake = _SleepyEngine(can_sleep=False)
    with engine_asleep(awake) as slept:  # type: ignore[arg-type]
        assert slept is False
    assert awake.calls == ["sleep1"]  # asked, refused, never woken
    engine = _SleepyEngine(can_sleep=True)
    with engine_asleep(engine, level=2) as slept:  # type: ignore[arg-type]
        assert slept is True and engine.calls == ["sleep2"]
    assert engine.calls == ["sleep2", "wake['weights']"]  # the weights, for the sync to load
    with pytest.raises(RuntimeError, match="update failed"), engine_asleep(engine):  # type: ignore[arg-type]
        raise RuntimeError("update failed")
    assert engine.calls[-2:] == ["sleep1", "wake['weights']"]  # woken even when the update raised


def test_vllm_engine_sleeps_only_on_cuda_with_sleep_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from grpo_train.rollout.hf import HFEngine
    from grpo_train.rollout.vllm_engine import VLLMEngine

    calls: list[str] = []
    model_config = SimpleNamespace(enable_sleep_mode=True)

    class FakeLLM:
        llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(model_config=model_config))

        def sleep(self, level: int = 1) -> None:
            calls.append(f"sleep{level}")

        def wake_up(self, tags: list[str] | None = None) -> None:
            calls.append(f"wake{tags}")

    engine = object.__new__(VLLMEngine)  # the sleep logic only; no vLLM process behind it
    engine.llm, engine.on_cpu, engine.asleep = FakeLLM(), False, frozenset()  # type: ignore[assignment]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with engine_asleep(engine, level=2) as slept:
        assert slept is True and calls == ["sleep2"]
    assert calls == ["sleep2", "wake['weights']"]
    assert engine.asleep == {"kv_cache"}  # freed until the weights are loaded
    engine.wake_up(["weights"])  # what the sync asks first: already awake, no call
    assert calls == ["sleep2", "wake['weights']"]
    engine.wake_up()  # after loading: the rest
    engine.wake_up()  # and a generate after that: nothing left to wake
    assert calls == ["sleep2", "wake['weights']", "wake['kv_cache']"]
    assert engine.asleep == frozenset()
    model_config.enable_sleep_mode = False  # vLLM refuses to sleep an engine started without it
    assert engine.sleep() is False
    model_config.enable_sleep_mode = True
    engine.on_cpu = True
    assert engine.sleep() is False
    assert object.__new__(HFEngine).sleep() is False
    assert calls == ["sleep2", "wake['weights']", "wake['kv_cache']"]


class PerThreadCuda:
    """torch.cuda's current device as CUDA keeps it: one per thread, device 0 in a new thread."""

    def __init__(self) -> None:
        self.local = threading.local()

    def current_device(self) -> int:
        return getattr(self.local, "device", 0)

    def set_device(self, device: int) -> None:
        self.local.device = device


@pytest.fixture
def rank_3_gpu(monkeypatch: pytest.MonkeyPatch) -> PerThreadCuda:
    """This thread on GPU 3, as rank 3 of a launched run sets it; CUDA in use."""
    import torch

    cuda = PerThreadCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", cuda.current_device)
    monkeypatch.setattr(torch.cuda, "set_device", cuda.set_device)
    cuda.set_device(3)
    return cuda


def _on_a_watched_engines_helper_thread(probe: Callable[[], T]) -> tuple[int, T]:
    """Run ``probe`` as a watched engine request (a helper thread): its thread id and value."""
    from grpo_train.rollout.processes import EngineProcesses

    before = EngineProcesses.current_children()
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    watched = EngineProcesses.started_since(before, roots=[engine.pid])
    try:
        return watched.call(lambda: (threading.get_ident(), probe()), "generate")
    finally:
        watched.end(grace_s=0.1)


def _in_each_step_of_the_producer(probe: Callable[[], T], steps: int) -> tuple[list[T], set[str]]:
    """``probe``'s value in each step the async rollout producer collects, and its threads."""
    from test_rollout_pipeline import FakeCollector, _drive

    from grpo_train.collect.pipeline import RolloutPipeline

    engine = SimpleNamespace(version=0, syncing=False)
    values: list[T] = []
    collector = FakeCollector(engine)
    sample = collector.sample_batch
    collector.sample_batch = lambda *a: (values.append(probe()), sample(*a))[1]
    pipeline = RolloutPipeline(collector, 1, last_step=steps)
    try:
        _drive(pipeline, engine, steps)
    finally:
        pipeline.close()
    return values, {c[2] for c in collector.calls}


def test_engine_requests_on_a_helper_thread_run_on_the_callers_gpu(
    rank_3_gpu: PerThreadCuda,
) -> None:
    """A watched request (generate, weight sync) runs on a helper thread: on rank 3's GPU."""
    seen = _on_a_watched_engines_helper_thread(rank_3_gpu.current_device)
    assert seen[0] != threading.get_ident()  # it did run on a helper thread
    assert seen[1] == 3


def test_the_rollout_producer_thread_generates_on_the_callers_gpu(
    rank_3_gpu: PerThreadCuda,
) -> None:
    devices, threads = _in_each_step_of_the_producer(rank_3_gpu.current_device, 3)
    assert threads == {"rollouts"} and devices == [3, 3, 3]


def _in_new_thread(fn: Callable[[], T]) -> T:
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


@pytest.fixture
def other_threads_count() -> Iterator[int]:
    """New threads start with another CPU thread count than this one's (returned).

    As after another thread's ``torch.set_num_threads`` (OpenMP keeps a count per thread and a
    default for new ones): the state in which vLLM's CPU attention planned a step for 2
    threads and ran it on 1.
    """
    mine = torch.get_num_threads()
    _in_new_thread(lambda: torch.set_num_threads(mine + 1))
    try:
        if _in_new_thread(torch.get_num_threads) != mine + 1 or torch.get_num_threads() != mine:
            pytest.fail("could not give new threads another count: the test would prove nothing")
        yield mine
    finally:
        _in_new_thread(lambda: torch.set_num_threads(mine))


def test_helper_threads_use_the_callers_cpu_thread_count(other_threads_count: int) -> None:
    """vLLM's CPU attention checks that a step runs on the thread count it was planned for.

    A new thread starts with the process default, not the caller's count: an asynchronous vLLM
    run died in its first step ("thread_num (2 vs. 1)") after an earlier test had set 1 thread.
    """
    mine = other_threads_count
    seen = _on_a_watched_engines_helper_thread(torch.get_num_threads)
    assert seen[0] != threading.get_ident() and seen[1] == mine
    counts, _ = _in_each_step_of_the_producer(torch.get_num_threads, 2)
    assert counts == [mine, mine]
