"""Loading the policy, its tokenizer and tiny test models; transformers' renamed APIs.

``build_tiny_model``, ``load_policy`` and ``resolve_model`` are re-exported here, so
``grpo_train.models.build_tiny_model`` names the same function as ``grpo_train.models.loading``.
"""

from grpo_train.models.loading import build_tiny_model, load_policy, resolve_model

__all__ = ["build_tiny_model", "load_policy", "resolve_model"]
