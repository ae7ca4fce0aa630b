"""The rollout batch: one step's prompts, completions and rewards, immutable and tensor-first.

``collect`` produces scored ``Group`` records (the text and scores, for logging); the update reads
only a ``RolloutBatch`` built from them: per-prompt tensors of shape (P, G) for rewards and
masks, and per-completion (row) token ids, sampling logprobs and a per-token loss mask. Rows are
group-major: row ``p * G + g`` is completion ``g`` of prompt ``p``.

The loss mask marks the tokens whose log-probability is trained. Sampled completions train on
every token; a multi-turn episode (tool calls with execution feedback, an environment's reply
inside the completion) keeps the tokens it did not sample in the row for the forward pass, but
masks them out: they get no gradient and do not count in the loss normalisers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from grpo_train.collect.groups import Group


@dataclass(frozen=True)
class RolloutBatch:
    """One rank's share of a step: ``P`` prompts with ``G`` scored completions each.

    >>> batch = RolloutBatch(
    ...     prompt_ids=((1, 2),),
    ...     completion_ids=((3, 4, 5), (6,)),
    ...     loss_mask=(torch.tensor([True, False, True]), torch.tensor([True])),
    ...     sampling_logprobs=((-0.1, -0.2, -0.3), (-0.4,)),
    ...     rewards=torch.tensor([[1.0, 0.0]], dtype=torch.float64),
    ...     scored=torch.tensor([[True, True]]),
    ...     trainable=torch.tensor([[True, True]]),
    ...     truncated=torch.tensor([[False, False]]),
    ...     env_index=torch.tensor([0]),
    ... )
    >>> batch.group_size, batch.trainable.tolist(), batch.row_prompts()
    (2, [[True, True]], [(1, 2), (1, 2)])
    >>> batch.trained_tokens(torch.ones(2))
    3
    """

    prompt_ids: tuple[tuple[int, ...], ...]
    """(P,) prompt token ids."""
    completion_ids: tuple[tuple[int, ...], ...]
    """(P * G,) completion token ids, group-major."""
    loss_mask: tuple[torch.Tensor, ...]
    """(P * G,) bool per token of each completion: True where the token is trained."""
    sampling_logprobs: tuple[tuple[float, ...], ...]
    """(P * G,) the rollout engine's logprob of each completion token."""
    rewards: torch.Tensor
    """(P, G) float64 rewards (0 for a failed score)."""
    scored: torch.Tensor
    """(P, G) bool: False where scoring failed."""
    trainable: torch.Tensor
    """(P, G) bool: in the baseline and the loss (scored, in a group with enough scored)."""
    truncated: torch.Tensor
    """(P, G) bool: the completion hit ``max_new_tokens`` before EOS."""
    env_index: torch.Tensor
    """(P,) long: the environment of each prompt."""
    samples: tuple[Group, ...] = field(default=(), repr=False)
    """The scored groups this batch was built from (texts and scores, for logging)."""
    padding: bool = False
    """True when this rank trains nothing and runs its rows only to keep collectives in step."""
    row_of: tuple[int, ...] = ()
    """Rows after the ``P * G`` ones: the later training sequences of ``rerender`` episodes, each
    the index of its episode's row (whose advantage and masks it shares)."""
    extra_prompts: tuple[tuple[int, ...], ...] = ()
    """The prompt of each extra row: the re-rendered history its turn was sampled from."""

    def __post_init__(self) -> None:
        if self.rewards.ndim != 2:
            raise ValueError(f"rewards must be (prompts, group), got {tuple(self.rewards.shape)}")
        p, g = self.rewards.shape
        for name in ("scored", "trainable", "truncated"):
            if tuple(getattr(self, name).shape) != (p, g):
                raise ValueError(f"{name} must have shape {(p, g)} like rewards")
        if len(self.prompt_ids) != p:
            raise ValueError(f"prompt_ids has {len(self.prompt_ids)} prompts, rewards {p}")
        for name in ("completion_ids", "loss_mask", "sampling_logprobs"):
            if len(getattr(self, name)) != p * g + len(self.row_of):
                got = len(getattr(self, name))
                raise ValueError(
                    f"{name} needs {p * g + len(self.row_of)} rows (P * G + extra), got {got}"
                )
        if len(self.extra_prompts) != len(self.row_of):
            raise ValueError("extra_prompts needs one prompt per extra row (row_of)")
        if any(not 0 <= r < p * g for r in self.row_of):
            raise ValueError(f"row_of must index the P * G = {p * g} episode rows")
        for i, (ids, mask) in enumerate(zip(self.completion_ids, self.loss_mask)):
            if mask.shape != (len(ids),):
                raise ValueError(
                    f"loss_mask row {i} has shape {tuple(mask.shape)}; completion {i} has "
                    f"{len(ids)} tokens (one mask entry per token)"
                )

    @classmethod
    def from_groups(
        cls, groups: Sequence[Group], group_size: int, padding: bool = False
    ) -> RolloutBatch:
        """Return the batch of scored groups; every sampled token is trained.

        A group of episodes (``Group.episodes``) trains its sampled ids only: the ids its
        environment inserted stay in the row for the forward pass with loss mask 0.
        """
        completions = [c for g in groups for c in g.completions]
        extra = _forked_rows(groups, group_size)

        def table(values: list[list[bool]] | list[list[float]], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).reshape(len(groups), group_size)

        return cls(
            prompt_ids=tuple(tuple(g.prompt_ids) for g in groups),
            completion_ids=tuple(c.token_ids for c in completions) + tuple(e[2] for e in extra),
            loss_mask=tuple(_loss_masks(groups)) + tuple(e[3] for e in extra),
            sampling_logprobs=tuple(c.logprobs for c in completions) + tuple(e[4] for e in extra),
            rewards=table([g.rewards for g in groups], torch.float64),
            scored=table([g.scored for g in groups], torch.bool),
            trainable=table([g.trainable for g in groups], torch.bool),
            truncated=table([[c.truncated for c in g.completions] for g in groups], torch.bool),
            env_index=torch.tensor([g.env_index for g in groups], dtype=torch.long),
            samples=tuple(groups),
            padding=padding,
            row_of=tuple(e[0] for e in extra),
            extra_prompts=tuple(e[1] for e in extra),
        )

    @property
    def group_size(self) -> int:
        """``G``: completions per prompt."""
        return int(self.rewards.shape[1])

    def row_prompts(self) -> list[tuple[int, ...]]:
        """Return the prompt of each row."""
        rows = [p for p in self.prompt_ids for _ in range(self.group_size)]
        return rows + list(self.extra_prompts)

    def per_row(self, values: torch.Tensor) -> torch.Tensor:
        """Extend a flat ``(P * G,)`` tensor to every row (an extra row takes its episode's).

        >>> one = (torch.tensor([True]),) * 3
        >>> batch = RolloutBatch(
        ...     ((1,),), ((2,), (3,), (4,)), one, ((-0.1,),) * 3,
        ...     torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool),
        ...     torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 2, dtype=torch.bool),
        ...     torch.tensor([0]), row_of=(1,), extra_prompts=((1, 9),))
        >>> batch.per_row(torch.tensor([0.5, -0.5])).tolist(), batch.row_prompts()
        ([0.5, -0.5, -0.5], [(1,), (1,), (1, 9)])
        """
        if not self.row_of:
            return values
        return torch.cat([values, values[list(self.row_of)]])

    def trained_tokens(self, keep: torch.Tensor) -> int:
        """Count the tokens the loss trains: masked-in tokens of rows with ``keep`` 1."""
        return int(sum(float(m.sum()) * float(k) for m, k in zip(self.loss_mask, keep)))


def _forked_rows(
    groups: Sequence[Group], group_size: int
) -> list[tuple[int, tuple[int, ...], tuple[int, ...], torch.Tensor, tuple[float, ...]]]:
    """Return the later training sequences of ``rerender`` episodes as extra rows.

    Each is ``(episode row, prompt, completion ids, loss mask, sampling logprobs)``: the
    re-rendered history the turn was sampled from is the row's prompt (not trained), the
    sampled turn its completion, trained with the episode's advantage.
    """
    out = []
    for p, g in enumerate(groups):
        for k, episode in enumerate(g.episodes):
            for seq in episode.assembled.sequences[1:]:
                cut = seq.prompt_len
                mask = torch.tensor(seq.loss_mask[cut:], dtype=torch.bool)
                row = (p * group_size + k, seq.input_ids[:cut], seq.input_ids[cut:])
                out.append((*row, mask, seq.logprobs[cut:]))
    return out


def _loss_masks(groups: Sequence[Group]) -> list[torch.Tensor]:
    """Per row: True on every sampled token (an episode's inserted ids are False)."""
    masks: list[torch.Tensor] = []
    for g in groups:
        if g.episodes:
            masks.extend(torch.tensor(e.loss_mask, dtype=torch.bool) for e in g.episodes)
        else:
            masks.extend(torch.ones(len(c.token_ids), dtype=torch.bool) for c in g.completions)
    return masks
