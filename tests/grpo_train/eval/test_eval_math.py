"""Strict vs flexible answer extraction on fixture GSM8K completions, through the real env."""

import json
from pathlib import Path

import pytest

import grpo_envs
from grpo_train.eval.runner import EvalTask, evaluate, math_extraction_checks
from grpo_train.rollout.base import Completion

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eval"
CASES = [
    json.loads(line) for line in (FIXTURES / "gsm8k_completions.jsonl").read_text().splitlines()
]


class CharTokenizer:
    chat_template = "plain"

    def apply_chat_template(self, conversation, tokenize=False, add_generation_prompt=True):
        return "".join(m["content"] for m in conversation)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(ch) for ch in text]}


class FixtureEngine:
    """Returns the fixture completion whose question the prompt contains."""

    name = "fixture"
    last_sync_seconds = 0.0

    def generate(self, prompt_token_ids, sampling):
        out = []
        for i, ids in enumerate(prompt_token_ids):
            text = "".join(chr(t) for t in ids)
            (case,) = [c for c in CASES if c["question"] in text]
            toks = tuple(range(len(case["completion"].split())))
            out.append([Completion(i, case["completion"], toks, (0.0,) * len(toks), "stop")])
        return out

    def close(self):
        pass


def test_strict_vs_flexible_on_fixture_completions(tmp_path):
    env = grpo_envs.make("math/gsm8k-v0", data_path=str(FIXTURES / "gsm8k"))
    summary = evaluate(
        FixtureEngine(), CharTokenizer(), [EvalTask("gsm8k", env)], out_dir=tmp_path, progress=False
    )
    r = summary["gsm8k"]
    strict = sum(c["strict_correct"] for c in CASES) / len(CASES)
    flexible = sum(c["flexible_correct"] for c in CASES) / len(CASES)
    assert r.num_prompts == len(CASES) == 8
    assert r.strict_accuracy == pytest.approx(strict) == 3 / 8
    assert r.flexible_accuracy == pytest.approx(flexible) == 6 / 8
    # The env scores with flexible extraction, so its accuracy agrees with the flexible column
    # here; a harness with strict matching would report half of it.
    assert r.accuracy == pytest.approx(flexible)
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    by_completion = {rec["completion"]: rec for rec in records}
    for case in CASES:
        rec = by_completion[case["completion"]]
        assert rec["strict_correct"] is case["strict_correct"], case
        assert rec["flexible_correct"] is case["flexible_correct"], case
    assert by_completion["Adding them gives **42**"]["extracted"] == "42"
    assert by_completion["I am not sure how to count them."]["outcome"] == "unparsable"
    assert "| 37.5 | 75.0 |" in summary.table()  # the strict and flexible columns


def test_math_extraction_checks_direct():
    checks = math_extraction_checks(["12", "5"], ["So the answer is 12.", "\\boxed{6}"])
    assert checks == [(False, True, "12"), (False, False, "6")]


def test_non_math_envs_get_no_strict_flexible_columns():
    from grpo_train.eval.runner import wants_math_checks

    assert wants_math_checks("math/gsm8k-v0") and wants_math_checks("math/math500-v0")
    assert not wants_math_checks("code/humaneval-v0")
    assert not wants_math_checks("math/countdown-v0")
