"""The rollout-engine contract shared by the vLLM and HF engines.

The trainer tokenizes prompts itself (chat template, length checks) and hands the engine token ids;
the engine returns ``n`` sampled completions per prompt with the sampling logprob of every token,
and can load new weights from the trainer after each update. A caller that wants each prompt's
group as soon as it is done (the collector scores it while the rest still generates) passes
``on_done`` (``GroupDone``); an engine reports each group once, as early as it can.

What "sampling logprob" means, identically in both engines: the log-probability of the token under
the distribution it was drawn from, i.e. ``log_softmax(top_k_top_p(logits / temperature))``
(vLLM's ``logprobs_mode="processed_logprobs"``); with ``temperature == 0`` (greedy) it is the plain
``log_softmax(logits)``. With ``top_p == 1`` and top-k off this equals the trainer's
``log_softmax(logits / temperature)``, so the two can be compared for importance sampling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


def in_callers_torch_context(work: Callable[[], T]) -> Callable[[], T]:
    """Return ``work`` set to run with the calling thread's CUDA device and CPU thread count.

    Both are per thread, and a new thread starts with neither: its CUDA device is 0 (a helper
    thread that generates or syncs weights for rank 3 would allocate on rank 0's GPU), and its
    OpenMP thread count is the process default, not what ``torch.set_num_threads`` set in the
    caller (``num_threads``). vLLM's CPU attention plans its work for the thread count of the
    thread that schedules and checks it where it runs: with ``num_threads: 1`` an asynchronous
    run died in its first step ("Check failed: input->metadata->thread_num == thread_num (2 vs.
    1)"). Taken when this is called (in the caller's thread), set first thing in the thread
    that runs it.
    """
    import torch

    threads = torch.get_num_threads()
    device = (
        torch.cuda.current_device()
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else None
    )
    # torch's own setter: vLLM's CPU worker swaps ``torch.set_num_threads`` for a no-op after it
    # binds its threads (``vllm_engine`` puts the original back; this never depends on that).
    set_threads = torch._C.set_num_threads

    def run() -> T:
        if device is not None:
            torch.cuda.set_device(device)
        set_threads(threads)  # also when torch reports the same: OpenMP's count is per thread
        return work()

    return run


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample completions."""

    n: int = 8
    """Completions per prompt (the GRPO group size)."""
    max_new_tokens: int = 256
    """Hard cap on completion length in tokens; longer ones are cut (finish_reason 'length')."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = -1
    """Top-k sampling (-1 or 0: off)."""
    seed: int | None = None
    """Seed for the sampler; None draws from the engine's generator."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingConfig.n must be >= 1 (the group size), got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )
        if self.temperature < 0:
            raise ValueError(
                f"SamplingConfig.temperature must be >= 0 (0 = greedy), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"SamplingConfig.top_k must be -1 (off) or >= 1, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        """True when ``temperature == 0``: every completion is the argmax continuation."""
        return self.temperature == 0


@dataclass(frozen=True)
class Completion:
    """One sampled completion of one prompt."""

    prompt_index: int
    text: str
    """The decoded completion without special tokens (no trailing EOS)."""
    token_ids: tuple[int, ...]
    """Sampled token ids; when ``finish_reason == 'stop'`` the last one is the EOS token."""
    logprobs: tuple[float, ...]
    """Sampling logprob of each token in ``token_ids`` under the engine's weights (module doc)."""
    finish_reason: Literal["stop", "length"]

    @property
    def truncated(self) -> bool:
        """True when the completion hit ``max_new_tokens`` before EOS."""
        return self.finish_reason == "length"


#: ``on_done(prompt_index, completions)``: prompt ``prompt_index``'s whole group is sampled.
#: Called once per prompt of a ``generate`` call, on the thread that called it, in any order
#: (as groups finish), before ``generate`` returns the same completions. Engines that cannot
#: tell earlier report every group after generating (``report_groups``).
GroupDone = Callable[[int, list[Completion]], None]


def report_groups(
    groups: Sequence[list[Completion]], on_done: GroupDone | None, first: int = 0
) -> None:
    """Call ``on_done`` for each of ``groups`` (prompt indices from ``first``), if given.

    >>> seen = []
    >>> report_groups([[], []], lambda i, group: seen.append(i), first=3)
    >>> seen
    [3, 4]
    """
    if on_done is not None:
        for offset, group in enumerate(groups):
            on_done(first + offset, group)


class EngineDied(RuntimeError):
    """The rollout engine's processes ended under a request (``what``: generate, sync...).

    ``cause`` names the process and how it ended (``processes.describe_exit``). The trainer's
    state (policy, optimizer, data position) lives in the trainer, not the engine: after a stop
    request this is part of the stop; otherwise the run ends with one line naming the cause.
    """

    def __init__(self, cause: str, what: str) -> None:
        super().__init__(f"the rollout engine died during {what}: {cause}")
        self.cause, self.what = cause, what


class LostEngine:
    """Stands in for an engine that died (or was never started) while a run stops.

    Anything that would need it raises ``EngineDied``; ``close`` has nothing left to do.
    """

    name = "lost"
    last_sync_seconds = 0.0

    def __init__(self, cause: str) -> None:
        self.cause = cause

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        on_done: GroupDone | None = None,
    ) -> list[list[Completion]]:
        """Raise ``EngineDied``: there is no engine to generate with."""
        raise EngineDied(self.cause, "generate")

    def shares_weights(self, model: torch.nn.Module) -> bool:
        """Return False: nothing generates with ``model``."""
        return False

    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Raise ``EngineDied``: there is no engine to load weights into."""
        raise EngineDied(self.cause, "weight sync")

    def sleep(self, level: Literal[1, 2] = 1) -> bool:
        """Return False: nothing to put to sleep."""
        return False

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing: the dead engine was cleaned up when it was found dead."""


class RolloutEngine(Protocol):
    """What the trainer and evaluation need from a generation backend."""

    name: str
    last_sync_seconds: float
    """Wall time of the latest ``sync_weights`` call (0.0 before the first one)."""

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        on_done: GroupDone | None = None,
    ) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions for each prompt; outer list in prompt order.

        ``on_done``: called with each prompt's group as soon as it is done (``GroupDone``).
        """
        ...

    def shares_weights(self, model: torch.nn.Module) -> bool:
        """Tell whether the engine generates with ``model`` itself (nothing to sync then)."""
        ...

    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load the trainer's current weights (``weight_export.export_state_dict``) into the engine.

        Called after each optimizer step; an engine sharing the trainer's module gets ``{}``.
        """
        ...

    def sleep(self, level: Literal[1, 2] = 1) -> bool:
        """Free generation memory during the update if the engine can; return whether it slept."""
        ...

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Undo ``sleep``: all of it, or the memory kinds named.

        The kinds are vLLM's (``"weights"``, ``"kv_cache"``). An engine that slept wakes whatever
        is still asleep before it generates.
        """
        ...

    def close(self) -> None:
        """Free the engine's processes and memory."""
        ...


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine that loads weights as a stream of (name, tensor) pairs (vLLM, the servers).

    ``weight_export.sync_rollout_weights`` hands it ``export_stream``: no state dict of the
    whole model is built for a sync.
    """

    wants_weights: bool
    """Whether this rank's stream carries tensors (False: it only takes part in the gathers)."""

    def sync_weight_stream(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the pairs as they come; consume the iterator to its end."""
        ...


def check_prompts(
    prompt_token_ids: Sequence[Sequence[int]], vocab_size: int, max_prompt_tokens: int | None = None
) -> list[list[int]]:
    """Validate prompts before they reach a backend; return them as lists of ints.

    Raises ``ValueError`` naming the offending prompt for an empty prompt, a token id outside
    ``[0, vocab_size)``, or a prompt longer than ``max_prompt_tokens`` (the engine's context minus
    the completion budget), instead of a failure deep inside the model.
    """
    prompts: list[list[int]] = []
    for i, ids in enumerate(prompt_token_ids):
        if isinstance(ids, str):
            raise TypeError(f"prompt {i} is a string; engines take token ids (tokenize first)")
        row = [int(t) for t in ids]
        if not row:
            raise ValueError(f"prompt {i} is empty")
        bad = [t for t in row if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size}): {bad[:5]}")
        if max_prompt_tokens is not None and len(row) > max_prompt_tokens:
            raise ValueError(
                f"prompt {i} has {len(row)} tokens but the engine allows {max_prompt_tokens} "
                "(its max_model_len minus max_new_tokens); truncate prompts or raise max_model_len"
            )
        prompts.append(row)
    return prompts


#: vLLM's sleep-mode memory kinds (``LLM.wake_up(tags=...)``).
WEIGHTS = ("weights",)
SLEEP_TAGS = ("weights", "kv_cache")


@contextlib.contextmanager
def engine_asleep(engine: RolloutEngine, level: Literal[1, 2] = 1) -> Iterator[bool]:
    """Put a colocated engine to sleep during the update and wake its weights for the sync.

    Yields whether the engine slept (``RolloutEngine.sleep``: vLLM's sleep mode on CUDA frees
    the KV cache and offloads or drops the weights; other engines stay awake). Only the weights
    come back here: the sync loads into them while the KV cache is still free, so the trainer's
    export buffers and the engine's KV cache are never on the GPU together; the engine
    reallocates its KV cache once the weights are loaded, or before it generates (vLLM's
    ``wake_up(tags=["weights"])``, then ``["kv_cache"]``).
    """
    slept = engine.sleep(level)
    try:
        yield slept
    finally:
        if slept:
            engine.wake_up(WEIGHTS)
