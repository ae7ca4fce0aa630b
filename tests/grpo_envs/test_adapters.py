import importlib.util
import json
from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.adapters import compute_score, to_verl_rows, trl_reward_funcs


def _trl_call(func, rows, completions, log):
    """Call a reward function exactly as TRL 1.16's GRPOTrainer._calculate_rewards does."""
    keys = [k for k in rows[0] if k not in ("prompt", "completion", "completion_ids")]
    reward_kwargs = {k: [r[k] for r in rows] for k in keys}
    reward_kwargs["trainer_state"] = object()
    reward_kwargs["log_extra"] = lambda column, values: None
    reward_kwargs["log_metric"] = lambda name, value: log.append((name, value))
    prompts = [r["prompt"] for r in rows]
    return func(
        prompts=prompts, completions=completions, completion_ids=[[1]] * len(rows), **reward_kwargs
    )


def test_trl_calling_convention_matches_installed_trl():
    # Read the installed source rather than importing it (importing trl pulls torch: ~8 s).
    spec = importlib.util.find_spec("trl")
    if spec is None or spec.origin is None:
        pytest.skip("trl not installed")
    source = (Path(spec.origin).parent / "trainer" / "grpo_trainer.py").read_text()
    # The convention _trl_call mimics: columns as kwargs, these three passed by name.
    assert "prompts=prompts, completions=completions, completion_ids=completion_ids_list" in source
    assert 'key not in ["prompt", "completion", "completion_ids"]' in source


def test_trl_reward_funcs_text_and_chat_completions():
    env = grpo_envs.make("format/think-answer-v0", train_size=4, test_size=2)
    rows = list(env.dataset("train"))[:2]
    good = f"<think>x</think><answer>{rows[0]['answer']}</answer>"
    bad = "<think>x</think><answer>-7</answer>"
    log = []
    (total,) = env.trl_reward_funcs()
    assert total.__name__ == "format_think_answer_v0"
    assert _trl_call(total, rows, [good, bad], log) == [2.0, 1.0]
    chat = [[{"role": "assistant", "content": good}], [{"role": "assistant", "content": bad}]]
    assert _trl_call(total, rows, chat, log) == [2.0, 1.0]
    assert ("format/think-answer-v0/accuracy", 0.5) in log


def test_per_component_funcs_and_weights_reproduce_reward():
    env = grpo_envs.make("format/think-answer-v0", train_size=4, test_size=2)
    rows = list(env.dataset("train"))[:2]
    completions = [f"hi <think>x</think><answer>{rows[0]['answer']}</answer>", "nothing"]
    funcs = env.trl_reward_funcs(per_component=True)
    names = [f.__name__ for f in funcs]
    assert names == [
        "format_think_answer_v0_correct",
        "format_think_answer_v0_format_strict",
        "format_think_answer_v0_format_soft",
    ]
    values = [_trl_call(f, rows, completions, []) for f in funcs]
    assert values == [[1.0, 0.0], [0.0, 0.0], [1.0, 0.0]]
    weighted = [sum(f.weight * v[i] for f, v in zip(funcs, values)) for i in range(2)]
    assert weighted == [s.reward for s in env.score_batch(completions, rows)]


def test_trl_missing_answer_column_is_explained():
    (total,) = trl_reward_funcs(grpo_envs.make("math/add2-v0", train_size=2, test_size=2))
    with pytest.raises(ValueError, match="'answer'"):
        total(completions=["1"], prompts=["q"])


def test_verl_compute_score():
    env = grpo_envs.make("math/countdown-v0", train_size=4, test_size=2)
    rows = to_verl_rows(env, "test")
    row = rows[0]
    assert row["data_source"] == "math/countdown-v0"
    assert row["reward_model"]["ground_truth"] == env.dataset("test")[0]["answer"]
    solution = json.loads(row["extra_info"]["metadata"])["solution"]
    good = compute_score(
        "math/countdown-v0",
        f"\\boxed{{{solution}}}",
        row["reward_model"]["ground_truth"],
        row["extra_info"],
    )
    assert good == {"score": 1.0, "acc": 1.0, "correct": 1.0}
    bad = env.verl_compute_score("math/countdown-v0", "\\boxed{1+1}", "99", row["extra_info"])
    assert bad["score"] == 0.0 and bad["acc"] == 0.0


def test_verl_keyword_call_and_unknown_source():
    from grpo_envs.registration import RegistryError

    result = compute_score(
        data_source="math/add2-v0", solution_str="\\boxed{5}", ground_truth="5", extra_info=None
    )
    assert result["score"] == 1.0
    with pytest.raises(RegistryError, match="math/add2-v0"):
        compute_score("math/add3-v0", "\\boxed{5}", "5")
