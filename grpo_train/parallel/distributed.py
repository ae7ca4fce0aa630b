"""Data-parallel GRPO over ``torch.distributed``, launched by ``accelerate launch`` or ``torchrun``.

The layout (as TRL's and OpenRLHF's colocated mode): every rank holds the policy (replicated by
DDP, or sharded by FSDP / DeepSpeed ZeRO) and its own rollout engine. Per step:

1. ``shard_prompts``: each rank takes a contiguous share of the step's prompts. A prompt is a GRPO
   group (the engine samples its ``G`` completions), so a group never spans two ranks.
2. Each rank generates and scores its share.
3. The advantages (``algorithm.global_advantages``, above this package): rewards are gathered
   from every rank (``gather_rows`` and ``gather_objects``, here), advantages computed on the
   whole (P, G) batch (batch-level reward scaling and logged statistics then equal a
   single-process run), and each rank keeps its own rows.
4. The loss of each micro-batch is normalised by *global* token / sequence counts
   (``global_loss_normalizers``) and multiplied by ``data_parallel_loss_scale()``, because DDP,
   FSDP and ZeRO all *average* gradients over ranks. The sum of gradients then equals the
   single-process gradient of the global batch.
5. Every rank runs the same number of forward/backward passes (``micro_batch_schedule``; FSDP
   and ZeRO-3 all-gather parameters inside each forward, so a rank with fewer micro-batches
   would hang the others), padding with zero-weight micro-batches.
6. ``learner.weight_export.sync_rollout_weights``: the engine gets full weights, gathered from
   shards when sharded.
7. Checkpoints (``run/checkpoint.py``): the HF folder gets
   ``learner.weight_export.export_state_dict``; when
   ``shards_training_state`` (FSDP, DeepSpeed) the optimizer goes through accelerate's
   ``save_state`` / ``load_state``.

These are the whole data-parallel protocol: ``learner.update.grpo_update``,
``collect.collector.Collector`` and the trainer call them directly, on one process as on many.
Every function works single-process (no process group, or world size 1: a fast path that
communicates nothing and returns its input) and on CPU with the gloo backend, which is how the
tests run them.

Why over 500 lines: the data-parallel protocol is one concept, in one place (the collectives,
their world-size-1 fast paths, and the wrapped-model helpers the trainer needs under a launcher).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the data-parallel job."""

    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the one that logs, evaluates and writes checkpoints."""
        return self.rank == 0


def multi_rank() -> bool:
    """Return True when a process group with more than one rank is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_info() -> RankInfo:
    """Rank, world size and local rank: from the process group, else the launcher's environment.

    ``accelerate launch`` and ``torchrun`` set ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; a plain
    ``python`` run is rank 0 of 1.
    """
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size(), local)
    return RankInfo(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), local)


def requested_processes(cmdline: Sequence[str]) -> int | None:
    """Return the ``--num_processes`` an ``accelerate launch`` command line asks for, or None.

    >>> requested_processes(["accelerate", "launch", "--cpu", "--num_processes", "2", "t.py"])
    2
    >>> requested_processes(["accelerate", "launch", "--num-processes=4", "t.py"])
    4
    """
    if "launch" not in cmdline:
        return None
    for i, arg in enumerate(cmdline):
        name, _, inline = arg.partition("=")
        if name in ("--num_processes", "--num-processes"):
            value = inline or (cmdline[i + 1] if i + 1 < len(cmdline) else "")
            try:
                return int(value)
            except ValueError:
                return None
        if (not arg.startswith("-") and arg.endswith(".py")) or arg in ("-m", "--module"):
            break  # the script's own arguments follow
    return None


def launch_problem() -> str | None:
    """Say why ``accelerate launch --num_processes N`` (N > 1) started one lone process, or None.

    ``accelerate launch --cpu --num_processes 2`` runs a single process (its CPU launcher starts
    several only through MPI) without a word, and so does ``accelerate launch --num_processes 2``
    (``grpo launch`` too) without ``--multi_gpu`` on a machine with fewer than two GPUs; training
    would then silently use one rank. The caller refuses the run with this text (``setup.run``
    raises it as a ``ConfigError``).
    """
    if rank_info().world_size > 1:
        return None
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    wanted = requested_processes([a.decode(errors="replace") for a in raw.split(b"\0") if a])
    if wanted is None or wanted < 2:
        return None
    if os.environ.get("ACCELERATE_USE_CPU"):
        return (
            f"accelerate launch asked for --num_processes {wanted} but started 1 process "
            "(its --cpu launcher starts several only through MPI); for gloo ranks on CPU run "
            f"`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes {wanted} ...`"
        )
    # Without --multi_gpu (or a config file) accelerate starts several processes only when the
    # machine has several GPUs; on one GPU (or none) it runs this single process without a word.
    gpus = torch.cuda.device_count()
    return (
        f"accelerate launch asked for --num_processes {wanted} but started 1 process: without "
        f"--multi_gpu or a config file it starts several only on a machine with several GPUs, "
        f"and this one has {gpus}; launch one process per GPU (--num_processes "
        f"{max(gpus, 1)}), or for gloo ranks on CPU `ACCELERATE_USE_CPU=true accelerate launch "
        f"--multi_gpu --num_processes {wanted} ...`"
    )


# ------------------------------------------------------------------------------ prompt sharding


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s contiguous share of ``n`` items.

    The first ``n % world`` ranks get one item more (as ``numpy.array_split``); concatenating the
    shards in rank order gives back the original order.
    """
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank={rank}, world={world}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class GenerationShare:
    """What one rank generates and what it keeps of a step's ``n`` prompts (``[start, stop)``).

    With ``vllm_tensor_parallel_size`` T the ranks ``T*g .. T*g+T-1`` share one engine: each of
    them generates the group's prompts, the union of the group's contiguous rank shares (the
    prompts TRL's colocate mode all-gathers within the group), and keeps its own rank share
    for training. Seeds follow the global prompt index, so what is sampled does not depend on T.
    """

    generate: tuple[int, int]
    keep: tuple[int, int]

    def own(self, items: Sequence[T]) -> list[T]:
        """Return the rank's own items out of the group's generated ``items`` (one a prompt).

        >>> GenerationShare(generate=(2, 5), keep=(3, 5)).own(["c", "d", "e"])
        ['d', 'e']
        """
        start = self.generate[0]
        return list(items[self.keep[0] - start : self.keep[1] - start])


def generation_share(n: int, rank: int, world: int, tensor_parallel: int = 1) -> GenerationShare:
    """Return rank ``rank``'s :class:`GenerationShare` of ``n`` prompts.

    Its engine's group is ``tensor_parallel`` consecutive ranks (vLLM's external launcher groups
    ranks that way: its layout is DP x PP x TP, TP innermost). The kept shares are
    ``shard_bounds``'s whatever the grouping, so training is unchanged.

    >>> generation_share(5, rank=3, world=4, tensor_parallel=2)  # shares 0-2, 2-3, 3-4, 4-5
    GenerationShare(generate=(3, 5), keep=(4, 5))
    >>> generation_share(5, rank=1, world=2)  # no tensor parallelism: generate what is kept
    GenerationShare(generate=(3, 5), keep=(3, 5))
    """
    if tensor_parallel < 1 or world % tensor_parallel:
        raise ValueError(f"tensor_parallel={tensor_parallel} must divide the world size {world}")
    keep = shard_bounds(n, rank, world)
    first = rank - rank % tensor_parallel
    start = shard_bounds(n, first, world)[0]
    stop = shard_bounds(n, first + tensor_parallel - 1, world)[1]
    return GenerationShare((start, stop), keep)


def shard_prompts(items: Sequence[T], rank: int, world: int, group_size: int = 1) -> list[T]:
    """Return this rank's share of a step's prompts: whole groups only, deterministic.

    ``items`` are prompts (one group each, ``group_size=1``) or flattened per-completion rows
    (``group_size=G``, ``len(items)`` a multiple of ``G``); shares are cut at group boundaries
    only. Shares differ by at most one group. More ranks than groups leaves some ranks empty,
    which ``micro_batch_schedule`` then refuses with an error; ``prompts_per_step`` a multiple
    of the world size avoids it.

    >>> shard_prompts(["a", "b", "c", "d", "e"], rank=1, world=2)
    ['d', 'e']
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if len(items) % group_size:
        raise ValueError(
            f"{len(items)} rows are not whole groups of {group_size}; a group cannot be split"
        )
    start, stop = shard_bounds(len(items) // group_size, rank, world)
    return list(items[start * group_size : stop * group_size])


# --------------------------------------------------------------------- gathers and reductions


def backend_device() -> torch.device:
    """Return the device whose tensors the default process group's backend communicates.

    gloo serves CPU tensors (and CUDA ones); NCCL serves CUDA tensors only and fails on a CPU
    tensor ("No backend type associated with device type cpu"). accelerate starts multi-GPU jobs
    with a plain ``nccl`` group, so every collective here stages its tensors on this device.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return torch.device("cpu")
    kinds = {device.type for device in _backend_device_types()}
    if "cpu" in kinds:
        return torch.device("cpu")
    kind = sorted(kinds)[0] if kinds else "cuda"
    module = getattr(torch, kind, None)
    if module is None or not module.is_available():
        raise RuntimeError(
            f"the process group's backend ({dist.get_backend()}) communicates {kind} tensors "
            f"only, and this process sees no {kind} device; launch one process per device"
        )
    return torch.device(kind, module.current_device())


def _backend_device_types() -> list[torch.device]:
    """Return the device types the default group's backends serve (torch records them per group)."""
    types = getattr(dist.group.WORLD, "_device_types", None)
    if types is not None:
        return list(types)
    return [torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")]


def on_backend_device(tensor: torch.Tensor) -> torch.Tensor:
    """Return ``tensor`` on ``backend_device()``: the one place collectives get tensors from.

    Every tensor handed to a ``torch.distributed`` collective in this package, inputs and output
    buffers, comes from here (the test suite runs the multi-rank tests with a guard that fails on
    any other, so a CPU-only CI catches what NCCL would reject).
    """
    return tensor.to(backend_device())


def gather_rows(local: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``local`` along dim 0, in rank order (row counts may differ).

    ``all_gather`` needs equal shapes, so rows are padded to the largest count and cut back.
    The result is on ``local``'s device, whatever device the backend communicates on.
    """
    if not multi_rank():
        return local
    world = dist.get_world_size()
    count = on_backend_device(torch.tensor([local.shape[0]], dtype=torch.long))
    counts = [on_backend_device(torch.zeros_like(count)) for _ in range(world)]
    dist.all_gather(counts, count)
    sizes = [int(c.item()) for c in counts]
    padded = local.new_zeros((max(sizes), *local.shape[1:]))
    padded[: local.shape[0]] = local
    padded = on_backend_device(padded.contiguous())
    parts = [on_backend_device(torch.empty_like(padded)) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([part[:size] for part, size in zip(parts, sizes)], dim=0).to(local.device)


def gather_objects(items: list[T]) -> list[T]:
    """Return every rank's picklable ``items`` concatenated in rank order (collective).

    World size 1: ``items`` itself.
    """
    if not multi_rank():
        return items
    parts: list[list[T] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, items)
    return [item for part in parts for item in (part or [])]


def _all_reduce(values: Sequence[float], op: Any) -> list[float]:
    if not multi_rank():
        return list(values)
    tensor = on_backend_device(torch.tensor(list(values), dtype=torch.float64))
    dist.all_reduce(tensor, op=op)
    return [float(v) for v in tensor.cpu()]


def global_sum(*values: float) -> list[float]:
    """Sum each value over all ranks (float64, so token counts stay exact)."""
    return _all_reduce(values, dist.ReduceOp.SUM if dist.is_available() else None)


def global_max(*values: float) -> list[float]:
    """Maximum of each value over all ranks."""
    return _all_reduce(values, dist.ReduceOp.MAX if dist.is_available() else None)


def any_rank(flag: bool) -> bool:
    """Tell whether ``flag`` holds on some rank (collective; world size 1: ``flag``)."""
    if not multi_rank():
        return flag
    return global_sum(float(flag))[0] > 0


@dataclass(frozen=True)
class RankFailure:
    """A rank that failed in a stage every rank runs, and its error on one line."""

    rank: int
    error: str


def failed_rank(error: str | None) -> RankFailure | None:
    """Agree on whether a stage failed on some rank: its lowest failing rank, on every rank.

    ``error``: this rank's one-line error, None when its stage went well. Collective, in place
    of a barrier between stages: a rank that raises before a barrier never reaches it, and the
    others wait there until the process group's timeout (NCCL: 10-30 minutes) and fail with a
    timeout that names nobody. Here every rank reaches the agreement, one all-reduce of a flag
    (a gather of the errors only when one failed), and each then knows who failed and why.
    World size 1: this rank's own error.

    >>> failed_rank(None) is None
    True
    >>> failed_rank("OSError: disk full")
    RankFailure(rank=0, error='OSError: disk full')
    """
    if not multi_rank():
        return None if error is None else RankFailure(rank_info().rank, error)
    if not any_rank(error is not None):
        return None
    errors = gather_objects([error])
    return next(RankFailure(rank, text) for rank, text in enumerate(errors) if text is not None)


def global_loss_normalizers(local_tokens: int, local_sequences: int) -> tuple[int, int]:
    """Global ``(total_tokens, total_sequences)`` for ``loss_share`` (all ranks' batches)."""
    tokens, sequences = global_sum(local_tokens, local_sequences)
    return round(tokens), round(sequences)


def data_parallel_loss_scale() -> float:
    """Multiply each micro-batch loss by this when gradients are averaged over ranks.

    DDP (and FSDP, ZeRO) average gradients over the world; a loss already normalised by global
    counts must be scaled back up by the world size so the update equals the single-process one.
    """
    return float(dist.get_world_size()) if multi_rank() else 1.0


def micro_batch_schedule(local_count: int) -> list[tuple[int, float]]:
    """``(local micro-batch index, loss weight)`` for every forward/backward this rank runs.

    Every rank runs as many passes as the busiest rank has micro-batches; past its own a rank
    repeats its last one with weight 0 (gradients of 0, but the collectives inside DDP / FSDP /
    ZeRO still happen). A rank with no micro-batch at all cannot pad: keep at least one group per
    rank (e.g. dynamic sampling keeps an uninformative group with zero advantages).
    Collective: call on all ranks.

    >>> micro_batch_schedule(2)  # single process
    [(0, 1.0), (1, 1.0)]
    """
    # One all-reduce gives the largest count and (negated) the smallest: every rank then knows
    # whether some rank is empty and raises with it, instead of the others going on into a
    # forward whose collectives wait for the rank that left (NCCL: until the collective timeout).
    total, minus_fewest = (int(v) for v in global_max(local_count, -local_count))
    if -minus_fewest == 0 and total > 0:
        raise ValueError(
            "a rank has no micro-batch while others do; every rank needs at least one group "
            "per step (make prompts_per_step a multiple of the world size)"
        )
    return [(k, 1.0) if k < local_count else (local_count - 1, 0.0) for k in range(total)]


@contextlib.contextmanager
def gradient_sync(
    accelerator: Any, model: torch.nn.Module, index: int, count: int
) -> Iterator[None]:
    """Context for micro-batch ``index`` of ``count``: reduce gradients and step on the last only.

    Accumulating micro-batches under ``accelerator.no_sync`` and reducing once per optimizer
    step is what DDP's ``no_sync`` is for. ``no_sync`` leaves accelerate's ``sync_gradients``
    alone, and that flag is what its DeepSpeed wrapper reads: each ``backward`` with it set ends
    in DeepSpeed's ``engine.step()`` (an optimizer step per micro-batch, padding passes
    included), and ``AcceleratedOptimizer.step`` skips while it is unset. So it is set here, per
    micro-batch: False before the last, True on it and after the context (accelerate's default,
    which the optimizer step then sees). Without an accelerator (single process) a no-op.
    """
    if accelerator is None:
        yield
        return
    last = index == count - 1
    accelerator.sync_gradients = last
    try:
        with contextlib.nullcontext() if last else accelerator.no_sync(model):
            yield
    finally:
        accelerator.sync_gradients = True


def set_deepspeed_micro_batch_size(accelerator: Any) -> None:
    """Give DeepSpeed a ``train_micro_batch_size_per_gpu`` before ``accelerator.prepare``.

    accelerate's DeepSpeed configs (``examples/accelerate/zero*.yaml``) leave it ``auto``, which
    ``prepare`` resolves from a dataloader's batch size, and fails without one; the trainer
    hands it none. grpo cuts micro-batches by tokens (``micro_batch_tokens``), so their rows
    vary: DeepSpeed gets 1, which it uses only to report samples per second and to check
    ``train_batch_size`` (= micro size * accumulation steps * world size), and accumulation
    steps stay 1 (the examples' setting) with the boundary set per micro-batch
    (``gradient_sync``). A value set in a DeepSpeed config file is kept.
    """
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    if plugin is None:
        return
    # The plugin's hf_ds_config reads this same dict; prepare() derives train_batch_size.
    config = plugin.deepspeed_config
    if config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        config["train_micro_batch_size_per_gpu"] = 1


def set_deepspeed_gradient_clipping(accelerator: Any, max_grad_norm: float) -> str | None:
    """Make DeepSpeed clip at ``max_grad_norm``; return why it cannot, or None.

    Under DeepSpeed the clipping is DeepSpeed's own (``gradient_clipping``, inside the engine's
    step, which ``accelerator.backward`` runs), and accelerate's ``clip_grad_norm_`` only
    reports the engine's norm. ``prepare`` fills a ``gradient_clipping: auto`` with 1.0
    whatever ``max_grad_norm`` says, so ``auto`` or no value becomes ``max_grad_norm`` here, before
    ``prepare`` (0: no clipping, in both). A number set in the launcher's configuration that
    differs is a mismatch the caller refuses with the returned text (``setup.run``: a
    ``ConfigError``), rather than a run clipping at another norm than its config says.
    """
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    if plugin is None:
        return None
    config = plugin.deepspeed_config  # what prepare() reads (the plugin's hf_ds_config too)
    given = config.get("gradient_clipping", "auto")
    if given in ("auto", None):
        config["gradient_clipping"] = float(max_grad_norm)
        plugin.gradient_clipping = float(max_grad_norm)
        return None
    if float(given) == float(max_grad_norm):
        return None
    return (
        f"max_grad_norm is {max_grad_norm:g} but the DeepSpeed configuration sets "
        f"gradient_clipping: {given} (DeepSpeed clips, so the run would clip at {given}); "
        "set gradient_clipping to auto or remove it (accelerate config's deepspeed_config, or "
        f"the DeepSpeed config file) and grpo sets it from max_grad_norm, or run with "
        f"--max_grad_norm {given}"
    )


def engine_stepping_in_backward(accelerator: Any) -> Any:
    """Return DeepSpeed's engine when ``accelerator.backward`` steps the optimizer, else None.

    accelerate's DeepSpeed wrapper runs the engine's ``step()`` (clip, optimizer step or a
    skip on overflow, zero the gradients) inside ``backward`` on the last micro-batch, and the
    prepared optimizer's ``step`` does nothing. ``learner.update.ClipAndStep`` then reads what
    happened (``was_step_applied``, ``get_global_grad_norm``) instead of stepping, and steps the
    run's scheduler (not prepared, so not DeepSpeed's) only after an applied step.
    """
    wrapper = getattr(accelerator, "deepspeed_engine_wrapped", None)
    return None if wrapper is None else wrapper.engine


# ------------------------------------------------------------------------------ consistency


def max_rank_difference(model: torch.nn.Module) -> float:
    """Largest absolute difference of any parameter between ranks (0.0 when replicas agree).

    Two ``all_reduce`` calls per parameter (MAX and MIN); the result is the same on every rank.
    For replicated models (DDP). For sharded ones (FSDP, ZeRO-3) each rank holds a different
    shard, so compare ``weight_export.full_state_dict`` outputs instead.
    """
    if not multi_rank():
        return 0.0
    worst = 0.0
    for name, param in unwrap_model(model).named_parameters():
        if type(param).__name__ == "DTensor" or hasattr(param, "ds_id"):
            raise TypeError(
                f"{name} is sharded; compare weight_export.full_state_dict(model) across ranks"
            )
        high = on_backend_device(param.detach().clone())
        low = on_backend_device(param.detach().clone())
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        if high.numel():
            worst = max(worst, float((high - low).abs().max()))
    return worst


# ------------------------------------------- wrapped models, sharded state, per-rank engines


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """Strip DDP / DeepSpeed / compile wrappers (accelerate's ``extract_model_from_parallel``)."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model)


def shards_training_state(accelerator: Any) -> bool:
    """Tell whether ``accelerator`` keeps the optimizer state split over ranks (FSDP, DeepSpeed).

    Such a run must checkpoint through ``accelerator.save_state`` (``checkpoint.py``): rank 0's
    optimizer holds only its shard (FSDP) or sits inside DeepSpeed's engine (ZeRO-1/2/3).
    """
    if accelerator is None:
        return False
    from accelerate.utils import DistributedType

    return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


@contextlib.contextmanager
def every_rank_loads_weights() -> Iterator[None]:
    """Let ``from_pretrained`` read the weights on every rank, not only on rank 0.

    With ``fsdp_cpu_ram_efficient_loading`` (``examples/accelerate/fsdp.yaml``) accelerate sets
    ``FSDP_CPU_RAM_EFFICIENT_LOADING``, and transformers then loads real weights on local rank 0
    only (``transformers.distributed.fsdp.is_fsdp_enabled``); the other ranks get empty tensors
    that ``accelerator.prepare`` later fills by broadcast. That is right for the policy, but a
    model that is never prepared (an HF engine's own copy, the KL reference) would stay empty
    on those ranks: seen on 2 CPU ranks as an all-zero engine on rank 1.
    """
    key = "FSDP_CPU_RAM_EFFICIENT_LOADING"
    saved = os.environ.get(key)
    os.environ[key] = "False"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def vllm_colocate_kwargs(seed: int, tensor_parallel_size: int = 1) -> dict[str, int | str]:
    """Extra ``VLLMEngine`` arguments for a colocated engine inside a launched job.

    Under ``accelerate launch`` / ``torchrun`` each rank's ``vllm.LLM`` must join the job's
    existing process group instead of starting its own (``distributed_executor_backend=
    "external_launcher"``, as TRL's colocate mode does); the ranks of one tensor-parallel group
    share an engine and must sample identically, so they get the same seed, and different groups
    different seeds. Single process: only the seed. ``tensor_parallel_size`` must divide the
    world size.

    >>> vllm_colocate_kwargs(seed=7)  # single process
    {'seed': 7}
    """
    info = rank_info()
    if tensor_parallel_size < 1 or info.world_size % tensor_parallel_size:
        raise ValueError(
            f"vllm_tensor_parallel_size: {tensor_parallel_size} does not divide the number of "
            f"ranks, {info.world_size}; launch a multiple of it (grpo launch --num_processes "
            f"{max(tensor_parallel_size, 2)} train ...) or set it to 1"
        )
    if info.world_size == 1:
        return {"seed": seed}
    return {
        "seed": seed + info.rank // tensor_parallel_size,
        "tensor_parallel_size": tensor_parallel_size,
        "distributed_executor_backend": "external_launcher",
    }
