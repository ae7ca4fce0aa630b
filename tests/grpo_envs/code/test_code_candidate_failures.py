"""Through ``grpo_envs.make``: what a candidate returns or raises is its failure, and stays in
training; only a real sandbox failure leaves an item out.

The trainer drops items whose outcome is ``ERROR`` or ``SANDBOX_ERROR`` from the group baseline
and the loss (``grpo_train.collect.score_failures.scoring_failed``). A candidate that could make
its own job a sandbox error would escape the penalty of a wrong answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.types import Outcome, Sample
from grpo_train.collect.score_failures import scoring_failed

#: Bodies of ``has_close_elements`` (HumanEval/0) that solve nothing.
HOSTILE = {
    "an int that cannot be printed": "return 10 ** 5000",
    "100 levels deep": "v = 0\n    for _ in range(100):\n        v = [v]\n    return v",
    "StopIteration": "raise StopIteration",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "its own exception with a hostile str": (
        "class E(Exception):\n        def __str__(self):\n            raise E()\n    raise E()"
    ),
    "a lone surrogate": "return chr(0xD800)",
}


@pytest.fixture(scope="module")
def humaneval() -> grpo_envs.Environment:
    return grpo_envs.make("code/humaneval-v0", workers=1)


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_humaneval_candidate_failures_are_failures_not_sandbox_errors(
    humaneval: grpo_envs.Environment, how: str
) -> None:
    sample = Sample.from_row(humaneval.dataset("test")[0])
    hostile = f"```python\ndef has_close_elements(numbers, threshold):\n    {HOSTILE[how]}\n```"
    honest = f"```python\n{sample.answer}\n```"
    hostile_score, honest_score = humaneval.score_batch([hostile, honest], [sample] * 2)
    assert hostile_score.reward == 0.0
    assert hostile_score.outcome in (Outcome.FAILED, Outcome.RUNTIME_ERROR), hostile_score
    assert not scoring_failed(hostile_score)  # it stays in the group and gets its penalty
    assert honest_score.reward == 1.0 and honest_score.outcome is Outcome.PASSED


#: MBPP-style tasks whose trusted tests a hostile candidate used to defeat: (tests, honest
#: solution, hostile solution).
MBPP_CASES = {
    "unprintable value in the assertion message": (
        ["assert square(3) == 9", "assert square(2) == 4, square(2)"],
        "def square(x):\n    return x * x\n",
        "def square(x):\n    return 9 if x == 3 else 10 ** 5000\n",
    ),
    "StopIteration inside map": (
        ["assert is_odd(1)", "assert all(map(is_odd, [3, 5, 7]))", "assert is_odd(2) is False"],
        "def is_odd(x):\n    return x % 2 == 1\n",
        "def is_odd(x):\n    if x > 2:\n        raise StopIteration\n    return x == 1\n",
    ),
    "a returned value passed back": (
        ["assert depth(depth(0)) == 100"],
        "def depth(x):\n"
        "    if not isinstance(x, list):\n"
        "        v = 0\n"
        "        for _ in range(100):\n"
        "            v = [v]\n"
        "        return v\n"
        "    n = 0\n"
        "    while isinstance(x, list):\n"
        "        x, n = x[0], n + 1\n"
        "    return n\n",
        "def depth(x):\n    v = 0\n    for _ in range(100):\n        v = [v]\n    return v\n",
    ),
}


@pytest.mark.parametrize("case", sorted(MBPP_CASES))
def test_mbpp_candidate_failures_stay_in_training(tmp_path: Path, case: str) -> None:
    tests, honest, hostile = MBPP_CASES[case]
    row = {
        "task_id": 903,
        "text": case,
        "code": honest,
        "test_list": tests,
        "test_setup_code": "",
        "challenge_test_list": [],
    }
    data = tmp_path / "mbpp.jsonl"
    data.write_text(json.dumps(row) + "\n")
    env = grpo_envs.make("code/mbpp-v0", data_files=str(data), workers=1)
    sample = Sample.from_row(env.dataset("test")[0])
    honest_score, hostile_score = env.score_batch(
        [f"```python\n{honest}```", f"```python\n{hostile}```"], [sample] * 2
    )
    assert honest_score.reward == 1.0, honest_score
    assert hostile_score.reward == 0.0, hostile_score
    assert hostile_score.outcome in (Outcome.FAILED, Outcome.RUNTIME_ERROR), hostile_score
    assert not scoring_failed(hostile_score)


def test_a_real_sandbox_failure_is_still_left_out(tmp_path: Path) -> None:
    """A task whose own test data the sandbox cannot send (a function as an argument)."""
    row = {
        "task_id": 902,
        "text": "Apply f to 2.",
        "code": "def apply(f):\n    return f(2)\n",
        "test_list": ["assert apply(abs) == 2"],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
    data = tmp_path / "mbpp.jsonl"
    data.write_text(json.dumps(row) + "\n")
    env = grpo_envs.make("code/mbpp-v0", data_files=str(data), workers=1)
    sample = Sample.from_row(env.dataset("test")[0])
    score = env.score(f"```python\n{row['code']}```", sample)
    assert score.outcome is Outcome.SANDBOX_ERROR
    assert scoring_failed(score)
