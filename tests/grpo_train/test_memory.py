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
    micro_batches,
    on_device,
    peak_memory,
)


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([3, 1, 2], 4, [[1, 2], [0]]),
        ([4, 4, 4, 4], 8, [[0, 1], [2, 3]]),
        ([4, 4, 4, 4], 16, [[0, 1, 2, 3]]),
        ([10, 2, 2], 5, [[1, 2], [0]]),  # the long row gets its own micro-batch
        ([5, 5, 1], 4, [[2], [0], [1]]),  # every row is over budget except the short one
        ([2, 3, 3, 7, 1], 9, [[4, 0, 1], [2], [3]]),
        ([], 8, []),
    ],
)
def test_micro_batches_hand_cases(
    lengths: list[int], budget: int, expected: list[list[int]]
) -> None:
    assert micro_batches(lengths, budget) == expected


def test_micro_batches_fit_the_budget_and_match_the_trainer() -> None:
    rng = random.Random(0)
    for _ in range(50):
        prompts = [[1] * rng.randint(1, 20) for _ in range(rng.randint(1, 30))]
        completions = [[2] * rng.randint(0, 40) for _ in prompts]
        lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
        budget = rng.randint(16, 200)
        groups = micro_batches(lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= budget
        # The trainer's micro-batching (loss.make_micro_batches) packs the same way.
        trainer = make_micro_batches(prompts, completions, budget, pad_id=0)
        assert [list(mb.rows) for mb in trainer] == groups


def test_micro_batches_bad_input() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        micro_batches([1, 2], 0)
    with pytest.raises(ValueError, match="lengths"):
        micro_batches([1, -2], 8)


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


def test_engine_asleep_leaves_engines_without_sleep_alone() -> None:
    calls: list[str] = []

    class FakeLLM:
        def sleep(self, level: int = 1) -> None:
            calls.append(f"sleep{level}")

        def wake_up(self) -> None:
            calls.append("wake")

    class HFLike:  # no `llm` attribute at all
        pass

    class VLLMOnCPU:
        on_cpu = True
        llm = FakeLLM()

    for engine in (HFLike(), VLLMOnCPU()):
        with engine_asleep(engine) as slept:
            assert slept is False
    assert calls == []


def test_engine_asleep_sleeps_and_always_wakes(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    calls: list[str] = []

    class FakeLLM:
        llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(model_config=SimpleNamespace(enable_sleep_mode=True))
        )

        def sleep(self, level: int = 1) -> None:
            calls.append(f"sleep{level}")

        def wake_up(self) -> None:
            calls.append("wake")

    engine = SimpleNamespace(llm=FakeLLM(), on_cpu=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with engine_asleep(engine, level=2) as slept:
        assert slept is True and calls == ["sleep2"]
    assert calls == ["sleep2", "wake"]
    with pytest.raises(RuntimeError, match="update failed"), engine_asleep(engine):
        raise RuntimeError("update failed")
    assert calls[-2:] == ["sleep1", "wake"]  # woken even when the update raised
    FakeLLM.llm_engine.vllm_config.model_config.enable_sleep_mode = False
    with engine_asleep(engine) as slept:
        assert slept is False  # started without enable_sleep_mode: vLLM would refuse to sleep
