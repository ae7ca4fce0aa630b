"""Benchmark suites on fixtures in the hub schemas: loading, offline errors, grading, sandbox."""

from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.envs.code_benchmarks import decode_test_cases, lcb_files
from grpo_envs.envs.gpqa import extract_choice
from grpo_envs.types import Outcome, Sample

BENCH = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"


def _samples(env, split="test"):
    return [Sample.from_row(r) for r in env.dataset(split)]


def test_aime_and_amc_load_from_folder_file_and_env_var(monkeypatch):
    aime = grpo_envs.make("math/aime24-v0", data_path=str(BENCH / "aime24"))
    samples = _samples(aime)
    assert [s.id for s in samples] == ["aime24/60", "aime24/61", "aime24/62"]
    assert samples[0].answer == "067" and "\\boxed{}" in samples[0].prompt[-1].content
    # the hub's split name works too (same 30 problems on the hub: one set)
    assert [s.id for s in _samples(aime, "train")] == [s.id for s in samples]
    # "067" and 67 are one answer
    assert aime.score("so \\boxed{67}", samples[0]).outcome is Outcome.CORRECT
    assert aime.score("so \\boxed{68}", samples[0]).outcome is Outcome.WRONG
    amc = grpo_envs.make("math/amc23-v0", data_path=str(BENCH / "amc23" / "test.jsonl"))
    assert [s.answer for s in _samples(amc)] == ["1.25", "81"]  # numbers stored as floats
    monkeypatch.setenv("GRPO_AIME25_DIR", str(BENCH / "aime25"))
    aime25 = grpo_envs.make("math/aime25-v0")
    assert [s.answer for s in _samples(aime25)] == ["27", "16"]
    assert aime25.data_source("test").startswith("file ")


def test_offline_error_names_the_dataset_the_command_and_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("GRPO_AIME24_DIR", raising=False)
    env = grpo_envs.make("math/aime24-v0")
    with pytest.raises(RuntimeError) as err:
        env.dataset("test")
    message = str(err.value)
    for needed in ("HuggingFaceH4/aime_2024", "$GRPO_AIME24_DIR", "--data_dir aime24=", "to_json"):
        assert needed in message


def test_missing_local_copy_is_a_clear_error(tmp_path):
    env = grpo_envs.make("math/aime24-v0", data_path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"test\.jsonl"):
        env.dataset("test")


def test_gpqa_shuffle_is_seeded_per_question_and_the_letter_graded():
    env = grpo_envs.make("science/gpqa-diamond-v0", data_path=str(BENCH / "gpqa_diamond"))
    samples = _samples(env)
    assert [s.id for s in samples] == [f"gpqa_diamond/recFixture0{i}" for i in (1, 2, 3)]
    for sample, correct in zip(samples, ["the photon", "-1", "the chloroplast"]):
        text = sample.prompt[-1].content
        assert f"{sample.answer}) {correct}\n" in text + "\n"  # the gold letter holds the answer
    again = [
        s.answer
        for s in _samples(
            grpo_envs.make("science/gpqa-diamond-v0", data_path=str(BENCH / "gpqa_diamond"))
        )
    ]
    assert again == [s.answer for s in samples]  # fixed seed: same letters every run
    letters = {
        tuple(s.answer for s in _samples(grpo_envs.make(
            "science/gpqa-diamond-v0", data_path=str(BENCH / "gpqa_diamond"), seed=seed)))
        for seed in range(6)
    }  # fmt: skip
    assert len(letters) > 1  # the seed moves the correct option
    gold = samples[0]
    wrong = "ABCD".replace(gold.answer, "")[0]
    assert env.score(f"Reasoning...\nAnswer: {gold.answer}", gold).outcome is Outcome.CORRECT
    assert env.score(f"Answer: {wrong}", gold).outcome is Outcome.WRONG
    assert env.score("no idea", gold).outcome is Outcome.UNPARSABLE


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("Answer: C", "C"),
        ("**Answer:** (b)", "B"),
        ("I first thought Answer: A.\nFinal Answer: D", "D"),
        ("\\boxed{\\text{B}}", "B"),
        ("The answer is Alpha", None),
        ("", None),
    ],
)
def test_extract_choice(text, letter):
    assert extract_choice(text) == letter


def test_livecodebench_version_tags_and_date_window():
    assert lcb_files("release_v6")[-1] == "test6.jsonl" and len(lcb_files("release_v6")) == 6
    with pytest.raises(ValueError, match="version_tag"):
        lcb_files("release_v9")
    folder = str(BENCH / "livecodebench")
    v1 = grpo_envs.make("code/livecodebench-v0", data_path=folder, version_tag="release_v1")
    assert [r["id"] for r in v1.dataset("test")] == ["fx_abc_a", "fx_lc_1"]
    v2 = grpo_envs.make("code/livecodebench-v0", data_path=folder, version_tag="v2")
    assert [r["id"] for r in v2.dataset("test")] == ["fx_lc_2"]
    window = grpo_envs.make(
        "code/livecodebench-v0", data_path=folder, version_tag="release_v2",
        start_date="2023-07-01", end_date="2024-01-31",
    )  # fmt: skip
    assert [r["id"] for r in window.dataset("test")] == ["fx_lc_1"]
    assert "window=[2023-07-01, 2024-01-31]" in window.data_source("test")
    with pytest.raises(FileNotFoundError, match=r"test3\.jsonl"):
        grpo_envs.make("code/livecodebench-v0", data_path=folder, version_tag="release_v3").dataset(
            "test"
        )
    # private tests: base64(zlib(pickle(JSON))) decoded, and a pickle of a class refused
    import base64
    import pickle
    import zlib

    evil = base64.b64encode(zlib.compress(pickle.dumps(Path("x")))).decode()
    with pytest.raises(ValueError, match="neither JSON"):
        decode_test_cases(evil, "row")


def _fence(code):
    return f"```python\n{code}\n```"


def test_livecodebench_stdin_and_functional_tests_run_in_the_sandbox():
    env = grpo_envs.make(
        "code/livecodebench-v0", data_path=str(BENCH / "livecodebench"), version_tag="release_v2",
        workers=2, default_test_timeout_s=2.0,
    )  # fmt: skip
    by_id = {s.id: s for s in _samples(env)}
    stdin, fn, fn2 = by_id["fx_abc_a"], by_id["fx_lc_1"], by_id["fx_lc_2"]
    assert len(stdin.metadata["tests"]) == 3  # public + private
    assert "class Solution" in fn.prompt[-1].content
    good = [
        _fence("a, b = map(int, input().split())\nprint(a + b)"),
        _fence("class Solution:\n    def maxPairSum(self, nums: List[int]) -> int:\n"
               "        s = sorted(nums)\n        return s[-1] + s[-2]"),
        _fence("class Solution:\n    def splitHalves(self, s: str) -> List[str]:\n"
               "        h = len(s) // 2\n        return (s[:h], s[h:])"),  # a tuple: a list
    ]  # fmt: skip
    bad = [
        _fence("print(3)"),  # passes the public test only
        _fence("class Solution:\n    def maxPairSum(self, nums):\n        return max(nums) * 2"),
        _fence("class Solution:\n    def splitHalves(self, s):\n        while True:\n"
               "            pass"),
    ]  # fmt: skip
    scores = env.score_batch(good + bad, [stdin, fn, fn2] * 2)
    assert [s.outcome for s in scores[:3]] == [Outcome.PASSED] * 3
    assert [s.reward for s in scores[3:]] == [0.0, 0.0, 0.0]
    assert scores[3].outcome is Outcome.FAILED and scores[4].outcome is Outcome.FAILED
    # an infinite loop is the candidate's timeout, not a scoring error
    assert scores[5].outcome is Outcome.TIMEOUT


def test_evalplus_extra_tests_fail_what_the_base_tests_let_through():
    he = grpo_envs.make("code/humaneval-plus-v0", data_path=str(BENCH / "humaneval_plus"),
                        workers=2)  # fmt: skip
    add, mean = _samples(he)
    assert add.id == "HumanEval/0" and "def add" in add.prompt[-1].content
    scores = he.score_batch(
        [
            _fence("def add(a, b):\n    return a + b"),
            _fence("def add(a, b):\n    return 5 if (a, b) == (2, 3) else a - b"),  # base only
            _fence("def mean(xs):\n    return sum(xs) / len(xs)"),
        ],
        [add, add, mean],
    )
    assert scores[0].outcome is Outcome.PASSED
    assert scores[1].outcome is Outcome.FAILED
    assert scores[2].outcome is Outcome.PASSED
    mb = grpo_envs.make("code/mbpp-plus-v0", data_path=str(BENCH / "mbpp_plus"), workers=2)
    common, prime = _samples(mb)
    assert common.id == "mbpp_plus/2" and len(common.metadata["tests"]) == 2  # base + plus script
    scores = mb.score_batch(
        [
            _fence(common.answer),
            # passes the base assert, fails the extra inputs (duplicates, empty result)
            _fence("def common_items(a, b):\n    return (4, 5)"),
            _fence(prime.answer),
            _fence("def is_not_prime(n):\n    return n % 2 == 0 or n == 1"),  # 91 = 7 x 13
        ],
        [common, common, prime, prime],
    )
    assert [s.outcome for s in scores] == [
        Outcome.PASSED, Outcome.FAILED, Outcome.PASSED, Outcome.FAILED,
    ]  # fmt: skip
    assert scores[0].details["test_timeout_s"] >= 4.0  # EvalPlus floor
