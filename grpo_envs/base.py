"""The environment interface: a dataset of prompts plus a deterministic scorer.

Owned by the registry/contract work (issue 3); the trainer and evaluation code only rely on the
methods declared here: ``dataset``, ``splits``, ``score``, ``score_batch``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import datasets

from grpo_envs.types import Sample, Score


class Environment(ABC):
    """Base class for every environment.

    Subclasses set ``splits`` and implement ``_build_split`` and ``score``. ``env_id`` is filled in
    by ``grpo_envs.make``.
    """

    env_id: str = ""
    splits: tuple[str, ...] = ("train", "test")

    @abstractmethod
    def dataset(self, split: str = "train") -> datasets.Dataset:
        """The rows of ``split`` (columns: id, prompt, answer, env_id, metadata; see ``Sample``)."""

    @abstractmethod
    def score(self, completion: str, sample: Sample | Mapping[str, object]) -> Score:
        """Score one completion (the model's text only, without the prompt) for ``sample``."""

    def score_batch(
        self,
        completions: Sequence[str],
        samples: Sequence[Sample | Mapping[str, object]],
    ) -> list[Score]:
        """Score many completions; results in input order. Never raises for one bad item."""
        raise NotImplementedError
