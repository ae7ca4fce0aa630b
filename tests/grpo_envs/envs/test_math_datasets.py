from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.envs.math_datasets import gsm8k_gold
from grpo_envs.types import Outcome

GSM8K_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "gsm8k"  # first 30 rows a split
MATH500_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "math500"


def test_gsm8k_gold():
    assert gsm8k_gold("She has 3+4=<<3+4=7>>7\n#### 1,007") == "1007"
    with pytest.raises(ValueError, match=r"\#\#\#\#"):
        gsm8k_gold("no marker")


def test_gsm8k_from_local_files(monkeypatch):
    env = grpo_envs.make("math/gsm8k-v0", data_path=str(GSM8K_DIR))
    test = env.dataset("test")
    assert (len(env.dataset("train")), len(test)) == (30, 30)
    row = test[0]
    assert row["id"] == "test-0" and row["answer"] == "18"  # Janet's ducks: (16 - 3 - 4) * 2
    assert "Janet" in row["prompt"][0]["content"] and "\\boxed{}" in row["prompt"][0]["content"]
    assert env.score("She makes 9 * 2 = \\boxed{18} dollars.", row).correct
    assert env.score("\\boxed{19}", row).outcome is Outcome.WRONG
    # the env var works like data_path; limit trims
    monkeypatch.setenv("GRPO_GSM8K_DIR", str(GSM8K_DIR))
    assert len(grpo_envs.make("math/gsm8k-v0", limit=5).dataset("test")) == 5


def test_missing_local_folder_is_a_clear_error(tmp_path):
    env = grpo_envs.make("math/gsm8k-v0", data_path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"test\.jsonl"):
        env.dataset("test")


def test_math500_fixture_and_batch_scoring():
    env = grpo_envs.make("math/math500-v0", data_path=str(MATH500_DIR))
    assert env.splits == ("test",)
    ds = env.dataset("test")
    assert len(ds) == 5 and ds[1]["id"] == "test/prealgebra/2.json"
    completions = [
        "So $\\binom84 = \\boxed{70}$.",
        "The fraction is \\boxed{0.5}.",  # decimal vs fraction
        "\\boxed{\\sqrt{8}}",  # equal radical, different form
        "x = \\boxed{4}",
        "no final answer here",
    ]
    scores = env.score_batch(completions, list(ds))
    assert [s.outcome for s in scores] == [
        Outcome.CORRECT,
        Outcome.CORRECT,
        Outcome.CORRECT,
        Outcome.WRONG,
        Outcome.UNPARSABLE,
    ]
    assert [env.score(c, r).outcome for c, r in zip(completions, ds)] == [s.outcome for s in scores]


def test_format_option_adds_component():
    env = grpo_envs.make(
        "math/math500-v0", data_path=str(MATH500_DIR), format="think_answer", format_weight=0.5
    )
    row = env.dataset("test")[0]
    assert "<answer>" in row["prompt"][0]["content"]
    score = env.score("<think>8 choose 4</think><answer>70</answer>", row)
    assert score.reward == 1.5 and score.component("format_strict").value == 1.0


def test_hub_fallback_asks_for_the_right_dataset_and_explains_offline(monkeypatch):
    import datasets

    calls = []

    def offline(path, name=None, split=None):
        calls.append((path, name, split))
        raise ConnectionError("offline")

    monkeypatch.delenv("GRPO_GSM8K_DIR", raising=False)
    monkeypatch.delenv("GRPO_MATH500_DIR", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="GRPO_GSM8K_DIR"):
        grpo_envs.make("math/gsm8k-v0").dataset("train")
    with pytest.raises(RuntimeError, match="GRPO_MATH500_DIR"):
        grpo_envs.make("math/math500-v0").dataset("test")
    assert calls == [("openai/gsm8k", "main", "train"), ("HuggingFaceH4/MATH-500", None, "test")]
