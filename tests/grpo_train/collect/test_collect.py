"""``collect.call_seed``: every completion of a run draws its own random stream."""

from __future__ import annotations

import pytest

from grpo_train.collect.collector import STEP_STRIDE, call_seed


@pytest.mark.parametrize(("prompts", "n"), [(4, 8), (16, 8), (64, 16), (12, 8)])
def test_no_two_completions_of_a_run_share_a_seed(prompts: int, n: int) -> None:
    # Every step with dynamic sampling's refill rounds: engines seed completion i of a call with
    # base + i, so the ranges [base, base + width) must never meet.
    width = prompts * n
    seen: set[int] = set()
    for step in range(40):
        for round_ in range(4):
            base = call_seed(7, step, round_, width)
            seeds = set(range(base, base + width))
            assert not seeds & seen, (step, round_)
            seen |= seeds
    assert len(seen) == 40 * 4 * width


def test_the_first_round_of_a_narrow_step_samples_as_before() -> None:
    # Runs and references made with the original stride keep their samples.
    assert [call_seed(2, s, 0, STEP_STRIDE) for s in range(3)] == [2_000_006, 2_000_107, 2_000_208]
    # Before, a refill round was base + 1: round 0's streams shifted by one completion.
    assert call_seed(2, 1, 1, 32) not in range(call_seed(2, 1, 0, 32), call_seed(2, 1, 0, 32) + 32)
    # Another run seed, another stream.
    assert call_seed(2, 1, 1, 32) != call_seed(3, 1, 1, 32)
