"""The order tests are collected in, so that ``pytest -n N --dist worksteal`` ends together.

``worksteal`` hands worker ``i`` the ``i``-th contiguous block of the collection (block sizes as
its scheduler computes them: what is left, split evenly among the workers still to serve) and,
when a worker runs dry, moves the tail half of the longest queue to it. A long test queued at
the end of a block runs last, alone: with 2 workers a 5-minute end-to-end test left there is 5
minutes of one idle core. So each block starts with its share of the long tests, balanced by
their measured time (greedy longest-first, the LPT rule of Graham, "Bounds on Multiprocessing
Timing Anomalies", 1969), and ends with short tests in their usual order, which the stealing
evens out.

Tests that share a module- or class-scoped fixture form one unit: split across workers, each
worker would build the fixture again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

#: Seconds per long test (node id, with or without its parameters), from ``--durations`` under
#: ``-n 2``. A ``slow`` test missing here counts as ``DEFAULT_SLOW_S``, any other as short.
#: Only the order depends on these numbers: a stale one costs balance, never a result.
MEASURED_S: dict[str, float] = {
    # A fresh clone's .ci/run (2026-12-05, pytest 791 s under -n 2), once the in-process vLLM
    # engine became the CPU default:
    "tests/grpo_train/run/test_stop_signals.py::"
    "test_child_process_vllm_engine_start_generation_and_weight_sync": 124,
    "tests/grpo_train/run/test_stop_signals.py::"
    "test_vllm_engine_start_generation_and_weight_sync": 54,
    # A fresh clone's .ci/run on a quiet machine (2026-12-02, pytest 1011 s under -n 2):
    "tests/grpo_train/run/test_stop_signals.py::test_vllm_on_two_ranks_generation": 81,
    "tests/grpo_train/run/test_stop_signals.py::test_every_phase_two_ranks_hf": 77,
    "tests/test_readme_going_further.py::test_going_further_commands_run_as_written": 77,
    "tests/grpo_train/run/test_stop_signals.py::test_every_phase_one_process_hf": 76,
    "tests/grpo_train/run/test_stop_signals.py::"
    "test_a_killed_engine_process_is_one_line_naming_it_and_the_checkpoint": 57,
    "tests/grpo_train/test_eval_cli.py::test_cli_humaneval_end_to_end_vllm": 50,
    "tests/grpo_train/test_trainer.py::test_vllm_engine_few_steps_with_weight_sync": 45,
    "tests/grpo_train/test_trainer.py::test_vllm_engine_serves_the_merged_lora_policy": 42,
    "tests/grpo_train/collect/test_rollout_pipeline.py::"
    "test_vllm_async_run_trains_within_the_staleness_bound": 39,
    "tests/grpo_train/parallel/test_fsdp.py::"
    "test_fsdp_checkpoint_resume_matches_uninterrupted_run": 33,
    "tests/grpo_train/test_user_runs.py::"
    "test_base_model_lora_wandb_resume_then_eval_two_checkpoints": 29,
    "tests/test_own_data_e2e.py::test_a_data_file_is_an_environment_for_every_tool": 27,
    "tests/grpo_train/learner/test_logprobs.py::"
    "test_peak_memory_per_completion_token_is_bounded": 60,
    "tests/grpo_train/rollout/test_rollout_hf_memory.py::"
    "test_generation_memory_per_token_is_its_kv_cache[loop]": 45,
    "tests/grpo_train/rollout/test_rollout_hf_memory.py::"
    "test_generation_memory_per_token_is_its_kv_cache[generate]": 50,
    # Module fixtures (one vLLM or server start) count in their first test's unit: setup + call.
    "tests/grpo_train/rollout/test_tensor_parallel.py::"
    "test_tp2_engine_generates_what_one_engine_does": 60,
    "tests/grpo_train/rollout/test_server_tensor_parallel.py::"
    "test_tp2_server_samples_a_tp1_engines_tokens_and_syncs_to_the_trainers_logprobs": 60,
    # Measured at load 6-15 (a shared machine), 2026-12-03: four runs, the first builds the model.
    "tests/grpo_train/test_trainer_chat_templates.py::"
    "test_grpo_train_on_qwen3s_template_plays_multi_turn_episodes_token_exactly": 25,
    # Measured at load 3.8 (a race beside it), 2026-12-04: three GRPOTrainer builds.
    "tests/benchmarks/test_sampler_check.py::"
    "test_trl_trainer_draws_are_trls_own_batch_rendered_as_ours": 24,
}
DEFAULT_SLOW_S = 45.0


@dataclass(frozen=True)
class Unit:
    """Tests that must run on one worker, in this order, and their expected time."""

    indices: tuple[int, ...]
    seconds: float


def block_sizes(n_items: int, n_workers: int) -> list[int]:
    """How many tests worksteal hands each worker first (xdist 3.x ``check_schedule``).

    >>> block_sizes(10, 3)
    [3, 3, 4]
    """
    sizes, left = [], n_items
    for i in range(n_workers):
        sizes.append(left // (n_workers - i))
        left -= sizes[-1]
    return sizes


def worksteal_order(n_items: int, long_units: Sequence[Unit], n_workers: int) -> list[int]:
    """A permutation of ``range(n_items)``: each worker's block opens with its long units.

    Long units go, longest first, to the block with the least long time so far; the short
    tests (every index in no unit) keep their order and fill the blocks after them.

    >>> worksteal_order(8, [Unit((6,), 5.0), Unit((2, 3), 4.0), Unit((0,), 2.0)], 2)
    [6, 1, 4, 5, 2, 3, 0, 7]
    """
    loads = [0.0] * n_workers
    blocks: list[list[int]] = [[] for _ in range(n_workers)]
    for unit in sorted(long_units, key=lambda u: -u.seconds):
        target = min(range(n_workers), key=lambda w: (loads[w], w))
        blocks[target].extend(unit.indices)
        loads[target] += unit.seconds
    taken = {i for unit in long_units for i in unit.indices}
    short = iter(i for i in range(n_items) if i not in taken)
    order: list[int] = []
    for block, size in zip(blocks, block_sizes(n_items, n_workers), strict=True):
        order += block
        order += islice(short, max(0, size - len(block)))
    return order + list(short)
