"""Memory controls: token-budget micro-batches, checkpointing, autocast, peak memory, offload."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_train.loss import make_micro_batches, token_logprobs
from grpo_train.memory import (
    autocast,
    enable_gradient_checkpointing,
    engine_asleep,
    on_device,
    peak_memory,
)


def _packing(lengths: list[int], budget: int) -> list[list[int]]:
    """The trainer's micro-batches of rows with these total lengths (prompt of 1 + completion)."""
    prompts = [[1] for _ in lengths]
    completions = [[2] * (n - 1) for n in lengths]
    return [list(mb.rows) for mb in make_micro_batches(prompts, completions, budget, pad_id=0)]


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([3, 1, 2], 4, [[1, 2], [0]]),
        ([4, 4, 4, 4], 8, [[0, 1], [2, 3]]),
        ([4, 4, 4, 4], 16, [[0, 1, 2, 3]]),
        ([10, 2, 2], 5, [[1, 2], [0]]),  # the long row gets its own micro-batch
        ([5, 5, 1], 4, [[2], [0], [1]]),  # every row is over budget except the short one
        ([2, 3, 3, 7, 1], 9, [[4, 0, 1], [2], [3]]),
    ],
)
def test_micro_batches_hand_cases(
    lengths: list[int], budget: int, expected: list[list[int]]
) -> None:
    """Shortest first, packed greedily while rows x longest row fits the token budget."""
    assert _packing(lengths, budget) == expected


def test_micro_batches_fit_the_budget() -> None:
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 30))]
        budget = rng.randint(16, 200)
        groups = _packing(lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= budget


def test_autocast_is_a_no_op_on_cpu() -> None:
    layer = torch.nn.Linear(4, 4)
    with autocast("cpu", "bfloat16"):
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.float32
    with autocast("cuda", torch.float32):
        assert layer(torch.randn(2, 4)).dtype == torch.float32
    with pytest.raises(ValueError, match="autocast dtype"):
        autocast("cpu", "int8")


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    mb = make_micro_batches([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]], 10_000, pad_id=0)[0]
    model.train()
    logprobs, _ = token_logprobs(model, mb)
    (logprobs * mb.completion_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_keeps_gradients(tiny_model_path: Path, lora: bool) -> None:
    from grpo_train.lora import LoraSettings, apply_lora
    from grpo_train.models import load_policy

    model: Any = load_policy(str(tiny_model_path))[0]
    if lora:
        model = apply_lora(model, LoraSettings(lora_r=4, lora_alpha=8))
    plain = _grads(model)
    enable_gradient_checkpointing(model)
    base = model.get_base_model() if lora else model
    assert base.is_gradient_checkpointing and base.config.use_cache is False
    checkpointed = _grads(model)
    assert set(plain) == set(checkpointed) and plain
    if lora:
        assert all("lora_" in n for n in plain)  # B starts at 0, so only B gets a gradient yet
        assert any(g.abs().max() > 0 for n, g in checkpointed.items() if "lora_B" in n)
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(TypeError, match="gradient_checkpointing_enable"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


def test_peak_memory_reads_this_process() -> None:
    current_kib = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    peak = peak_memory()
    assert peak.rss_mb >= current_kib / 1024 * 0.99
    if not torch.cuda.is_available():
        assert peak.cuda_allocated_mb is None and peak.cuda_reserved_mb is None


def test_on_device_restores_and_refuses_missing_cuda() -> None:
    layer = torch.nn.Linear(3, 3)
    weight = layer.weight.detach().clone()
    with pytest.raises(RuntimeError, match="inside"), on_device(layer, "cpu") as moved:
        assert moved is layer
        raise RuntimeError("inside")
    assert layer.weight.device.type == "cpu" and torch.equal(layer.weight, weight)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"), on_device(layer, "cuda"):
            pass


class _SleepyEngine:
    """An engine whose ``sleep`` says whether it slept, recording the calls."""

    def __init__(self, can_sleep: bool) -> None:
        self.can_sleep, self.calls = can_sleep, []  # type: ignore[var-annotated]

    def sleep(self, level: int = 1) -> bool:
        self.calls.append(f"sleep{level}")
        return self.can_sleep

    def wake_up(self) -> None:
        self.calls.append("wake")


def test_engine_asleep_wakes_only_what_slept_even_when_the_update_fails() -> None:
    awake = _SleepyEngine(can_sleep=False)
    with engine_asleep(awake) as slept:  # type: ignore[arg-type]
        assert slept is False
    assert awake.calls == ["sleep1"]  # asked, refused, never woken
    engine = _SleepyEngine(can_sleep=True)
    with engine_asleep(engine, level=2) as slept:  # type: ignore[arg-type]
        assert slept is True and engine.calls == ["sleep2"]
    assert engine.calls == ["sleep2", "wake"]
    with pytest.raises(RuntimeError, match="update failed"), engine_asleep(engine):  # type: ignore[arg-type]
        raise RuntimeError("update failed")
    assert engine.calls[-2:] == ["sleep1", "wake"]  # woken even when the update raised


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

        def wake_up(self) -> None:
            calls.append("wake")

    engine = object.__new__(VLLMEngine)  # the sleep logic only; no vLLM process behind it
    engine.llm, engine.on_cpu = FakeLLM(), False  # type: ignore[assignment]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with engine_asleep(engine, level=2) as slept:
        assert slept is True and calls == ["sleep2"]
    assert calls == ["sleep2", "wake"]
    model_config.enable_sleep_mode = False  # vLLM refuses to sleep an engine started without it
    assert engine.sleep() is False
    model_config.enable_sleep_mode = True
    engine.on_cpu = True
    assert engine.sleep() is False
    assert object.__new__(HFEngine).sleep() is False
    assert calls == ["sleep2", "wake"]
