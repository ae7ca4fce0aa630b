"""The order in which a run draws its training prompts: deterministic, weighted, resumable."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from grpo_train.checkpoint import SamplerState


class PromptSampler:
    """Deterministic, resumable prompt order over one or more weighted environments.

    The k-th draw picks an environment with ``Random(seed, k)`` by weight, then that environment's
    next row in a permutation reshuffled every epoch from ``(seed, env, epoch)``. The whole state
    is two counters (``SamplerState``), saved in checkpoints, so a resumed run draws the prompts
    the uninterrupted one would have drawn, and no epoch boundary can end training early.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Sequence[float],
        seed: int,
        state: SamplerState | None = None,
    ) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError(
                f"every environment needs at least one training row, got sizes {list(sizes)}"
            )
        self.sizes, self.weights, self.seed = list(sizes), list(weights), seed
        state = state or SamplerState(0, tuple(0 for _ in sizes))
        self.draws, self.positions = state.draws, list(state.positions)

    def next(self) -> tuple[int, int]:
        """Return the next (environment index, row index) and advance."""
        pick = random.Random(self.seed * 1_000_003 + self.draws)
        env = pick.choices(range(len(self.sizes)), self.weights)[0]
        epoch, offset = divmod(self.positions[env], self.sizes[env])
        order = np.random.default_rng([self.seed, env, epoch]).permutation(self.sizes[env])
        self.draws += 1
        self.positions[env] += 1
        return env, int(order[offset])

    def restart(self, env: int, size: int) -> None:
        """Draw environment ``env``'s rows anew, from ``size`` rows (a new curriculum stage)."""
        if size < 1:
            raise ValueError(f"environment {env}: the new stage has no training rows")
        self.sizes[env], self.positions[env] = size, 0

    def state(self) -> SamplerState:
        """Return the counters to save in a checkpoint."""
        return SamplerState(self.draws, tuple(self.positions))
