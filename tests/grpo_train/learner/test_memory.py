"""How the training model holds its memory: checkpointing, autocast, offload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_train.learner.forward import token_logprobs
from grpo_train.learner.memory import autocast, enable_gradient_checkpointing, on_device
from grpo_train.learner.micro_batches import make_micro_batches
from grpo_train.models.hf_compat import checkpointing_enabled


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
    from grpo_train.learner.lora import LoraSettings, apply_lora
    from grpo_train.models.loading import load_policy

    model: Any = load_policy(str(tiny_model_path))[0]
    if lora:
        model = apply_lora(model, LoraSettings(lora_r=4, lora_alpha=8))
    plain = _grads(model)
    assert not checkpointing_enabled(model)
    enable_gradient_checkpointing(model)
    base = model.get_base_model() if lora else model
    assert checkpointing_enabled(model) and base.config.use_cache is False
    checkpointed = _grads(model)
    assert set(plain) == set(checkpointed) and plain
    if lora:
        assert all("lora_" in n for n in plain)  # B starts at 0, so only B gets a gradient yet
        assert any(g.abs().max() > 0 for n, g in checkpointed.items() if "lora_B" in n)
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(TypeError, match="gradient_checkpointing_enable"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


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
