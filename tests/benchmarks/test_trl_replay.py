"""TRL's recorded batches through our trainer: the replay engine, and a whole replay."""

from __future__ import annotations

import doctest
import json
from dataclasses import asdict

import pytest
from bench_scripts import load

lc = load("learning_curve")
tr = load("trl_replay")


def test_docstring_examples():
    assert doctest.testmod(tr).failed == 0


class Codec:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i == 2))


def test_the_replay_engine_returns_each_recorded_step_once_grouped_by_prompt():
    from grpo_train.rollout.base import SamplingConfig

    steps = [
        tr.RecordedStep(["a", "a", "b", "b"], [[5, 2], [6, 7], [8, 2], [9]], [1.0, 0, 0, 0]),
        tr.RecordedStep(["c", "c", "d", "d"], [[1, 2], [3, 2], [4], [2]], [0, 0, 1.0, 0]),
    ]
    engine = tr.ReplayEngine(steps, Codec(), {2})
    first = engine.generate([[10], [11]], SamplingConfig(n=2, max_new_tokens=2))
    assert [[c.token_ids for c in g] for g in first] == [[(5, 2), (6, 7)], [(8, 2), (9,)]]
    assert [[c.prompt_index for c in g] for g in first] == [[0, 0], [1, 1]]
    assert [c.finish_reason for c in first[0]] == ["stop", "length"]
    assert first[0][0].text == "5" and len(first[0][0].logprobs) == 2
    second = engine.generate([[10], [11]], SamplingConfig(n=2, max_new_tokens=2))
    assert second[1][0].token_ids == (4,) and second[1][1].finish_reason == "stop"
    with pytest.raises(RuntimeError, match="asked for step 3, recorded 2"):
        engine.generate([[10], [11]], SamplingConfig(n=2, max_new_tokens=2))


def test_a_step_of_another_size_is_refused():
    from grpo_train.rollout.base import SamplingConfig

    engine = tr.ReplayEngine([tr.RecordedStep(["a"] * 2, [[1], [2]], [0.0, 1.0])], Codec(), {2})
    with pytest.raises(RuntimeError, match="asked for 2 x 2 completions, recorded 2"):
        engine.generate([[10], [11]], SamplingConfig(n=2, max_new_tokens=2))


def test_a_race_without_recorded_batches_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no recorded batches"):
        tr.read_batches(tmp_path / "batches.jsonl")


@pytest.mark.slow
def test_ours_trains_on_exactly_the_recorded_batches(tmp_path):
    """A fake race on a tiny model: the recorded completions (right and wrong answers to the
    seed's prompts) reach our trainer, which scores them as the recording did and saves a policy
    per evaluation step that the race's evaluation scores."""
    from transformers import AutoTokenizer

    from grpo_train.models.loading import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    task = lc.Task("math/arithmetic-v0", {"task": "add2", "answer": "loose"})
    args = {
        "model": model, "env": task.env_id, "env_kwargs": json.dumps(task.kwargs),
        "eval_every": 1, "eval_size": 4, "prompts": 2, "group": 4, "completion_length": 8,
        "temperature": 1.0, "seed": 0, "threads": 1,
    }  # fmt: skip
    shared = lc.shared_settings(__import__("argparse").Namespace(**args))
    seed, steps = 3, 2
    rows = task.make().dataset("train")
    order = lc.prompt_order(len(rows), seed, steps * shared.prompts)
    race = tmp_path / "race"
    spec = lc.RunSpec(f"trl@2e-05#s{seed}", "trl", steps, 2e-5, seed=seed)
    (race / spec.name).mkdir(parents=True)
    recorded = []
    with (race / spec.name / "batches.jsonl").open("w") as f:
        for step in range(steps):
            ids, completions, rewards = [], [], []
            for row in order[step * shared.prompts : (step + 1) * shared.prompts]:
                sample = rows[row]
                for k in range(shared.group):  # the first of each group right, the others wrong
                    answer = sample["answer"] if k == 0 else str(int(sample["answer"]) + 1 + k)
                    tokens = tokenizer(f"= {answer}")["input_ids"] + [tokenizer.eos_token_id]
                    ids.append(str(sample["id"]))
                    completions.append(tokens)
                    rewards.append(1.0 if k == 0 else 0.0)
            recorded.append(rewards)
            f.write(json.dumps({"ids": ids, "completion_ids": completions, "rewards": rewards}))
            f.write("\n")
    trl_run = lc.RunResult(
        spec,
        [lc.Point(s, 0.0, "", 0.5) for s in (1, 2)],
        train_accuracy=[sum(r) / len(r) for r in recorded],
    )
    (race / "learning_curve.json").write_text(
        json.dumps({"base_accuracy": 0.0, "args": args, "results": [asdict(trl_run)]})
    )
    out = tmp_path / "replay" / "new"  # --out: a folder made if missing
    assert tr.main(["--race", str(race), "--seeds", str(seed), "--out", str(out)]) == 0
    (replayed,) = json.loads((out / "trl_replay.json").read_text())
    assert replayed["rewards_agree"] is True  # every right answer scored right, and no other
    assert replayed["steps"] == [1, 2] and replayed["trl"] == [0.5, 0.5]
    assert all(0.0 <= a <= 1.0 for a in replayed["ours"])
