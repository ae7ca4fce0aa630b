"""Prompt groups and where they come from: prompt sampler, encoding, engine, safe scoring.

The trainer draws prompts with ``PromptSampler`` (resumable: its state is two counters), encodes
them with ``encode_prompt``, generates a ``Group`` of completions per prompt with the engine from
``build_engine`` and scores them with ``safe_scores``, which turns every scorer failure into a
typed zero-reward ``Score`` (``grpo_train.scoring``). Failed items are left out of their group
(``Group.scored``); a group with fewer than ``MIN_SCORED`` scored items is dropped.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo_envs.base import Environment
from grpo_envs.types import Sample, Score
from grpo_envs.wrappers import guarded_scores
from grpo_train import prompts
from grpo_train.checkpoint import SamplerState
from grpo_train.prompts import PromptFormat
from grpo_train.rollout.base import Completion, RolloutEngine
from grpo_train.scoring import scoring_failed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from grpo_train.config import DataConfig, TrainConfig


@dataclass(frozen=True)
class Group:
    """One prompt and its scored completions: the record a step logs (texts, scores)."""

    sample: Sample
    env_index: int
    prompt_ids: list[int]
    completions: list[Completion] = field(default_factory=list)
    scores: list[Score] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        """Return the reward of each completion (a failed score's is 0)."""
        return [s.reward for s in self.scores]

    @property
    def scored(self) -> list[bool]:
        """Per completion: False where scoring failed (no reward to learn from)."""
        return [not scoring_failed(s) for s in self.scores]

    @property
    def dropped(self) -> bool:
        """True when fewer than ``MIN_SCORED`` completions were scored: no baseline to compare."""
        return sum(self.scored) < MIN_SCORED

    @property
    def trainable(self) -> list[bool]:
        """Per completion: whether it enters the baseline and the loss."""
        return [ok and not self.dropped for ok in self.scored]

    @property
    def informative(self) -> bool:
        """Return whether the scored rewards differ (equal rewards give zero advantage)."""
        return len({r for r, ok in zip(self.rewards, self.trainable) if ok}) > 1


#: A group needs at least two scored completions for a group-relative advantage.
MIN_SCORED = 2


@dataclass
class SignalGuard:
    """Notice a run that is not learning because its groups' rewards all agree.

    A group whose completions all get the same reward has zero advantage: no gradient. When at
    least ``threshold`` of the groups are like that for ``patience`` steps in a row, ``update``
    returns True, once per run; ``advice`` is the line to print.

    >>> guard = SignalGuard(threshold=0.75, patience=2)
    >>> [guard.update(f) for f in (0.9, 0.5, 0.8, 1.0, 1.0)]
    [False, False, False, True, False]
    """

    # 0.9, not "most": the embedded default run starts with 3 of 4 groups all wrong (its sampled
    # accuracy is 3% at step 1) and learns fast; the guard is for runs where nearly nothing does.
    threshold: float = 0.9
    patience: int = 3
    streak: int = 0
    fired: bool = False

    def update(self, frac_zero_std: float) -> bool:
        """Record one step's share of equal-reward groups; True when the guard fires."""
        self.streak = self.streak + 1 if frac_zero_std >= self.threshold else 0
        if self.fired or self.streak < self.patience:
            return False
        self.fired = True
        return True

    def advice(self, step: int, config: TrainConfig, dynamic_sampling_now_on: bool) -> str:
        """One line: what happened and what to try, with this run's numbers."""
        r = config.rollout
        tries = [
            "dynamic_sampling=true (drop equal-reward groups, draw more prompts)"
            if not dynamic_sampling_now_on
            else "more dynamic_sampling_rounds",
            f"a higher temperature (now {r.temperature:g})",
            f"larger groups (num_generations, now {r.num_generations})",
            "a reward with partial credit (e.g. step_credit for arithmetic chains)",
            "an easier curriculum (a lower difficulty first)",
        ]
        now = (
            "; dynamic_sampling=auto is now on for the rest of the run"
            if dynamic_sampling_now_on
            else ""
        )
        return (
            f"learning signal: at step {step}, >= {self.threshold:.0%} of groups had equal "
            f"rewards (no gradient) for {self.patience} steps in a row{now}. Try: "
            + "; ".join(tries)
        )


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

    def state(self) -> SamplerState:
        """Return the counters to save in a checkpoint."""
        return SamplerState(self.draws, tuple(self.positions))


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    sample: Sample,
    max_len: int,
    fmt: PromptFormat | None = None,
) -> tuple[list[int], bool]:
    """Return a prompt's token ids (the last ``max_len``) and whether it was cut.

    The one encoding shared with ``grpo eval`` (``grpo_train.prompts``): the chat template (or
    the plain-text format for base models), the run's system prompt and template kwargs.
    """
    encoded = prompts.encode_prompt(tokenizer, sample, fmt, max_len)
    return encoded.ids, encoded.cut


def safe_scores(env: Environment, texts: Sequence[str], samples: Sequence[Sample]) -> list[Score]:
    """Score completions; any failure or malformed reward becomes reward 0 with outcome ``error``.

    The one guard of grpo-kit (``grpo_envs.wrappers.guarded_scores``, which ``make`` also puts
    around every environment), applied here too for environments built without ``make``: without
    it a raising reward would stop training and a None/NaN reward would poison the advantages.
    """
    return guarded_scores(env, list(texts), list(samples))


def check_splits(envs: Sequence[Environment], names: Sequence[str], data: DataConfig) -> None:
    """Fail early, with the fix, when an environment lacks the train or eval split."""
    wanted = [data.train_split] + ([data.eval_split] if data.eval_size else [])
    for env, name in zip(envs, names):
        if missing := [s for s in wanted if s not in env.splits]:
            raise ValueError(
                f"{name} has no split {missing} (it has {list(env.splits)}); set train_split / "
                "eval_split to one of them, or eval_size=0 to skip evaluation"
            )


def build_engine(
    config: TrainConfig, model_path: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> RolloutEngine:
    """Build the configured rollout engine (``auto``: vLLM when importable, else HF generate).

    The HF engine shares the trainer's module, so its weight sync is free (a sharded module: a
    copy loaded from ``model_path``); vLLM loads ``model_path`` and receives new weights through
    ``sync_weights`` after each update.
    """
    from grpo_train.rollout import make_engine

    name = config.rollout.engine
    if name == "auto":
        name = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    dtype = config.policy.dtype
    if name == "hf":
        from grpo_train.distributed import every_rank_loads_weights
        from grpo_train.weight_export import is_sharded

        if not is_sharded(model):
            return make_engine("hf", model_path, model=model, tokenizer=tokenizer, dtype=dtype)
        # A sharded (FSDP / ZeRO-3) policy cannot generate on one rank alone: its forwards
        # all-gather across ranks, and ranks decode different lengths (and only rank 0
        # evaluates). The engine then keeps its own full copy, refreshed by the weight sync.
        with every_rank_loads_weights():
            return make_engine("hf", model_path, tokenizer=tokenizer, dtype=dtype)
    from grpo_train.distributed import vllm_colocate_kwargs

    # Under `accelerate launch` each rank's engine joins the job (external_launcher) with its
    # own sampling seed; a single process gets just the seed.
    extra: dict[str, Any] = dict(vllm_colocate_kwargs(config.run.seed))
    if config.rollout.vllm_sleep_mode:
        extra["enable_sleep_mode"] = True
    if config.rollout.vllm_in_process:
        extra["in_process"] = True
    return make_engine(
        "vllm",
        model_path,
        dtype=dtype,
        max_model_len=config.data.max_prompt_length + config.rollout.max_completion_length,
        gpu_memory_utilization=config.rollout.vllm_memory_fraction,
        cpu_kv_cache_gib=config.rollout.vllm_cpu_kv_cache_gib,
        **extra,
    )
