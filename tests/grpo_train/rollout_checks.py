"""Checks shared by the HF and vLLM engine tests (not a test module)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from grpo_train.collect.batch import RolloutBatch
from grpo_train.rollout.base import Completion
from grpo_train.trainer import Trainer

PROMPTS: list[list[int]] = [[1, 85, 350, 79, 201], [5, 6, 7, 8, 9, 10, 11, 12, 13], [300]]


def forward_logprobs(
    model: torch.nn.Module, prompt: Sequence[int], completion: Sequence[int], temperature: float
) -> torch.Tensor:
    """The trainer's view: log_softmax(logits / T) of each completion token, one forward pass."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / scale, dim=-1)
    return logp.gather(1, torch.tensor(list(completion))[:, None])[:, 0]


def max_logprob_gap(
    model: torch.nn.Module,
    groups: list[list[Completion]],
    prompts: Sequence[Sequence[int]],
    temperature: float,
) -> float:
    """Largest |engine logprob - trainer logprob| over all tokens of all completions."""
    gap = 0.0
    for group in groups:
        for c in group:
            ref = forward_logprobs(model, prompts[c.prompt_index], c.token_ids, temperature)
            gap = max(gap, (ref - torch.tensor(c.logprobs)).abs().max().item())
    return gap


def check_groups(
    groups: list[list[Completion]],
    n: int,
    max_new_tokens: int,
    eos_ids: set[int],
    decode: object,
) -> None:
    """Shape and consistency checks every engine's output must pass."""
    assert len(groups) == len(PROMPTS)
    for index, group in enumerate(groups):
        assert len(group) == n
        for c in group:
            assert c.prompt_index == index
            assert 1 <= len(c.token_ids) <= max_new_tokens
            assert len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 1e-6 for lp in c.logprobs)
            assert c.text == decode(list(c.token_ids), skip_special_tokens=True)  # type: ignore[operator]
            eos_positions = [i for i, t in enumerate(c.token_ids) if t in eos_ids]
            if c.finish_reason == "stop":
                assert eos_positions == [len(c.token_ids) - 1]
                assert not c.truncated
            else:
                assert eos_positions == []
                assert len(c.token_ids) == max_new_tokens
                assert c.truncated


def train_keeping_batches(trainer: Trainer, monkeypatch: pytest.MonkeyPatch) -> list[RolloutBatch]:
    """Run ``trainer`` to the end (closing it) and return every batch its updates trained on."""
    batches: list[RolloutBatch] = []
    original = Trainer.update

    def spy(self: Trainer, step: int, batch: RolloutBatch, advantages: torch.Tensor):
        batches.append(batch)
        return original(self, step, batch, advantages)

    monkeypatch.setattr(Trainer, "update", spy)
    try:
        trainer.train()
    finally:
        trainer.close()
    return batches
