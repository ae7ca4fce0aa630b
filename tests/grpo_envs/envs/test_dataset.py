"""math/dataset-v0 and code/dataset-v0: environments from a user's table, no code."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.types import Outcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dataset"
QUESTIONS = FIXTURES / "questions.jsonl"
MATH = {"path": str(QUESTIONS), "question": "problem", "answer": "solution", "id": "qid"}


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_single_file_splits_into_disjoint_train_and_test():
    env = grpo_envs.make("math/dataset-v0", **MATH)
    train, test = env.dataset("train"), env.dataset("test")
    assert len(train) + len(test) == 20 and len(test) == 2  # test_fraction 0.1
    assert not set(train["id"]) & set(test["id"])
    row = train[0]
    assert row["env_id"] == "math/dataset-v0"
    assert row["prompt"][-1]["content"].endswith("Put your final answer within \\boxed{}.")


def test_held_out_rows_do_not_depend_on_row_order(tmp_path):
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    reversed_file = _write_jsonl(tmp_path / "rev.jsonl", rows[::-1])
    a = grpo_envs.make("math/dataset-v0", **MATH).dataset("test")["id"]
    b = grpo_envs.make("math/dataset-v0", **{**MATH, "path": str(reversed_file)}).dataset("test")
    assert sorted(a) == sorted(b["id"])


def test_scores_plain_and_gsm8k_style_answers():
    env = grpo_envs.make("math/dataset-v0", **MATH, splits="train")
    rows = {r["id"]: r for r in env.dataset("train")}
    plain, worked = rows["q0"], rows["q4"]  # q4's gold is "a + b = c\n#### c"
    gold = worked["answer"].rsplit("####", 1)[1].strip()
    scores = env.score_batch(
        [
            f"\\boxed{{{plain['answer']}}}",
            f"So the total is {gold}.",
            "\\boxed{1}",
            "I cannot tell.",
        ],
        [plain, worked, plain, plain],
    )
    assert [s.outcome for s in scores] == [
        Outcome.CORRECT,
        Outcome.CORRECT,  # verify="loose": the last number of prose counts
        Outcome.WRONG,
        Outcome.UNPARSABLE,
    ]
    strict = grpo_envs.make("math/dataset-v0", **MATH, splits="train", verify="strict")
    assert not strict.score(f"So the total is {gold}.", worked).correct


def test_template_format_reward_and_system_prompt():
    env = grpo_envs.make(
        "math/dataset-v0",
        **MATH,
        prompt_template="Q{qid}: {problem} Reply as <answer>N</answer>.",
        system_prompt="Think first.",
        format="think_answer",
        format_weight=0.5,
    )
    row = env.dataset("train")[0]
    assert row["prompt"][0] == {"role": "system", "content": "Think first."}
    assert row["prompt"][1]["content"].startswith(f"Q{row['id']}: What is")
    good = f"<think>add</think><answer>{row['answer']}</answer>"
    score = env.score(good, row)
    assert score.correct and score.reward == pytest.approx(1.5)
    grpo_envs.check_env(env, n_samples=2)


def test_csv_parquet_folder_and_pattern_sources(tmp_path):
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    with (tmp_path / "q.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["qid", "problem", "solution"])
        writer.writeheader()
        writer.writerows(rows)
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "q.parquet"))
    for name in ("q.csv", "q.parquet"):
        env = grpo_envs.make("math/dataset-v0", **{**MATH, "path": str(tmp_path / name)})
        assert len(env.dataset("train")) == 18, name
    folder = tmp_path / "folder"
    folder.mkdir()
    _write_jsonl(folder / "train.jsonl", rows[:15])
    _write_jsonl(folder / "validation.jsonl", rows[15:])
    env = grpo_envs.make(
        "math/dataset-v0", **{**MATH, "path": str(folder)}, splits="train,test=validation"
    )
    assert (len(env.dataset("train")), len(env.dataset("test"))) == (15, 5)
    pattern = grpo_envs.make(
        "math/dataset-v0",
        **{**MATH, "path": str(folder / "{split}.jsonl")},
        splits={"train": "train", "test": "validation"},
    )
    assert pattern.dataset("test")["id"] == env.dataset("test")["id"]


def test_clear_errors_name_file_row_and_fix(tmp_path):
    with pytest.raises(ValueError, match=r"no column 'prob' for the question \(columns: problem"):
        grpo_envs.make("math/dataset-v0", **{**MATH, "question": "prob"}).dataset("train")
    rows = [{"problem": "1+1?", "solution": "2"}, {"problem": "2+2?", "solution": ""}]
    path = _write_jsonl(tmp_path / "holes.jsonl", rows)
    env = grpo_envs.make("math/dataset-v0", path=str(path), question="problem", answer="solution")
    with pytest.raises(ValueError, match=r"holes.jsonl, row 2: the answer \(column 'solution'\)"):
        env.dataset("train")
        env.dataset("test")
    empty = _write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(ValueError, match="split 'test' is empty"):
        grpo_envs.make("math/dataset-v0", path=str(empty), splits="test").dataset("test")
    with pytest.raises(FileNotFoundError, match="no such file"):
        grpo_envs.make("math/dataset-v0", path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="verify must be"):
        grpo_envs.make("math/dataset-v0", **MATH, verify="fuzzy")


def test_offline_hub_id_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(ValueError, match="HF_DATASETS_OFFLINE is set"):
        grpo_envs.make("math/dataset-v0", path="some-org/some-dataset")
    assert time.monotonic() - start < 2.0


def test_code_dataset_asserts_and_stdio_cases():
    env = grpo_envs.make(
        "code/dataset-v0",
        path=str(FIXTURES / "code_problems.jsonl"),
        question="task",
        solution="reference",
        id="name",
        splits="test",
        reward="fraction",
        workers=2,
    )
    rows = list(env.dataset("test"))
    add = next(r for r in rows if r["id"] == "p0")
    half = "```python\ndef add(a, b):\n    return 3\n```"
    scores = env.score_batch([f"```python\n{add['answer']}```", half, "no code"], [add] * 3)
    assert [s.outcome for s in scores] == [Outcome.PASSED, Outcome.FAILED, Outcome.UNPARSABLE]
    assert scores[1].reward == pytest.approx(0.5)  # partial credit: 1 of 2 asserts
    io = grpo_envs.make(
        "code/dataset-v0",
        path=str(FIXTURES / "code_io.jsonl"),
        question="task",
        tests=None,
        inputs="stdin",
        outputs="stdout",
        solution="program",
        splits="test",
        workers=2,
    )
    grpo_envs.check_env(io, n_samples=2)
    first = io.dataset("test")[0]
    assert io.score("```python\nprint(3)\n```", first).outcome is Outcome.FAILED


def test_code_row_without_tests_is_named(tmp_path):
    path = _write_jsonl(tmp_path / "c.jsonl", [{"question": "q", "tests": []}])
    env = grpo_envs.make("code/dataset-v0", path=str(path), splits="test")
    with pytest.raises(ValueError, match=r"c.jsonl, row 1: tests must be a non-empty list"):
        env.dataset("test")


def test_code_dataset_reads_a_solution_column_by_default_and_check_env_runs_it(tmp_path):
    good = {"question": "add", "tests": ["assert add(1, 2) == 3"], "solution": _ADD_RIGHT}
    bad = {"question": "add", "tests": ["assert add(1, 2) == 3"], "solution": _ADD_WRONG}
    env = grpo_envs.make(
        "code/dataset-v0", path=str(_write_jsonl(tmp_path / "ok.jsonl", [good])), splits="test"
    )
    assert env.dataset("test")[0]["answer"] == _ADD_RIGHT  # read without solution="solution"
    report = grpo_envs.check_env(env, n_samples=1)
    assert report.references == 1 and "1 reference completions scored as successes" in (
        report.describe()
    )
    wrong = grpo_envs.make(
        "code/dataset-v0", path=str(_write_jsonl(tmp_path / "bad.jsonl", [bad])), splits="test"
    )
    from grpo_envs.checker import EnvCheckError

    with pytest.raises(EnvCheckError, match="reference completion"):
        grpo_envs.check_env(wrong, n_samples=1)
    # solution=None ignores the column; a file without the column has no reference
    ignored = grpo_envs.make(
        "code/dataset-v0",
        path=str(_write_jsonl(tmp_path / "bad2.jsonl", [bad])),
        splits="test",
        solution=None,
    )
    assert ignored.dataset("test")[0]["answer"] == ""
    no_column = {"question": "add", "tests": ["assert add(1, 2) == 3"]}
    plain = grpo_envs.make(
        "code/dataset-v0", path=str(_write_jsonl(tmp_path / "n.jsonl", [no_column])), splits="test"
    )
    assert plain.dataset("test")[0]["answer"] == ""


_ADD_RIGHT = "def add(a, b):\n    return a + b\n"
_ADD_WRONG = "def add(a, b):\n    return a - b\n"


@pytest.mark.parametrize(
    ("kwargs", "missing"),
    [
        ({"path": "nope/questions.jsonl"}, "nope/questions.jsonl"),
        ({"path": "nope/{split}.jsonl", "splits": "test"}, "nope/test.jsonl"),
    ],
)
def test_a_missing_data_file_is_named_with_its_option(tmp_path, monkeypatch, kwargs, missing):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        grpo_envs.make("math/dataset-v0", **kwargs).dataset("test")
    text = str(err.value)
    assert text.startswith("data file missing: ") and missing in text and "path=" in text


def test_a_folder_without_the_split_file_is_named(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"question": "q", "answer": "1"}\n')
    env = grpo_envs.make("math/dataset-v0", path=str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match=r"data file missing: .*data holds no test\.jsonl"):
        env.dataset("test")
