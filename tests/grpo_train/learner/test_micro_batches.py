"""Token-budget micro-batches: padding, prompt grouping, packing and completion bins."""

import random

import pytest

from grpo_train.learner.micro_batches import (
    ForwardCost,
    completion_bins,
    make_micro_batches,
    packing_pays,
)


def test_micro_batches_pad_prompts_left_and_completions_right():
    prompts = [[5, 6, 7], [8], [9, 10]]
    completions = [[1, 2], [3, 4, 4, 4], [2]]
    batches = make_micro_batches(prompts, completions, token_budget=10, pad_id=0)
    assert sorted(r for b in batches for r in b.rows) == [0, 1, 2]
    for b in batches:
        assert b.input_ids.numel() <= 10 or len(b.rows) == 1
        for k, row in enumerate(b.rows):
            c = completions[row]
            assert b.completion_ids[k, : len(c)].tolist() == c
            assert b.completion_mask[k].sum().item() == len(c)
            p_len = b.input_ids.shape[1] - b.completion_ids.shape[1]
            assert b.input_ids[k, p_len - len(prompts[row]) : p_len].tolist() == prompts[row]
            first = p_len - len(prompts[row])
            assert b.position_ids[k, first].item() == 0  # positions count from the first real token


def test_make_micro_batches_select_keeps_full_batch_row_indices():
    prompts, completions = [[5], [6, 7], [8], [9]], [[1], [2, 3], [4], [5, 6]]
    batches = make_micro_batches(prompts, completions, 100, pad_id=0, select=[1, 3])
    assert [b.rows for b in batches] == [(3, 1)]  # shortest first
    assert batches[0].completion_ids.tolist() == [[5, 6], [2, 3]]


@pytest.mark.parametrize(
    ("lengths", "owners", "capacity", "expected"),
    [
        ([64, 20, 30, 64, 10, 50], [0, 0, 0, 1, 1, 1], 64, [[0], [2, 1], [3], [5, 4]]),
        ([3, 3, 3], [0, 0, 0], 3, [[0], [1], [2]]),  # all full: one bin per row
        ([1, 1, 1, 1], [0, 0, 0, 0], 4, [[0, 1, 2, 3]]),
        ([2, 2, 2], [0, 1, 0], 4, [[0, 2], [1]]),  # rows of another prompt never join
        ([0, 4, 0], [0, 0, 0], 4, [[1, 0, 2]]),  # empty completions take no room
    ],
)
def test_completion_bins_hand_cases(lengths, owners, capacity, expected):
    assert completion_bins(lengths, owners, capacity) == expected


def test_completion_bins_hold_each_row_once_within_capacity_and_one_prompt():
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 40)
        lengths = [rng.randint(0, 50) for _ in range(n)]
        owners = [rng.randint(0, 4) for _ in range(n)]
        capacity = max(lengths) or 1
        bins = completion_bins(lengths, owners, capacity)
        assert sorted(r for b in bins for r in b) == list(range(n))
        assert all(sum(lengths[r] for r in b) <= capacity for b in bins)
        assert all(len({owners[r] for r in b}) == 1 for b in bins)
        # never more token positions than the padded rows: one bin per row at worst
        assert len(bins) <= n


@pytest.mark.parametrize(
    ("attention", "varlen", "bins"),
    [("sdpa", False, True), ("eager", False, True), ("flash_attention_2", True, False)],
)
def test_forward_cost_knows_where_completions_share_bins(attention, varlen, bins):
    from types import SimpleNamespace

    config = SimpleNamespace(
        hidden_size=64, num_hidden_layers=2, vocab_size=1000, _attn_implementation=attention
    )
    cost = ForwardCost.of(config)
    assert (cost.varlen, cost.bins) == (varlen, bins)


def test_packing_pays_counts_the_shared_forwards_bins():
    """One truncated completion of 64 and seven of 8 under a 30-token prompt: padded rows cost
    30 + 8 x 64 = 542 positions, more than the pack's 8 x 30 + 64 + 56 = 360; in bins (64 |
    7 x 8) the shared forward costs 30 + 2 x 64 = 158."""
    prompts = [[1] * 30] * 8
    completions = [[2] * 64] + [[3] * 8] * 7
    assert packing_pays(prompts, completions, 10**6, cost=ForwardCost(bins=False))
    assert not packing_pays(prompts, completions, 10**6, cost=ForwardCost(bins=True))


def test_group_prompts_keeps_each_prompts_completions_together():
    prompts = [[1, 2], [3], [1, 2], [3], [1, 2]]
    completions = [[5, 5, 5], [6], [7], [8, 8, 8, 8], [9, 9]]
    batches = make_micro_batches(prompts, completions, 1000, pad_id=0, group_prompts=True)
    assert [b.rows for b in batches] == [(1, 3, 2, 4, 0)]  # prompt [3], then [1, 2]
    split = make_micro_batches(prompts, completions, 10, pad_id=0, group_prompts=True)
    assert all(b.input_ids.numel() <= 10 or len(b.rows) == 1 for b in split)
    assert sorted(r for b in split for r in b.rows) == [0, 1, 2, 3, 4]


def test_micro_batch_to_moves_every_tensor_and_keeps_rows():
    (mb,) = make_micro_batches([[1, 2], [3]], [[4], [5, 6]], token_budget=100, pad_id=0)
    assert mb.to("cpu") is mb  # built on the CPU: nothing to copy
    moved = mb.to("meta")
    tensors = ("input_ids", "attention_mask", "position_ids", "completion_ids", "completion_mask")
    assert all(getattr(moved, name).device.type == "meta" for name in tensors)
    assert moved.rows == mb.rows and moved.input_ids.shape == mb.input_ids.shape


def _packing(lengths: list[int], budget: int) -> list[list[int]]:
    """The trainer's micro-batches of rows with these total lengths (prompt of 1 + completion)."""
    prompts = [[1] for _ in lengths]
    completions = [[2] * (n - 1) for n in lengths]
    return [list(mb.rows) for mb in make_micro_batches(prompts, completions, budget, pad_id=0)]


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([3, 1, 2], 4, [[1, 2], [0]]),
        ([4, 4, 4, 4], 8, [[0, 1], [2, 3]]),
        ([4, 4, 4, 4], 16, [[0, 1, 2, 3]]),
        ([10, 2, 2], 5, [[1, 2], [0]]),  # the long row gets its own micro-batch
        ([5, 5, 1], 4, [[2], [0], [1]]),  # every row is over budget except the short one
        ([2, 3, 3, 7, 1], 9, [[4, 0, 1], [2], [3]]),
    ],
)
def test_micro_batches_hand_cases(
    lengths: list[int], budget: int, expected: list[list[int]]
) -> None:
    """Shortest first, packed greedily while rows x longest row fits the token budget."""
    assert _packing(lengths, budget) == expected


def test_micro_batches_fit_the_budget() -> None:
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 30))]
        budget = rng.randint(16, 200)
        groups = _packing(lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= budget
