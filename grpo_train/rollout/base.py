"""The rollout-engine contract shared by the vLLM and HF engines.

The trainer tokenizes prompts itself (chat template, length checks) and hands the engine token ids;
the engine returns ``n`` sampled completions per prompt with the sampling logprob of every token,
and can load new weights from the trainer after each update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample completions."""

    n: int = 8
    """Completions per prompt (the GRPO group size)."""
    max_new_tokens: int = 256
    """Hard cap on completion length in tokens; longer completions are cut (finish_reason 'length')."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = -1
    """Top-k sampling (-1: off)."""
    seed: int | None = None
    """Seed for the sampler; None draws from the engine's generator."""


@dataclass(frozen=True)
class Completion:
    """One sampled completion of one prompt."""

    prompt_index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """Sampling logprob of each token in ``token_ids`` under the engine's weights."""
    finish_reason: Literal["stop", "length"]

    @property
    def truncated(self) -> bool:
        """True when the completion hit ``max_new_tokens`` before EOS."""
        return self.finish_reason == "length"


class RolloutEngine(Protocol):
    """What the trainer and evaluation need from a generation backend."""

    name: str

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions for each prompt; outer list in prompt order."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the trainer's current weights into the engine (after each optimizer step)."""
        ...

    def close(self) -> None:
        """Free the engine's processes and memory."""
        ...
