"""transformers' renamed APIs: the trainer's calls use the names the installed release has, and
none of them raises a deprecation warning (the model's own forward and checkpointing)."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_train.models.hf_compat import (
    CACHE_KEYWORD,
    LEGACY_CACHE_KEYWORD,
    base_model,
    cache_keyword,
    checkpointing_enabled,
    enable_checkpointing,
)


@pytest.fixture
def tiny(tiny_model_path: Path) -> Any:
    from grpo_train.models.loading import load_policy

    return load_policy(str(tiny_model_path))[0]


def test_the_cache_keyword_is_the_one_the_model_takes_and_reuses_the_cache(tiny: Any) -> None:
    from transformers.cache_utils import DynamicCache

    name = cache_keyword(tiny)
    params = inspect.signature(type(tiny).forward).parameters
    assert name in (CACHE_KEYWORD, LEGACY_CACHE_KEYWORD) and name in params
    if CACHE_KEYWORD in params:  # a release with both: the new name
        assert name == CACHE_KEYWORD
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        whole = tiny(input_ids=ids).logits[:, -1]
        cache = DynamicCache(config=tiny.config)
        tiny(input_ids=ids[:, :4], use_cache=True, **{name: cache})
        assert cache.get_seq_length() == 4  # the forward filled the cache it was given
        last = tiny(input_ids=ids[:, 4:], use_cache=True, **{name: cache}).logits[:, -1]
    torch.testing.assert_close(last, whole, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointing_is_switched_and_read_without_a_deprecation(tiny: Any, lora: bool) -> None:
    from grpo_train.learner.lora import LoraSettings, apply_lora

    model = apply_lora(tiny, LoraSettings(lora_r=4, lora_alpha=8)) if lora else tiny
    assert base_model(model) is tiny
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        assert not checkpointing_enabled(model)
        enable_checkpointing(model, {"use_reentrant": False})
        assert checkpointing_enabled(model)
    with pytest.raises(TypeError, match="not a transformers model"):
        enable_checkpointing(torch.nn.Linear(2, 2), {})
    assert not checkpointing_enabled(torch.nn.Linear(2, 2))
