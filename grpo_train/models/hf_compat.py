"""transformers' renamed model APIs, chosen in one place for every supported release.

transformers renamed two things the trainer calls; the old names still work but warn
(``FutureWarning``) and are removed later (the forward keyword in 5.40, the checkpointing names
in v6):

- 5.24, the key/value cache keyword of a model's ``forward``: ``past_key_values`` -> ``cache``;
- 5.23, gradient checkpointing: ``gradient_checkpointing_enable`` / ``is_gradient_checkpointing``
  -> ``activation_checkpointing_enable`` / ``is_activation_checkpointing``.

Releases down to the ``transformers`` floor in pyproject.toml (5.4) have only the old names. Each
helper asks the model's class which name it has rather than comparing version numbers: a model
whose code comes with its checkpoint (remote code) or lags behind the library keeps working.
Callers pass the model as they hold it (DDP / FSDP / compiled / peft wrappers are looked through).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

#: The forward keyword of the key/value cache in transformers >= 5.24, and before.
CACHE_KEYWORD = "cache"
LEGACY_CACHE_KEYWORD = "past_key_values"


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """Return the transformers model inside parallel, compile and peft wrappers."""
    from accelerate.utils import extract_model_from_parallel

    inner: Any = extract_model_from_parallel(model)
    get_base = getattr(type(inner), "get_base_model", None)  # peft's PeftModel
    return get_base(inner) if callable(get_base) else inner


@functools.lru_cache(maxsize=64)
def _cache_keyword_of(cls: type) -> str:
    forward = getattr(cls, "forward", None)
    try:
        params = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):  # a builtin or C-level forward: the long-standing name
        return LEGACY_CACHE_KEYWORD
    return CACHE_KEYWORD if CACHE_KEYWORD in params else LEGACY_CACHE_KEYWORD


def cache_keyword(model: torch.nn.Module) -> str:
    """Return the keyword under which ``model``'s forward takes a key/value cache.

    >>> class New(torch.nn.Module):
    ...     def forward(self, input_ids, cache=None): ...
    >>> class Old(torch.nn.Module):
    ...     def forward(self, input_ids, past_key_values=None): ...
    >>> cache_keyword(New()), cache_keyword(Old())
    ('cache', 'past_key_values')
    """
    cls: Any = type(base_model(model))
    return _cache_keyword_of(cls)


def checkpointing_enabled(model: torch.nn.Module) -> bool:
    """Return whether activation (gradient) checkpointing is on for ``model``.

    The property is read on the transformers model itself: DDP does not forward attributes, and
    reading the deprecated alias (on releases that have the new one) warns.
    """
    base: Any = base_model(model)
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if isinstance(getattr(type(base), name, None), property):
            return bool(getattr(base, name))
    return False


def enable_checkpointing(model: torch.nn.Module, kwargs: dict[str, object]) -> None:
    """Turn activation checkpointing on with ``torch.utils.checkpoint`` ``kwargs``.

    Called on ``model`` as given (a peft model adds its own input-gradient hook on the way);
    ``TypeError`` when it is not a transformers model.
    """
    target: Any = model
    base = base_model(model)
    if hasattr(type(base), "activation_checkpointing_enable"):
        target.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(type(base), "gradient_checkpointing_enable"):
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise TypeError(
            f"{type(model).__name__} has no activation_checkpointing_enable or "
            "gradient_checkpointing_enable (not a transformers model)"
        )
