import json
from pathlib import Path
from types import SimpleNamespace

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


def _installed_trl_rewards(funcs, rows, completions, log):
    """The (rows, funcs) reward table of the installed TRL's own ``_calculate_rewards``.

    It runs on a stand-in for the trainer holding only what that method reads (no model).
    """
    pytest.importorskip("trl")
    import torch
    from trl import GRPOTrainer

    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        args=SimpleNamespace(report_to=[]),
        state=SimpleNamespace(global_step=0),
        reward_funcs=funcs,
        reward_processing_classes=[None] * len(funcs),
        reward_func_names=[f.__name__ for f in funcs],
        environments=None,
        _log_completion_extra=lambda column, values: None,
        _log_metric=lambda name, value: log.append((name, value)),
    )
    prompts = [r["prompt"] for r in rows]
    ids = [[1]] * len(rows)
    return GRPOTrainer._calculate_rewards(trainer, rows, prompts, completions, ids).tolist()


def test_trl_calling_convention_matches_installed_trl():
    # _trl_call (used by the tests below, without importing trl) gives what TRL itself computes.
    env = grpo_envs.make("format/think-answer-v0", train_size=4, test_size=2)
    rows = list(env.dataset("train"))[:2]
    completions = [f"<think>x</think><answer>{rows[0]['answer']}</answer>", "<answer>-7</answer>"]

    def funcs():  # fresh ones each time: a batch's scores (and its log) are cached per func
        return trl_reward_funcs(env) + trl_reward_funcs(env, per_component=True)

    trl_log: list = []
    table = _installed_trl_rewards(funcs(), rows, completions, trl_log)
    mimic_log: list = []
    columns = [_trl_call(f, rows, completions, mimic_log) for f in funcs()]
    assert table == [list(row) for row in zip(*columns)]
    assert table == [[2.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    assert trl_log == mimic_log == [("format/think-answer-v0/accuracy", 0.5)] * 2


def test_trl_reward_funcs_text_and_chat_completions():
    env = grpo_envs.make("format/think-answer-v0", train_size=4, test_size=2)
    rows = list(env.dataset("train"))[:2]
    good = f"<think>x</think><answer>{rows[0]['answer']}</answer>"
    bad = "<think>x</think><answer>-7</answer>"
    log = []
    (total,) = trl_reward_funcs(env)
    assert total.__name__ == "format_think_answer_v0"
    assert _trl_call(total, rows, [good, bad], log) == [2.0, 1.0]
    chat = [[{"role": "assistant", "content": good}], [{"role": "assistant", "content": bad}]]
    assert _trl_call(total, rows, chat, log) == [2.0, 1.0]
    assert ("format/think-answer-v0/accuracy", 0.5) in log


def test_per_component_funcs_and_weights_reproduce_reward():
    env = grpo_envs.make("format/think-answer-v0", train_size=4, test_size=2)
    rows = list(env.dataset("train"))[:2]
    completions = [f"hi <think>x</think><answer>{rows[0]['answer']}</answer>", "nothing"]
    funcs = trl_reward_funcs(env, per_component=True)
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
    assert good == {"score": 1.0, "acc": 1.0, "failed": 0.0}
    bad = compute_score("math/countdown-v0", "\\boxed{1+1}", "99", row["extra_info"])
    assert bad["score"] == 0.0 and bad["acc"] == 0.0


def _verl_item_call(row, solution):
    """Call compute_score with exactly the keywords verl's reward loop passes (NaiveRewardManager
    of verl/experimental/reward_loop: data_source, solution_str, ground_truth, extra_info plus
    reward_router_address / reward_model_tokenizer; extra_info gains num_turns and
    rollout_reward_scores), merged with custom_reward_function.reward_kwargs."""
    extra_info = dict(row["extra_info"])
    extra_info["num_turns"] = None
    extra_info["rollout_reward_scores"] = {}
    return compute_score(
        data_source=row["data_source"],
        solution_str=solution,
        ground_truth=row["reward_model"]["ground_truth"],
        extra_info=extra_info,
        reward_router_address="127.0.0.1:8000",
        reward_model_tokenizer=None,
        some_reward_kwarg=3,
    )


def test_verl_carries_env_kwargs_in_rows():
    """The default run's env (task=add2, answer=loose): prose answers count in verl too."""
    env = grpo_envs.make("math/arithmetic-v0", task="add2", answer="loose", train_size=4)
    row = to_verl_rows(env, "train")[0]
    prose = f"Adding them gives {row['reward_model']['ground_truth']}."
    assert env.score(prose, env.dataset("train")[0]).reward == 1.0
    assert _verl_item_call(row, prose) == {"score": 1.0, "acc": 1.0, "failed": 0.0}
    assert json.loads(row["extra_info"]["env_kwargs"])["answer"] == "loose"


def test_verl_batch_form_mixture_has_one_key_set():
    add = grpo_envs.make("math/add2-v0", train_size=2, test_size=2)
    fmt = grpo_envs.make("format/think-answer-v0", train_size=2, test_size=2)
    rows = to_verl_rows(add, "train") + to_verl_rows(fmt, "train")
    assert {frozenset(r["extra_info"]) for r in rows} == {frozenset(rows[0]["extra_info"])}
    golds = [r["reward_model"]["ground_truth"] for r in rows]
    solutions = [
        f"\\boxed{{{golds[0]}}}",
        "no",
        f"<think>a</think><answer>{golds[2]}</answer>",
        "x",
    ]
    # BatchRewardManager passes numpy object arrays for data_sources and extra_infos.
    import numpy as np

    results = compute_score(
        data_sources=np.array([r["data_source"] for r in rows], dtype=object),
        solution_strs=solutions,
        ground_truths=golds,
        extra_infos=np.array([dict(r["extra_info"]) for r in rows], dtype=object),
        overlong_buffer_cfg=None,  # a reward_kwargs entry
    )
    assert [r["score"] for r in results] == [1.0, 0.0, 2.0, 0.0]
    assert {tuple(r) for r in results} == {("score", "acc", "failed")}


def test_verl_keyword_call_and_unknown_source():
    from grpo_envs.registration import RegistryError

    result = compute_score(
        data_source="math/add2-v0", solution_str="\\boxed{5}", ground_truth="5", extra_info=None
    )
    assert result["score"] == 1.0
    with pytest.raises(RegistryError, match="math/add2-v0"):
        compute_score("math/add3-v0", "\\boxed{5}", "5")
    (failed,) = compute_score(
        data_sources=["math/add3-v0"], solution_strs=["1"], ground_truths=["1"]
    )
    assert failed == {"score": 0.0, "acc": 0.0, "failed": 1.0}


CUSTOM_MODULE = """
from grpo_envs import register
from grpo_envs.base import SingleTurnEnv
from grpo_envs.envs._common import integer_correctness
from grpo_envs.rubric import RewardComponent, Rubric


def triple(size=3, bonus=0.0):
    rows = [{"question": f"3 * {n}?", "answer": str(3 * n)} for n in range(size)]
    return SingleTurnEnv(
        {"train": rows, "test": rows},
        Rubric([RewardComponent("correct", 1.0 + bonus, integer_correctness)]),
    )


register("custom/triple-v0", triple)
"""


def test_verl_worker_imports_the_custom_module(tmp_path, monkeypatch):
    """In verl's reward worker nothing imported the user's module: the row's id imports it."""
    import subprocess
    import sys

    (tmp_path / "my_triple_envs.py").write_text(CUSTOM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = grpo_envs.make("my_triple_envs:custom/triple-v0", bonus=1.0)
    row = to_verl_rows(env, "train")[2]
    assert row["data_source"] == "my_triple_envs:custom/triple-v0"
    code = (
        "import json, sys\n"
        "from grpo_envs.adapters import compute_score\n"
        "row = json.loads(sys.argv[1])\n"
        "print(json.dumps(compute_score(data_source=row['data_source'],"
        " solution_str='\\\\boxed{6}',"
        " ground_truth=row['reward_model']['ground_truth'], extra_info=row['extra_info'],"
        " reward_router_address=None)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(row)],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{Path.cwd()}"},
        check=True,
        timeout=120,
    )
    # bonus=1.0 travelled in extra_info: the weight of "correct" is 2.
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "score": 2.0,
        "acc": 1.0,
        "failed": 0.0,
    }
