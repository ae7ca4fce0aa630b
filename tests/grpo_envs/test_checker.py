"""check_env on every registered environment, and on broken ones it must reject."""

from pathlib import Path

import pytest

import grpo_envs
from grpo_envs.base import SingleTurnEnv
from grpo_envs.checker import EnvCheckError, check_env
from grpo_envs.rubric import RewardComponent, Rubric, StripParser
from grpo_envs.types import Message, Outcome, Sample, Score

GSM8K_DIR = Path(__file__).resolve().parent / "fixtures" / "gsm8k"
MATH500_DIR = Path(__file__).resolve().parent / "fixtures" / "math500"
CODE_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "code"
DATASET_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "dataset"
BENCH = Path(__file__).resolve().parent / "fixtures" / "benchmarks"
SMALL = {"train_size": 40, "test_size": 10}

#: make() overrides that keep the contract test fast (the contract itself is unchanged).
OVERRIDES: dict[str, dict[str, object]] = {
    "math/gsm8k-v0": {"data_path": str(GSM8K_DIR), "limit": 50},
    "math/math500-v0": {"data_path": str(MATH500_DIR)},
    "math/arithmetic-v0": SMALL,
    "math/add2-v0": SMALL,
    "math/countdown-v0": SMALL,
    "format/think-answer-v0": SMALL,
    "rg/reasoning-gym-v0": SMALL,
    # Offline fixtures of the code environments (kept with their own tests).
    "code/humaneval-v0": {"workers": 2},
    "code/mbpp-v0": {"data_files": str(CODE_FIXTURES / "mbpp_full.jsonl"), "workers": 2},
    "code/stdio-v0": {"data_files": str(CODE_FIXTURES / "stdio.jsonl"), "workers": 2},
    # Benchmark suites: a few rows each in the hub schema (fixtures/benchmarks/README.md).
    "math/aime24-v0": {"data_path": str(BENCH / "aime24")},
    "math/aime25-v0": {"data_path": str(BENCH / "aime25")},
    "math/amc23-v0": {"data_path": str(BENCH / "amc23")},
    "science/gpqa-diamond-v0": {"data_path": str(BENCH / "gpqa_diamond")},
    "code/livecodebench-v0": {
        "data_path": str(BENCH / "livecodebench"),
        "version_tag": "release_v2",
        "workers": 2,
    },
    "code/humaneval-plus-v0": {"data_path": str(BENCH / "humaneval_plus"), "workers": 2},
    "code/mbpp-plus-v0": {"data_path": str(BENCH / "mbpp_plus"), "workers": 2},
    "math/dataset-v0": {
        "path": str(DATASET_FIXTURES / "questions.jsonl"),
        "question": "problem",
        "answer": "solution",
        "id": "qid",
    },
    "code/dataset-v0": {
        "path": str(DATASET_FIXTURES / "code_problems.jsonl"),
        "question": "task",
        "solution": "reference",
        "id": "name",
        "test_fraction": 0.34,
        "workers": 2,
    },
}
BUILTIN = [s.id for s in grpo_envs.list_envs() if not s.id.startswith("rg/") or s.id in OVERRIDES]


@pytest.mark.parametrize("env_id", BUILTIN)
def test_registered_env_passes_check_env(env_id):
    # Every override's data ships with the tests; a built-in env that fails to import fails here.
    env = grpo_envs.make(env_id, **OVERRIDES.get(env_id, {}))
    try:
        check_env(env, n_samples=2)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


class Toy(SingleTurnEnv):
    splits = ("train",)

    def __init__(self, mode: str = "ok"):
        super().__init__()
        self.mode = mode
        self.rubric = Rubric([RewardComponent("c", 1.0, self.judge)], parser=StripParser())
        self.calls = 0

    def judge(self, ctx):
        self.calls += 1
        if self.mode == "raises_on_junk" and len(ctx.completion) > 1000:
            raise MemoryError("junk")
        if self.mode == "nondeterministic_score":
            return float(self.calls % 2)
        return float(ctx.parsed == ctx.sample.answer)

    def load_split(self, split):
        ids = ["a", "a"] if self.mode == "duplicate_ids" else ["a", "b"]
        prompt = () if self.mode == "empty_prompt" else (Message("user", "q"),)
        for i, sid in enumerate(ids):
            yield Sample(sid, prompt, str(i))

    def reference_completion(self, sample):
        return "wrong" if self.mode == "bad_reference" else sample.answer


class Raising(Toy):
    def score(self, completion, sample):
        if completion is None:
            raise TypeError("None")
        return super().score(completion, sample)


class InfiniteReward(Toy):
    def score(self, completion, sample):
        return (
            Score(float("inf"), Outcome.CORRECT)
            if completion == "0"
            else super().score(completion, sample)
        )


def test_check_env_accepts_a_good_env():
    check_env(Toy())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (Toy("duplicate_ids"), "duplicate ids"),
        (Toy("empty_prompt"), "prompt must be a non-empty list"),
        (Toy("bad_reference"), "reference completion"),
        (Raising(), "score raised TypeError"),
        (InfiniteReward(), "not a finite number"),
    ],
)
def test_check_env_rejects_broken_envs(env, message):
    with pytest.raises(EnvCheckError, match=message):
        check_env(env)


def test_check_env_detects_nondeterminism_between_builds(monkeypatch):
    from grpo_envs import registration as reg

    monkeypatch.setattr(reg, "registry", dict(reg.registry))
    counter = iter(range(1000))

    class Shifting(Toy):
        def __init__(self):
            super().__init__()
            self.offset = next(counter)

        def load_split(self, split):
            yield Sample(f"id-{self.offset}", (Message("user", "q"),), "0")

    reg.register("test/shifting-v0", Shifting)
    with pytest.raises(EnvCheckError, match="differs between two builds"):
        check_env(grpo_envs.make("test/shifting-v0"))
