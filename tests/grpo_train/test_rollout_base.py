"""The engine contract's sleep protocol: an engine sleeps during the update only when it can."""

from __future__ import annotations

import pytest
import torch

from grpo_train.rollout.base import engine_asleep


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
